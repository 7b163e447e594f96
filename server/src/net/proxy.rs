//! PROXY protocol v1 (text) and v2 (binary) headers, as sent by load balancers in
//! front of the pods, so sessions see the real client address.
//!
//! The header is read with exact-length reads, never into a buffer that could
//! swallow the first protocol bytes after it: the session (or the TLS handshake)
//! reads the socket next and must find every byte the client sent. v1 is at most 107
//! bytes and ends with CRLF, so it is read a byte at a time — about a hundred small
//! reads once per connection; v2 announces its length in the 16-byte preamble.
//! Parsing itself is `ppp`'s.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ipnet::IpNet;
use tokio::io::{AsyncRead, AsyncReadExt};

/// How long a trusted peer gets to send the whole header.
pub const PROXY_HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// v1 maximum length, CRLF included (PROXY protocol spec §2.1).
const V1_MAX: usize = 107;
/// v2 signature (spec §2.2).
const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// Largest v2 address + TLV block we accept. The spec allows 65535; load balancers
/// send a few hundred bytes at most, and this bounds what a peer can make us buffer.
const V2_MAX_PAYLOAD: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("peer {0} is not a trusted PROXY protocol source")]
    Untrusted(IpAddr),
    #[error("no PROXY header within {0:?}")]
    Timeout(Duration),
    #[error("malformed PROXY header: {0}")]
    Malformed(String),
    #[error("reading PROXY header: {0}")]
    Io(#[from] std::io::Error),
}

/// Whether `peer` may send a PROXY header.
pub fn is_trusted(peer: IpAddr, trusted: &[IpNet]) -> bool {
    // An IPv4 peer on a dual-stack socket shows up as ::ffff:a.b.c.d.
    let peer = match peer {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(peer),
        v4 => v4,
    };
    trusted.iter().any(|net| net.contains(&peer))
}

/// Checks the peer against `trusted`, then reads one PROXY header within `timeout`.
/// Returns the client address it names, or `None` for a `LOCAL`/`UNKNOWN` header
/// (a health check by the proxy itself: the peer address stands).
pub async fn accept_header<S: AsyncRead + Unpin>(
    stream: &mut S,
    peer: SocketAddr,
    trusted: &[IpNet],
    timeout: Duration,
) -> Result<Option<SocketAddr>, ProxyError> {
    if !is_trusted(peer.ip(), trusted) {
        return Err(ProxyError::Untrusted(peer.ip()));
    }
    match tokio::time::timeout(timeout, read_header(stream)).await {
        Ok(result) => result,
        Err(_) => Err(ProxyError::Timeout(timeout)),
    }
}

