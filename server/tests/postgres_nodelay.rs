//! Every store connection to PostgreSQL has TCP_NODELAY (store/postgres/nodelay.rs):
//! without it, statements larger than a segment wait ~40 ms for a delayed ACK.
//!
//! A test binary of its own: the store sets the option on every socket of its
//! process connected to the database port, so the stores of other tests running in
//! the same process would set it on this test's plain connection as well, and the
//! first check (that a socket without the option is seen at all) would race them.

use mailcluster_server::store::Domains;
use mailcluster_server::store::Operations;
use std::str::FromStr;
use std::time::Duration;

use mailcluster_server::store::postgres::PgStore;
use mailcluster_server::store::postgres::nodelay::connections_without;
use mailcluster_testkit::TestDatabase;
use sqlx::Connection;

const CONNECT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_connections_use_tcp_nodelay() {
    let db = TestDatabase::create("mc_nodelay").await;
    let port = sqlx::postgres::PgConnectOptions::from_str(&db.url).expect("url").get_port();
    // The check sees a socket without the option: when this fails, sqlx sets it
    // itself again and the workaround can go.
    let raw = sqlx::PgConnection::connect(&db.url).await.expect("plain sqlx connection");
    assert!(connections_without(port) >= 1, "a plain sqlx 0.9.0 connection has Nagle on");
    raw.close().await.expect("close");

    let pg = PgStore::connect(&db.url, 4, CONNECT).await.expect("connect");
    // Several connections at once, and statements larger than a segment.
    let pings: Vec<_> = (0..4).map(|_| pg.synchronous_commit()).collect();
    for p in futures::future::join_all(pings).await {
        p.expect("query");
    }
    pg.migrate().await.expect("migrate");
    pg.domain_add("example.com").await.expect("schema usable");
    assert_eq!(connections_without(port), 0, "every PostgreSQL connection has TCP_NODELAY");
}
