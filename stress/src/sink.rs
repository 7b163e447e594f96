//! A minimal SMTP sink for benchmarking the generator itself (hidden `--sink ADDR`).
//!
//! It accepts every command with the cheapest correct reply, reads DATA up to the
//! terminating dot without storing it, and batches replies to pipelined commands
//! into one write (it flushes only when no further input is buffered). With
//! `--sink-tls` it speaks implicit TLS with a freshly generated self-signed
//! certificate, for holding many idle TLS connections.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::StressArgs;
use crate::workload::parse_duration;

pub async fn run_from_args(args: &StressArgs) -> anyhow::Result<()> {
    let addr = args.sink.as_deref().unwrap_or("127.0.0.1:0");
    let listener = TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
    let tls = if args.sink_tls { Some(self_signed_acceptor()?) } else { None };
    eprintln!(
        "sink listening on {} ({})",
        listener.local_addr()?,
        if tls.is_some() { "implicit TLS" } else { "plain" }
    );
    let serve = serve(listener, tls);
    match &args.sink_for {
        Some(d) => {
            let _ = tokio::time::timeout(parse_duration(d)?, serve).await;
        }
        None => serve.await,
    }
    Ok(())
}

/// A TLS acceptor with a self-signed certificate for `localhost`/127.0.0.1.
pub fn self_signed_acceptor() -> anyhow::Result<TlsAcceptor> {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])?;
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accept forever.
pub async fn serve(listener: TcpListener, tls: Option<TlsAcceptor>) {
    loop {
        let (sock, _) = match listener.accept().await {
            Ok(s) => s,
            Err(_) => {
                // Out of descriptors or similar: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = sock.set_nodelay(true);
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                Some(acc) => {
                    if let Ok(s) = acc.accept(sock).await {
                        let _ = session(s).await;
                    }
                }
                None => {
                    let _ = session(sock).await;
                }
            }
        });
    }
}

async fn session<S: AsyncRead + AsyncWrite + Unpin>(stream: S) -> std::io::Result<()> {
    let (r, w) = tokio::io::split(stream);
    let mut r = BufReader::with_capacity(16 * 1024, r);
    let mut w = BufWriter::with_capacity(4 * 1024, w);
    w.write_all(b"220 sink ESMTP\r\n").await?;
    w.flush().await?;
    let mut line = Vec::with_capacity(512);
    loop {
        line.clear();
        let n = (&mut r).take(8192).read_until(b'\n', &mut line).await?;
        if n == 0 {
            return Ok(());
        }
        let verb = line.get(..4).map(|v| v.to_ascii_uppercase()).unwrap_or_default();
        match &verb[..] {
            b"EHLO" => {
                w.write_all(b"250-sink\r\n250-PIPELINING\r\n250-AUTH PLAIN LOGIN\r\n250 8BITMIME\r\n").await?
            }
            b"DATA" => {
                w.write_all(b"354 go\r\n").await?;
                w.flush().await?;
                loop {
                    line.clear();
                    if (&mut r).take(1 << 20).read_until(b'\n', &mut line).await? == 0 {
                        return Ok(());
                    }
                    if line == b".\r\n" || line == b".\n" {
                        break;
                    }
                }
                w.write_all(b"250 2.0.0 queued\r\n").await?;
            }
            b"AUTH" => {
                // AUTH LOGIN without an initial response takes two challenges.
                let upper = line.to_ascii_uppercase();
                if upper.starts_with(b"AUTH LOGIN") && upper.len() <= b"AUTH LOGIN\r\n".len() {
                    for challenge in [&b"334 VXNlcm5hbWU6\r\n"[..], b"334 UGFzc3dvcmQ6\r\n"] {
                        w.write_all(challenge).await?;
                        w.flush().await?;
                        line.clear();
                        if (&mut r).take(8192).read_until(b'\n', &mut line).await? == 0 {
                            return Ok(());
                        }
                    }
                }
                w.write_all(b"235 2.7.0 ok\r\n").await?
            }
            b"QUIT" => {
                w.write_all(b"221 bye\r\n").await?;
                w.flush().await?;
                return Ok(());
            }
            b"HELO" | b"MAIL" | b"RCPT" | b"RSET" | b"NOOP" => w.write_all(b"250 ok\r\n").await?,
            _ => w.write_all(b"500 unknown\r\n").await?,
        }
        // Pipelined commands are answered together: flush only when the client has
        // nothing more in flight.
        if r.buffer().is_empty() {
            w.flush().await?;
        }
    }
}
