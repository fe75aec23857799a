//! Dropping the runtime closes what a server holds: its tasks (accept loop, connections) and
//! their `Rc<State>` form a cycle with the tasks' wakers the state keeps, which only the
//! runtime's drop (dropping every task's future) breaks. Counted in `/proc/self/fd`, so this
//! file is its own test binary, and its one test the only thing opening fds in it (another test
//! here would have to run serialized with it).

use std::io::Read;
use std::time::Duration;

use http::StatusCode;
use nodus::Runtime;
use nodus::net::TcpListener;
use nodus_http::{Config, serve, text};
use nodus_testkit::fds::open_fds;

#[test]
fn dropping_the_runtime_closes_the_listener_the_connections_and_the_loop() {
    let before = open_fds();
    let rt = Runtime::new();
    let server = rt.block_on(async {
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        serve(listener, Config::default(), |_req| async {
            text(StatusCode::OK, "hello")
        })
    });
    let addr = server.local_addr().unwrap();
    let mut client = std::net::TcpStream::connect(addr).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    rt.block_on(async {
        while server.connections() == 0 {
            nodus::sleep(1).await;
        }
    });
    // The epoll fd, the eventfd, the listener, the accepted socket and the client.
    assert!(open_fds() >= before + 5);
    drop(rt);
    drop(server);
    assert_eq!(
        open_fds(),
        before + 1,
        "every fd the server and its loop held is closed (the client's is left)"
    );
    assert_eq!(
        client.read(&mut [0; 16]).unwrap(),
        0,
        "the server closed the connection"
    );
    assert_eq!(
        std::net::TcpStream::connect(addr).unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused
    );
}