/// Reads exactly one v1 or v2 header and returns its source address.
pub async fn read_header<S: AsyncRead + Unpin>(stream: &mut S) -> Result<Option<SocketAddr>, ProxyError> {
    let mut buf = vec![0u8; 6];
    stream.read_exact(&mut buf).await?;
    if buf == b"PROXY " {
        // v1: read to CRLF, bounded.
        loop {
            if buf.len() >= V1_MAX {
                return Err(ProxyError::Malformed("v1 header longer than 107 bytes".into()));
            }
            let byte = stream.read_u8().await?;
            buf.push(byte);
            if buf.ends_with(b"\r\n") {
                break;
            }
        }
        let header =
            ppp::v1::Header::try_from(buf.as_slice()).map_err(|e| ProxyError::Malformed(format!("{e:?}")))?;
        return Ok(match header.addresses {
            ppp::v1::Addresses::Tcp4(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
            ppp::v1::Addresses::Tcp6(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
            ppp::v1::Addresses::Unknown => None,
        });
    }
    if buf[..] != V2_SIGNATURE[..6] {
        return Err(ProxyError::Malformed("neither a v1 nor a v2 header".into()));
    }
    // v2: 16-byte preamble (signature, version/command, family/protocol, length).
    buf.resize(16, 0);
    stream.read_exact(&mut buf[6..]).await?;
    if buf[..12] != V2_SIGNATURE {
        return Err(ProxyError::Malformed("bad v2 signature".into()));
    }
    let payload = u16::from_be_bytes([buf[14], buf[15]]) as usize;
    if payload > V2_MAX_PAYLOAD {
        return Err(ProxyError::Malformed(format!("v2 payload of {payload} bytes")));
    }
    buf.resize(16 + payload, 0);
    stream.read_exact(&mut buf[16..]).await?;
    let header =
        ppp::v2::Header::try_from(buf.as_slice()).map_err(|e| ProxyError::Malformed(format!("{e:?}")))?;
    if header.command == ppp::v2::Command::Local {
        return Ok(None);
    }
    Ok(match header.addresses {
        ppp::v2::Addresses::IPv4(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        ppp::v2::Addresses::IPv6(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        // Unix sockets and unspecified families carry no client IP we could use.
        ppp::v2::Addresses::Unix(_) | ppp::v2::Addresses::Unspecified => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    async fn parse(bytes: &[u8]) -> (Result<Option<SocketAddr>, ProxyError>, Vec<u8>) {
        let (mut client, mut server) = tokio::io::duplex(1024);
        client.write_all(bytes).await.expect("write");
        drop(client);
        let result = read_header(&mut server).await;
        let mut rest = Vec::new();
        let _ = server.read_to_end(&mut rest).await;
        (result, rest)
    }

    #[tokio::test]
    async fn v1_leaves_following_bytes_unread() {
        let (r, rest) = parse(b"PROXY TCP4 192.0.2.7 10.0.0.1 40000 25\r\nEHLO x\r\n").await;
        assert_eq!(r.expect("valid"), Some("192.0.2.7:40000".parse().expect("addr")));
        assert_eq!(rest, b"EHLO x\r\n");
        let (r, _) = parse(b"PROXY TCP6 2001:db8::1 2001:db8::2 1234 143\r\n").await;
        assert_eq!(r.expect("valid"), Some("[2001:db8::1]:1234".parse().expect("addr")));
        let (r, _) = parse(b"PROXY UNKNOWN\r\n").await;
        assert_eq!(r.expect("valid"), None);
    }

    #[tokio::test]
    async fn v2_leaves_following_bytes_unread() {
        let src: SocketAddr = "198.51.100.9:5555".parse().expect("addr");
        let dst: SocketAddr = "10.0.0.1:25".parse().expect("addr");
        let mut header = ppp::v2::Builder::with_addresses(
            ppp::v2::Version::Two | ppp::v2::Command::Proxy,
            ppp::v2::Protocol::Stream,
            (src, dst),
        )
        .build()
        .expect("header");
        header.extend_from_slice(b"A1 NOOP\r\n");
        let (r, rest) = parse(&header).await;
        assert_eq!(r.expect("valid"), Some(src));
        assert_eq!(rest, b"A1 NOOP\r\n");
    }

    #[tokio::test]
    async fn garbage_is_refused_without_reading_forever() {
        assert!(matches!(parse(b"EHLO example.com\r\n").await.0, Err(ProxyError::Malformed(_))));
        assert!(matches!(parse(b"PROXY TCP4 nonsense\r\n").await.0, Err(ProxyError::Malformed(_))));
        let long = [b"PROXY ".as_slice(), &[b'1'; 200]].concat();
        assert!(matches!(parse(&long).await.0, Err(ProxyError::Malformed(_))));
        assert!(matches!(parse(b"PROXY TCP4").await.0, Err(ProxyError::Io(_))));
    }

    #[test]
    fn trust_is_by_cidr_and_mapped_v4_counts() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().expect("net")];
        assert!(is_trusted("10.1.2.3".parse().expect("ip"), &trusted));
        assert!(is_trusted("::ffff:10.1.2.3".parse().expect("ip"), &trusted));
        assert!(!is_trusted("192.0.2.1".parse().expect("ip"), &trusted));
    }
}
