//! "Hello, World!" over HTTP/1.1 keep-alive: the plaintext benchmark server.
//!
//! `cargo run --release -p nodus-http --example hello_http -- 8080`
//!
//! Its listener defers accepts (`TCP_DEFER_ACCEPT`), as `nodus serve`'s does.

use http::header::{CONTENT_TYPE, HeaderValue};
use nodus::Runtime;
use nodus::net::{ListenOptions, TcpListener};
use nodus_http::{Config, full, serve};

fn main() {
    let port: u16 = match std::env::args().nth(1).map(|p| p.parse()) {
        Some(Ok(p)) => p,
        _ => {
            eprintln!("usage: hello_http PORT");
            std::process::exit(2);
        }
    };
    let rt = Runtime::new();
    rt.block_on(async move {
        let options = ListenOptions {
            defer_accept: true,
            ..ListenOptions::default()
        };
        let listener = TcpListener::bind_with(("127.0.0.1", port), options).unwrap_or_else(|e| {
            eprintln!("hello_http: cannot listen on 127.0.0.1:{port}: {e}");
            std::process::exit(1);
        });
        let config = Config {
            name: "http:hello",
            // The handler never asks for its peer.
            conn_info: false,
            ..Config::default()
        };
        let _server = serve(listener, config, |_req| async {
            let mut resp = http::Response::new(full("Hello, World!"));
            resp.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            resp
        });
        std::future::pending::<()>().await;
    });
}
