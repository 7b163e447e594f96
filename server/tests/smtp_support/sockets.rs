//! SMTP served on 127.0.0.1 over real sockets and real TLS (rustls with a
//! generated certificate), for tests with real clients.

use std::net::SocketAddr;
use std::sync::Arc;

use mailcluster_server::net::{ConnInfo, Protocol, SessionCtx, SessionStream, Shutdown, TlsProvider};
use mailcluster_server::smtp::SmtpProtocol;
use tokio::net::TcpListener;

pub fn tls_provider() -> TlsProvider {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("certificate");
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .expect("server config");
    TlsProvider::from_config(Arc::new(cfg))
}

/// Serves `proto` on an ephemeral port; `implicit_tls` wraps each connection in
/// TLS before the protocol sees it (port 465 style).
pub async fn listen(
    proto: Arc<SmtpProtocol>,
    tls: TlsProvider,
    implicit_tls: bool,
    shutdown: Shutdown,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((tcp, remote)) = listener.accept().await else { return };
            let proto = proto.clone();
            let tls = tls.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let stream = if implicit_tls {
                    match tls.acceptor().accept(tcp).await {
                        Ok(s) => SessionStream::Tls(Box::new(s)),
                        Err(_) => return,
                    }
                } else {
                    SessionStream::Plain(tcp)
                };
                let ctx = SessionCtx {
                    conn: ConnInfo { remote, local: addr, listener: proto.kind().listener_name() },
                    tls: Some(tls),
                    shutdown,
                };
                proto.handle(stream, ctx).await;
            });
        }
    });
    addr
}
