//! The tests' DNS server on its own, for benchmarks and trying things by hand:
//! `cargo run -p mailcluster-testkit --example test_dns -- ORIGIN=ZONEFILE...`
//! prints the address it answers at and serves until killed.

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut zones = Vec::new();
    for arg in &args {
        let (origin, file) = arg.split_once('=').expect("arguments are ORIGIN=ZONEFILE");
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
        zones.push((origin.to_string(), text));
    }
    let refs: Vec<(&str, &str)> = zones.iter().map(|(o, t)| (o.as_str(), t.as_str())).collect();
    let dns = mailcluster_testkit::dns::TestDns::start(&refs).await;
    println!("{}", dns.addr());
    std::future::pending::<()>().await;
}
