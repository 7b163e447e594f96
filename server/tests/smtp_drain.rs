//! The drain's goodbye reaches SMTP clients over real TCP, even a client that has
//! already written more commands behind it.

mod smtp_support;

use std::sync::Arc;
use std::time::Duration;

use mailcluster_server::metrics::Metrics;
use mailcluster_server::net::{Listener, ListenerSpec, ShutdownController, TlsMode, serve};
use smtp_support::{Backend, Harness, config};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const STEP: Duration = Duration::from_secs(10);

async fn line(c: &mut BufReader<TcpStream>) -> String {
    let mut l = String::new();
    tokio::time::timeout(STEP, c.read_line(&mut l)).await.expect("reply in time").expect("read reply");
    l
}

/// A client pipelining commands while the server drains: the input the session
/// never reads must not turn the close into a RST, which destroys a 421 still
/// in the server's send queue. The runtime has one thread, so the commands are
/// in the server's socket, unread, when the drain starts.
#[tokio::test]
async fn the_drain_says_421_and_closes_without_a_reset() {
    let h = Harness::new(Backend::Sqlite, config(|_| {})).await;
    let spec = ListenerSpec {
        name: "smtp",
        addr: "127.0.0.1:0".parse().expect("addr"),
        tls: TlsMode::Plain,
        max_connections: 10,
        max_connections_per_ip: 0,
        backlog: 16,
        keepalive: None,
        proxy: None,
    };
    let listener = Listener::bind(spec).expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let shutdown = ShutdownController::new(Duration::from_secs(5));
    let task =
        tokio::spawn(serve(vec![(listener, h.mx.clone())], None, Arc::new(Metrics::new()), shutdown.clone()));

    let mut c = BufReader::new(TcpStream::connect(addr).await.expect("connect"));
    assert!(line(&mut c).await.starts_with("220 "));
    c.get_mut().write_all(b"EHLO client.test\r\n").await.expect("write");
    while !line(&mut c).await.starts_with("250 ") {}
    // Written without yielding: the session has not run since.
    let mut pipelined = Vec::new();
    for _ in 0..200 {
        pipelined.extend_from_slice(b"MAIL FROM:<a@remote.test>\r\nRSET\r\n");
    }
    c.get_mut().write_all(&pipelined).await.expect("write");
    shutdown.trigger();

    let reply = line(&mut c).await;
    assert!(reply.starts_with("421 4.3.2 "), "{reply:?}");
    let mut rest = Vec::new();
    let end = tokio::time::timeout(STEP, c.read_to_end(&mut rest)).await.expect("close in time");
    assert!(end.is_ok(), "the server closed with a reset: {end:?}");
    assert!(rest.is_empty(), "nothing after the 421: {:?}", String::from_utf8_lossy(&rest));
    // The session still reads (and drops) what comes: a reset would have come with
    // the close, and a write after it fails.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let late = c.get_mut().write_all(b"QUIT\r\n").await;
    assert!(late.is_ok(), "the server reset the connection: {late:?}");
    drop(c);
    tokio::time::timeout(STEP, task).await.expect("drain ends").expect("serve task");
}
