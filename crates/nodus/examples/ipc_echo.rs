//! `ipc_echo`: a nodus program meant to be forked by Node over its IPC channel.
//!
//! ```text
//! cargo build --release -p nodus --example ipc_echo
//! node -e "const c = require('child_process').fork('x', [], { execPath: 'target/release/examples/ipc_echo' });
//!          c.on('message', m => { console.log(m); c.send('exit'); }); c.send({ hi: 1 });"
//! ```
//!
//! It ignores its arguments and replies `{"echo": <message>}` to every message (one that carried
//! a handle too). A listening socket that arrives as a handle is also served: each connection gets
//! `hello from nodus <pid>\n` and is closed; a failed accept (out of fds: `EMFILE`) is said once
//! on stderr and tried again 100 ms later, as libuv keeps listening. The message `"exit"` is not
//! echoed: the program disconnects and exits 0. On channel EOF it exits 0; a malformed frame is
//! dropped with one line on stderr, and the channel goes on. Without a channel, or with a parent
//! using `serialization: 'advanced'`, it says why on stderr and exits 2.

use std::process::ExitCode;

use nodus::ipc::{Channel, Handle, IpcError, Message};
use nodus::{Runtime, spawn};
use serde::Serialize;

#[derive(Serialize)]
struct Echo<'a> {
    echo: &'a Message,
}

fn main() -> ExitCode {
    let rt = Runtime::new();
    let code = rt.block_on(async {
        let channel = match Channel::from_env() {
            Ok(Some(channel)) => channel,
            Ok(None) => {
                eprintln!(
                    "ipc_echo: no IPC channel (NODE_CHANNEL_FD is not set); fork me from Node"
                );
                return 2;
            }
            Err(e) => {
                eprintln!("ipc_echo: {e}");
                return 2;
            }
        };
        while let Some(item) = channel.recv().await {
            let mut msg = match item {
                Ok(msg) => msg,
                Err(e) => {
                    // A bad frame was dropped; the channel goes on.
                    eprintln!("ipc_echo: {e}");
                    continue;
                }
            };
            if msg.handle().is_none() && msg.json() == "\"exit\"" {
                channel.disconnect();
                let _ = channel.flush().await;
                return 0;
            }
            let handle = msg.take_handle();
            match channel.send(&Echo { echo: &msg }) {
                Ok(_) => {}
                Err(IpcError::Closed) => break,
                Err(e) => eprintln!("ipc_echo: {e}"),
            }
            if let Some(handle) = handle {
                serve(handle);
            }
        }
        0
    });
    ExitCode::from(code)
}

/// Accepts connections on a listening socket handle; other handles are closed.
fn serve(handle: Handle) {
    let (listening, unix) = {
        let sock = socket2::SockRef::from(&handle);
        let unix = sock.domain().ok() == Some(socket2::Domain::UNIX);
        (sock.is_listener().unwrap_or(false), unix)
    };
    if !listening {
        return;
    }
    let greeting = format!("hello from nodus {}\n", std::process::id());
    if unix {
        let Ok(listener) = handle.into_unix_listener() else {
            return;
        };
        spawn(keep_accepting(async move || {
            let (conn, _) = listener.accept().await?;
            let _ = conn.write_all(greeting.as_bytes()).await;
            Ok(())
        }))
        .detach();
    } else {
        let Ok(listener) = handle.into_tcp_listener() else {
            return;
        };
        spawn(keep_accepting(async move || {
            let (conn, _) = listener.accept().await?;
            let _ = conn.write_all(greeting.as_bytes()).await;
            Ok(())
        }))
        .detach();
    }
}

/// Runs `greet_one` (an accept, and a greeting on the connection) again and again. A failed
/// accept keeps the listener: said once per run of failures, tried again in 100 ms.
async fn keep_accepting(mut greet_one: impl AsyncFnMut() -> std::io::Result<()>) {
    let mut failing = false;
    loop {
        match greet_one().await {
            Ok(()) => failing = false,
            Err(e) => {
                if !failing {
                    eprintln!("ipc_echo: accept failed: {e}; still listening, trying again");
                    failing = true;
                }
                nodus::sleep(100).await;
            }
        }
    }
}
