//! A real DNS server on loopback for tests: hickory-server answering
//! authoritatively from zone files given as text, over UDP and TCP on one port.
//!
//! Tests describe the world the server under test sees (MX, A, TXT with SPF, DKIM
//! and DMARC records) as ordinary zone files, and point the resolver at
//! [`TestDns::addr`] (`dns.nameservers = ["127.0.0.1:PORT"]`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hickory_proto::rr::{LowerName, Name};
use hickory_proto::serialize::txt::Parser;
use hickory_server::Server;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::store::in_memory::InMemoryZoneHandler;
use hickory_server::zone_handler::{AxfrPolicy, Catalog, ZoneHandler, ZoneType};

/// A running DNS server; stops when dropped.
pub struct TestDns {
    addr: SocketAddr,
    queries: Arc<AtomicUsize>,
    names: Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
    catalog: Arc<tokio::sync::RwLock<Catalog>>,
}

/// The catalog, counting the requests it answers: what a test of a cache looks at.
struct Counting {
    catalog: Arc<tokio::sync::RwLock<Catalog>>,
    queries: Arc<AtomicUsize>,
    names: Arc<std::sync::Mutex<Vec<String>>>,
}

#[async_trait::async_trait]
impl RequestHandler for Counting {
    async fn handle_request<R: ResponseHandler, T: hickory_server::net::runtime::Time>(
        &self,
        request: &Request,
        response_handle: R,
    ) -> ResponseInfo {
        self.queries.fetch_add(1, Ordering::SeqCst);
        if let Ok(info) = request.request_info() {
            let q = info.query;
            self.names.lock().unwrap().push(format!("{} {}", q.name(), q.query_type()));
        }
        self.catalog.read().await.handle_request::<R, T>(request, response_handle).await
    }
}

impl TestDns {
    /// Serves `zones` (origin, zone file text) on 127.0.0.1 at a free port. A
    /// zone's text may use `@` and relative names; a SOA record is added when the
    /// text has none. Panics on a zone that does not parse: a test setup error.
    pub async fn start(zones: &[(&str, &str)]) -> TestDns {
        let catalog = Arc::new(tokio::sync::RwLock::new(catalog_of(zones)));
        // One port for both transports: a resolver falls back to TCP for answers
        // that do not fit a UDP datagram (100 MX records).
        let (udp, tcp) = loop {
            let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.expect("bind UDP");
            let addr = udp.local_addr().expect("UDP address");
            if let Ok(tcp) = tokio::net::TcpListener::bind(addr).await {
                break (udp, tcp);
            }
        };
        let addr = udp.local_addr().expect("UDP address");
        let queries = Arc::new(AtomicUsize::new(0));
        let names = Arc::new(std::sync::Mutex::new(Vec::new()));
        let handler = Counting { catalog: catalog.clone(), queries: queries.clone(), names: names.clone() };
        let mut server = Server::new(handler);
        server.register_socket(udp);
        server.register_listener(tcp, Duration::from_secs(5), 64 * 1024);
        let task = tokio::spawn(async move {
            let _ = server.block_until_done().await;
        });
        TestDns { addr, queries, names, task, catalog }
    }

    /// Serves `zones` from now on instead of the ones before (a record
    /// published, or withdrawn, while the test runs).
    pub async fn set_zones(&self, zones: &[(&str, &str)]) {
        *self.catalog.write().await = catalog_of(zones);
    }

    /// Requests answered so far (each UDP or TCP query counts once).
    pub fn queries(&self) -> usize {
        self.queries.load(Ordering::SeqCst)
    }

    /// The questions asked so far, in order (`name TYPE`).
    pub fn questions(&self) -> Vec<String> {
        self.names.lock().unwrap().clone()
    }

    /// Where the server answers (UDP and TCP).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// The catalog of `zones` (see [`TestDns::start`]).
fn catalog_of(zones: &[(&str, &str)]) -> Catalog {
    let mut catalog = Catalog::new();
    // An empty root zone: names outside the test zones get NXDOMAIN, as a
    // recursive resolver would give, instead of REFUSED (which resolvers and
    // DMARC's tree walk treat as a server failure).
    let root = [(".", "")];
    let with_root = zones.iter().chain(root.iter().filter(|_| !zones.iter().any(|(o, _)| *o == ".")));
    for (origin, text) in with_root {
        let origin_name = Name::from_ascii(origin).expect("zone origin");
        let mut full = String::new();
        if !text.contains(" SOA ") && !text.contains("\tSOA\t") {
            full.push_str("@ 60 IN SOA ns.test. hostmaster.test. 1 60 60 600 1\n");
        }
        full.push_str(text);
        let (origin_name, records) = Parser::new(full, None, Some(origin_name))
            .parse()
            .unwrap_or_else(|e| panic!("zone {origin} does not parse: {e}"));
        let handler: InMemoryZoneHandler =
            InMemoryZoneHandler::new(origin_name.clone(), records, ZoneType::Primary, AxfrPolicy::Deny)
                .unwrap_or_else(|e| panic!("zone {origin}: {e}"));
        let handler: Arc<dyn ZoneHandler> = Arc::new(handler);
        catalog.upsert(LowerName::new(&origin_name), vec![handler]);
    }
    catalog
}

impl Drop for TestDns {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain DNS query by hand (no resolver library on this side), so the test
    /// checks what goes over the wire.
    fn query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
        let mut q = Vec::new();
        q.extend_from_slice(&id.to_be_bytes());
        q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
        for label in name.trim_end_matches('.').split('.') {
            q.push(label.len() as u8);
            q.extend_from_slice(label.as_bytes());
        }
        q.push(0);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&1u16.to_be_bytes());
        q
    }

    #[tokio::test]
    async fn answers_mx_and_txt_from_zone_text() {
        let dns = TestDns::start(&[(
            "org-a.test.",
            "@ 60 IN MX 10 mx.org-a.test.\n\
             mx 60 IN A 127.0.0.1\n\
             @ 60 IN TXT \"v=spf1 ip4:127.0.0.1 -all\"\n",
        )])
        .await;
        let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        sock.connect(dns.addr()).await.unwrap();
        for (qtype, want) in [(15u16, &b"mx"[..]), (16, &b"v=spf1 ip4:127.0.0.1 -all"[..])] {
            sock.send(&query(7, "org-a.test", qtype)).await.unwrap();
            let mut buf = [0u8; 512];
            let n = tokio::time::timeout(Duration::from_secs(5), sock.recv(&mut buf)).await.unwrap().unwrap();
            let answer = &buf[..n];
            assert_eq!(&answer[..2], &7u16.to_be_bytes());
            assert_eq!(answer[3] & 0x0f, 0, "rcode NOERROR");
            assert_eq!(u16::from_be_bytes([answer[6], answer[7]]), 1, "one answer");
            assert!(answer.windows(want.len()).any(|w| w == want), "answer carries {want:?}");
        }
        // A name outside the zone: NXDOMAIN, never an answer; outside every zone too.
        sock.send(&query(8, "nope.org-a.test", 1)).await.unwrap();
        let mut buf = [0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(5), sock.recv(&mut buf)).await.unwrap().unwrap();
        assert_eq!(buf[3] & 0x0f, 3, "NXDOMAIN");
        assert_eq!(u16::from_be_bytes([buf[6], buf[7]]), 0);
        let _ = n;
        sock.send(&query(9, "_dmarc.test", 16)).await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(5), sock.recv(&mut buf)).await.unwrap().unwrap();
        assert_eq!(buf[3] & 0x0f, 3, "NXDOMAIN outside the test zones");
        let _ = n;
    }
}
