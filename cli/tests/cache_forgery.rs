//! What the real `mailcluster serve` reads back from Redis does not decide where
//! mail goes or whose mail is read: someone who can write Redis (and knows the
//! key layout, which is public) writes a recipient entry pointing at another
//! account, and copies one account's POP3 listing over another's. Mail still goes
//! to its recipient, and nobody reads another account's message.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use common::TestDatabase;
use common::cluster::{ServeProcess, add_users, block_on, cluster_env, smtp_deliver};
use common::{redis_url, unique};

fn redis_cli(url: &str, args: &[&str]) -> String {
    let out =
        Command::new("redis-cli").arg("-u").arg(url).arg("--raw").args(args).output().expect("redis-cli");
    assert!(out.status.success(), "redis-cli {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

struct Pop3(BufReader<TcpStream>);

impl Pop3 {
    fn login(addr: SocketAddr, user: &str) -> Pop3 {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect pop3");
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut c = Pop3(BufReader::new(stream));
        assert!(c.line().starts_with("+OK"));
        assert!(c.cmd(&format!("USER {user}")).starts_with("+OK"));
        let r = c.cmd("PASS the secret");
        assert!(r.starts_with("+OK"), "{r}");
        c
    }
    fn line(&mut self) -> String {
        let mut line = String::new();
        self.0.read_line(&mut line).expect("read");
        line.trim_end().to_string()
    }
    fn cmd(&mut self, command: &str) -> String {
        write!(self.0.get_mut(), "{command}\r\n").expect("write");
        self.line()
    }
    /// A multi-line reply's lines, up to the terminating ".".
    fn multi(&mut self, command: &str) -> (String, Vec<String>) {
        let first = self.cmd(command);
        let mut lines = Vec::new();
        if first.starts_with("+OK") {
            loop {
                let l = self.line();
                if l == "." {
                    break;
                }
                lines.push(l);
            }
        }
        (first, lines)
    }
    fn quit(mut self) {
        let _ = self.cmd("QUIT");
        let _ = self.0.read_to_end(&mut Vec::new());
    }
}

/// (account id, INBOX id) of `email`.
fn inbox_of(db: &str, email: &str) -> (i64, i64) {
    block_on(async {
        let pool = sqlx::PgPool::connect(db).await.expect("connect");
        let row: (i64, i64) = sqlx::query_as(
            "SELECT a.id, m.id FROM accounts a JOIN mailboxes m ON m.account_id = a.id \
             WHERE a.email = $1 AND m.name = 'INBOX'",
        )
        .bind(email)
        .fetch_one(&pool)
        .await
        .expect("inbox");
        row
    })
}

#[test]
fn values_written_into_redis_redirect_no_mail_and_expose_no_body() {
    let db = TestDatabase::create_blocking("mc_forge");
    let prefix = format!("{}:", unique("mcforge"));
    let redis = redis_url();
    let dir = tempfile::tempdir().unwrap();
    let mut env = cluster_env(&db.url, &redis, &prefix, "smtp,pop3");
    env.extend([("MAILCLUSTER_POP3__SHARED_LISTING_MIN_MESSAGES", "1")]);
    add_users(dir.path(), &env, &["alice@example.org", "bob@example.org"], "the secret");
    let (_, alice_inbox) = inbox_of(&db.url, "alice@example.org");
    let (bob, bob_inbox) = inbox_of(&db.url, "bob@example.org");
    let server = ServeProcess::start(dir.path(), &env, 2);
    server.wait_for_cache_up(Duration::from_secs(30));

    // A recipient entry for alice that names bob's INBOX, in the format the
    // server writes (`smtp:rcpt:<address>` → `m:<account>:<mailbox>:<limited>`).
    let rcpt_key = format!("{prefix}val:smtp:rcpt:alice@example.org");
    redis_cli(&redis, &["SET", &rcpt_key, &format!("m:{bob}:{bob_inbox}:0"), "PX", "600000"]);
    smtp_deliver(server.addr("smtp"), "alice@example.org", "for alice only");
    smtp_deliver(server.addr("smtp"), "bob@example.org", "bob's private mail");

    let mut on_bob = Pop3::login(server.addr("pop3"), "bob@example.org");
    let (_, bob_list) = on_bob.multi("LIST");
    assert_eq!(bob_list.len(), 1, "alice's mail did not go to bob: {bob_list:?}");
    on_bob.quit();

    // Bob's listing is in Redis now (bob logged in). Copied over alice's key,
    // and alice's INBOX made to look like bob's to the checks a copy could
    // meet (same UIDVALIDITY and modseq), it would list bob's message to alice.
    let bob_listing =
        redis_cli(&redis, &["--scan", "--pattern", &format!("{prefix}val:pop3:listing:*:{bob_inbox}")]);
    assert!(!bob_listing.is_empty(), "bob's listing was shared");
    let alice_listing =
        bob_listing.trim_end_matches(&bob_inbox.to_string()).to_string() + &alice_inbox.to_string();
    block_on(async {
        let pool = sqlx::PgPool::connect(&db.url).await.expect("connect");
        sqlx::query(
            "UPDATE mailboxes a SET uid_validity = b.uid_validity, highest_modseq = b.highest_modseq \
             FROM mailboxes b WHERE a.id = $1 AND b.id = $2",
        )
        .bind(alice_inbox)
        .bind(bob_inbox)
        .execute(&pool)
        .await
        .expect("update");
    });
    redis_cli(&redis, &["COPY", &bob_listing, &alice_listing, "REPLACE"]);

    let mut on_alice = Pop3::login(server.addr("pop3"), "alice@example.org");
    let (_, alice_list) = on_alice.multi("LIST");
    assert_eq!(alice_list.len(), 1, "alice's own message only: {alice_list:?}");
    let (_, body) = on_alice.multi("RETR 1");
    let body = body.join("\n");
    assert!(body.contains("for alice only"), "{body}");
    assert!(!body.contains("bob's private mail"), "alice read bob's message: {body}");
    on_alice.quit();

    let metrics = common::wire::http_get(server.admin, "/metrics").1;
    let forged: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("mail_cache_forged_total "))
        .map_or(0, |v| v.trim().parse().unwrap());
    assert!(forged >= 2, "both forged values were seen and refused: {forged}");
}
