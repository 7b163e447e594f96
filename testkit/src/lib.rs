//! What the tests of every crate share, written once: where PostgreSQL and Redis
//! are (`DATABASE_URL`, `REDIS_URL`, as `scripts/test.sh` exports them), a fresh
//! PostgreSQL database per test, unique names for databases and key prefixes, and
//! the backend matrix of the store.
//!
//! A test that needs PostgreSQL fails (it never skips) when PostgreSQL does not
//! answer: a green run means the real database was used.
#![forbid(unsafe_code)]

pub mod dns;
pub mod smtp;

use std::path::Path;
use std::time::Duration;

use sqlx::Connection;

/// How long a test waits for PostgreSQL to answer before failing.
const CONNECT: Duration = Duration::from_secs(10);

/// The PostgreSQL server of the tests (`DATABASE_URL`; Debian's default cluster
/// without it).
pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// The Redis of the tests (`REDIS_URL`; the local default without it).
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A name no other test (of this run or another process) uses: for databases and
/// Redis key prefixes (letters, digits and underscores).
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{:016x}", rand::random::<u64>())
}

/// `url` with its database name replaced by `name` (query parameters kept).
pub fn with_database(url: &str, name: &str) -> String {
    let authority_start = url.find("://").map(|i| i + 3).unwrap_or(0);
    let rest = &url[authority_start..];
    let authority_end = authority_start + rest.find(['/', '?']).unwrap_or(rest.len());
    let query = url.find('?').map(|q| &url[q..]).unwrap_or("");
    format!("{}/{name}{query}", &url[..authority_end])
}

/// A PostgreSQL database created for one test and dropped, with its connections,
/// when this value is dropped.
pub struct TestDatabase {
    pub name: String,
    pub url: String,
}

impl TestDatabase {
    /// Creates `<prefix>_<random>` on [`database_url`]; panics (the test fails)
    /// when PostgreSQL is unreachable.
    pub async fn create(prefix: &str) -> TestDatabase {
        let admin = database_url();
        let name = unique(prefix);
        let mut conn = tokio::time::timeout(CONNECT, sqlx::PgConnection::connect(&admin))
            .await
            .unwrap_or_else(|_| panic!("PostgreSQL at DATABASE_URL did not answer within {CONNECT:?}"))
            .unwrap_or_else(|e| panic!("PostgreSQL at DATABASE_URL is unreachable: {e}"));
        // `name` is made here of letters, digits and underscores.
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("cannot create test database {name}: {e}"));
        let _ = conn.close().await;
        TestDatabase { url: with_database(&admin, &name), name }
    }

    /// [`TestDatabase::create`] for synchronous tests.
    pub fn create_blocking(prefix: &str) -> TestDatabase {
        let prefix = prefix.to_string();
        on_own_runtime(async move { TestDatabase::create(&prefix).await })
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let name = std::mem::take(&mut self.name);
        // Drop runs inside async tests too, where blocking the runtime's thread on
        // another runtime is not allowed: the drop gets a thread of its own.
        on_own_runtime(async move {
            if let Ok(mut conn) = sqlx::PgConnection::connect(&database_url()).await {
                let drop = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                let _ = sqlx::query(sqlx::AssertSqlSafe(drop)).execute(&mut conn).await;
                let _ = conn.close().await;
            }
        });
    }
}

/// Runs `f` to completion on a fresh runtime on a thread of its own.
fn on_own_runtime<T: Send + 'static>(f: impl Future<Output = T> + Send + 'static) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("test runtime").block_on(f)
    })
    .join()
    .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// The store backends every store-facing test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub const ALL: [Backend; 2] = [Backend::Sqlite, Backend::Postgres];

    /// A fresh, empty database of this backend: a SQLite file in `dir`, or a new
    /// PostgreSQL database (kept alive by the returned guard). Its URL first.
    pub async fn fresh_database(self, dir: &Path, prefix: &str) -> (String, Option<TestDatabase>) {
        match self {
            Backend::Sqlite => (format!("sqlite://{}", dir.join(format!("{prefix}.db")).display()), None),
            Backend::Postgres => {
                let db = TestDatabase::create(prefix).await;
                (db.url.clone(), Some(db))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_database_replaces_only_the_path() {
        assert_eq!(with_database("postgres://u:p@h:5432/postgres", "t1"), "postgres://u:p@h:5432/t1");
        assert_eq!(with_database("postgres://h", "t1"), "postgres://h/t1");
        assert_eq!(with_database("postgres://h/db?sslmode=disable", "t2"), "postgres://h/t2?sslmode=disable");
    }

    #[test]
    fn unique_names_differ_and_are_sql_identifiers() {
        let (a, b) = (unique("mc_t"), unique("mc_t"));
        assert_ne!(a, b);
        assert!(a.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_'), "{a}");
    }
}
