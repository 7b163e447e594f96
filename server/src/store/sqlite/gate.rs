//! Group commit for every write of the embedded store.
//!
//! With `synchronous=FULL` each COMMIT fsyncs the WAL, and one connection writes:
//! writes queued one behind the other each paid a whole fsync, so at 50 IMAP
//! clients a STORE spent ~30 ms in that queue (bench/RESULTS.md, IMAP mix run 12).
//! The gate runs the writes that queue up together inside one transaction, each in
//! its own SAVEPOINT (a write that fails takes back only its own changes), and one
//! COMMIT — one fsync — makes the whole batch durable. A writer still returns only
//! after that COMMIT, and the other connections see nothing of the batch before
//! it: what a client is told, or shown by another session, is on disk.
//!
//! Shape: writers queue on a fair (FIFO) mutex over the batch. The first of a batch
//! opens the transaction (`BEGIN IMMEDIATE`); each writer runs its statements
//! inside a savepoint and releases it. A writer that finds nobody queued behind it
//! commits the batch itself and answers every writer in it; one that finds others
//! waiting leaves the COMMIT to them. No timer: a batch is whatever queued up
//! while the one before it ran, and a lone write on an idle server commits at
//! once. A committer task commits what a writer left open and nobody came to
//! finish (a writer that gave up waiting, or one whose caller went away).
//!
//! The gate keeps the writer connection between batches: handing it back to the
//! pool costs a task and a ping per batch, and while the returned connection waits
//! for that task on a busy runtime the next batch cannot start (bench/RESULTS.md,
//! SMTP run 17). An in-memory database is the exception: its one connection also
//! serves the reads, so it goes back to the pool after each batch.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use sqlx::{Executor, Sqlite};
use tokio::sync::{Mutex, OwnedMutexGuard, mpsc, oneshot};

use crate::store::common::db_err;
use crate::store::{StoreError, StoreResult};

/// The invariant [`WriteTx`] relies on: it exists only while a batch is open.
const OPEN: &str = "a write transaction exists only inside an open batch";

type Answer = oneshot::Sender<StoreResult<()>>;

struct Batch {
    /// The writer connection: always there once taken, unless it serves the
    /// reads too; then only while a batch is open.
    conn: Option<PoolConnection<Sqlite>>,
    /// A transaction is open on `conn`.
    open: bool,
    /// The connection also serves the reads: back to the pool after each batch.
    shared: bool,
    /// Writers whose savepoint is released, each answered at COMMIT.
    released: Vec<Answer>,
    /// A write ended without committing: its savepoint is yet to be rolled back.
    undo: bool,
}

/// What the gate has done since the store opened.
#[derive(Default)]
pub(crate) struct GateCounts {
    pub commits: AtomicU64,
    pub writes: AtomicU64,
    /// Writers waiting for the batch now.
    pub waiting: AtomicUsize,
}

pub(super) struct WriteGate {
    pool: SqlitePool,
    batch: Arc<Mutex<Batch>>,
    nudge: mpsc::Sender<()>,
    lock_timeout: Duration,
    counts: Arc<GateCounts>,
}

impl WriteGate {
    /// A gate over `pool` (one connection). Starts the committer task, which ends
    /// when the gate and every [`WriteTx`] are gone.
    pub fn new(pool: SqlitePool, shared: bool, lock_timeout: Duration) -> Self {
        let batch = Arc::new(Mutex::new(Batch {
            conn: None,
            open: false,
            shared,
            released: Vec::new(),
            undo: false,
        }));
        // One pending nudge is enough: the committer commits everything released
        // before it takes the batch.
        let (nudge, nudges) = mpsc::channel(1);
        let counts = Arc::new(GateCounts::default());
        tokio::spawn(run_committer(batch.clone(), nudges, counts.clone()));
        WriteGate { pool, batch, nudge, lock_timeout, counts }
    }

    /// Whether a write holds the writer connection now (for the pool figures).
    pub fn busy(&self) -> bool {
        self.batch.try_lock().map(|b| b.open).unwrap_or(true)
    }

    #[cfg(test)]
    pub fn counts(&self) -> &GateCounts {
        &self.counts
    }

    /// A write inside the current batch (opening one if none is): waits behind the
    /// writers before it, up to the pool's acquire timeout.
    pub async fn begin(&self) -> Result<WriteTx, sqlx::Error> {
        self.counts.waiting.fetch_add(1, Ordering::Relaxed);
        let lock = tokio::time::timeout(self.lock_timeout, self.batch.clone().lock_owned()).await;
        self.counts.waiting.fetch_sub(1, Ordering::Relaxed);
        let Ok(mut batch) = lock else { return Err(sqlx::Error::PoolTimedOut) };
        settle(&mut batch).await;
        if batch.conn.is_none() {
            batch.conn = Some(self.pool.acquire().await?);
        }
        if !batch.open {
            let conn = batch.conn.as_deref_mut().expect(OPEN);
            // IMMEDIATE: another process's write lock (the CLI adding a user while
            // `serve` runs) is waited for here, by busy_timeout, rather than
            // failing a deferred transaction halfway.
            if let Err(e) = conn.execute("BEGIN IMMEDIATE").await {
                put_back(&mut batch);
                return Err(e);
            }
            batch.open = true;
        }
        let conn = batch.conn.as_deref_mut().expect(OPEN);
        if let Err(e) = conn.execute("SAVEPOINT w").await {
            abort(&mut batch, &e.to_string()).await;
            return Err(e);
        }
        self.counts.writes.fetch_add(1, Ordering::Relaxed);
        Ok(WriteTx {
            batch,
            nudge: self.nudge.clone(),
            counts: self.counts.clone(),
            released: false,
            handed_over: false,
        })
    }
}

/// One write: the writer connection inside its own savepoint. Dropped without
/// [`WriteTx::commit`], its changes are rolled back (by the next to take the batch).
pub(crate) struct WriteTx {
    batch: OwnedMutexGuard<Batch>,
    nudge: mpsc::Sender<()>,
    counts: Arc<GateCounts>,
    released: bool,
    /// Released with writers waiting: one of them (or the committer) commits.
    handed_over: bool,
}

impl WriteTx {
    /// Releases the savepoint and waits for the COMMIT that makes it durable.
    pub async fn commit(mut self) -> StoreResult<()> {
        let conn = self.deref_mut();
        conn.execute("RELEASE w").await.map_err(db_err)?;
        let (answer, committed) = oneshot::channel();
        let batch = &mut self.batch;
        batch.released.push(answer);
        self.released = true;
        if self.counts.waiting.load(Ordering::Acquire) == 0 {
            // Nobody to share the COMMIT with: the batch ends here.
            commit_batch(batch, &self.counts).await;
            drop(self);
            return committed.await.map_err(|_| StoreError::Unavailable("write batch abandoned".into()))?;
        }
        self.handed_over = true;
        let gate = OwnedMutexGuard::mutex(batch).clone();
        let committer_gone = self.nudge.is_closed();
        let counts = self.counts.clone();
        drop(self);
        if committer_gone {
            // The runtime that started the committer has ended (a store shared
            // between runtimes): commit here instead.
            commit_batch(&mut *gate.lock().await, &counts).await;
        }
        committed.await.map_err(|_| StoreError::Unavailable("write batch abandoned".into()))?
    }
}

impl Deref for WriteTx {
    type Target = SqliteConnection;
    fn deref(&self) -> &SqliteConnection {
        self.batch.conn.as_deref().expect(OPEN)
    }
}

impl DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        self.batch.conn.as_deref_mut().expect(OPEN)
    }
}

impl Drop for WriteTx {
    fn drop(&mut self) {
        self.batch.undo |= !self.released;
        if !self.released || self.handed_over {
            // Full: a nudge is pending already. Closed: see `commit`.
            let _ = self.nudge.try_send(());
        }
        // The guard goes after this: the committer, woken, queues behind the
        // writers already waiting.
    }
}

async fn run_committer(batch: Arc<Mutex<Batch>>, mut nudges: mpsc::Receiver<()>, counts: Arc<GateCounts>) {
    while nudges.recv().await.is_some() {
        commit_batch(&mut *batch.lock().await, &counts).await;
    }
}

/// Commits the open batch, if any, and answers its writers.
async fn commit_batch(batch: &mut Batch, counts: &GateCounts) {
    settle(batch).await;
    if !std::mem::take(&mut batch.open) {
        return;
    }
    // The answers leave the batch first: should this future be dropped during the
    // COMMIT, its writers hear that the outcome is unknown instead of waiting on.
    let answers = std::mem::take(&mut batch.released);
    let conn = batch.conn.as_deref_mut().expect(OPEN);
    // A failed COMMIT is the database's trouble, not any one write's: each writer
    // hears it as unavailability (SMTP 451, IMAP NO [UNAVAILABLE]) and may retry.
    let result = conn.execute("COMMIT").await.map(drop).map_err(|e| db_err(e).to_string());
    if result.is_err() {
        // Leaves no transaction open on the connection.
        let _ = conn.execute("ROLLBACK").await;
    } else {
        counts.commits.fetch_add(1, Ordering::Relaxed);
    }
    put_back(batch);
    for answer in answers {
        let _ = answer.send(result.clone().map_err(StoreError::Unavailable));
    }
}

/// Hands the connection back to the pool between batches when it also serves
/// the reads.
fn put_back(batch: &mut Batch) {
    if batch.shared {
        batch.conn = None;
    }
}

/// Rolls back the savepoint of a write that ended without committing.
async fn settle(batch: &mut Batch) {
    if !std::mem::take(&mut batch.undo) {
        return;
    }
    let Some(conn) = batch.conn.as_deref_mut().filter(|_| batch.open) else { return };
    let undone = match conn.execute("ROLLBACK TO w").await {
        Ok(_) => conn.execute("RELEASE w").await.map(drop),
        Err(e) => Err(e),
    };
    if let Err(e) = undone {
        // No savepoint to return to: SQLite rolled the whole transaction back
        // (SQLITE_FULL, SQLITE_IOERR…), and the released writes with it.
        abort(batch, &e.to_string()).await;
    }
}

/// Ends the batch without committing: its released writes are lost, and told so.
async fn abort(batch: &mut Batch, why: &str) {
    if let Some(conn) = batch.conn.as_deref_mut().filter(|_| std::mem::take(&mut batch.open)) {
        let _ = conn.execute("ROLLBACK").await;
    }
    put_back(batch);
    for answer in batch.released.drain(..) {
        let _ = answer.send(Err(StoreError::Unavailable(format!("write batch rolled back: {why}"))));
    }
}

#[cfg(test)]
mod tests {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
    use sqlx::{Connection, Row};

    use super::*;

    async fn pools(dir: &std::path::Path) -> (SqlitePool, SqlitePool) {
        let options = SqliteConnectOptions::new()
            .filename(dir.join("gate.db"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full);
        let writer = SqlitePoolOptions::new().max_connections(1).connect_with(options.clone()).await.unwrap();
        sqlx::query("CREATE TABLE t (x INTEGER PRIMARY KEY)").execute(&writer).await.unwrap();
        let reader = SqlitePoolOptions::new().max_connections(2).connect_with(options).await.unwrap();
        (writer, reader)
    }

    async fn rows(reader: &SqlitePool) -> Vec<i64> {
        sqlx::query("SELECT x FROM t ORDER BY x")
            .fetch_all(reader)
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<i64, _>(0))
            .collect()
    }

    async fn queued_behind(gate: &WriteGate, writers: usize) {
        while gate.counts().waiting.load(Ordering::Relaxed) < writers {
            tokio::task::yield_now().await;
        }
    }

    async fn insert(tx: &mut WriteTx, x: i64) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO t (x) VALUES (?)").bind(x).execute(&mut **tx).await.map(drop)
    }

    /// Writes that queue behind an open one commit with it, in one COMMIT; one
    /// that fails inside the batch takes back its own rows and nobody else's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queued_writes_share_one_commit_and_a_failed_one_is_undone_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, reader) = pools(dir.path()).await;
        let gate = Arc::new(WriteGate::new(writer, false, Duration::from_secs(10)));

        let mut first = gate.begin().await.unwrap();
        insert(&mut first, 1).await.unwrap();
        let failing = tokio::spawn({
            let gate = gate.clone();
            async move {
                let mut tx = gate.begin().await.unwrap();
                insert(&mut tx, 2).await.unwrap();
                // the same key again: this write fails and is dropped uncommitted
                insert(&mut tx, 2).await.expect_err("duplicate key");
            }
        });
        let third = tokio::spawn({
            let gate = gate.clone();
            async move {
                let mut tx = gate.begin().await.unwrap();
                insert(&mut tx, 3).await.unwrap();
                tx.commit().await
            }
        });
        // Both queued behind the open write before it commits.
        queued_behind(&gate, 2).await;
        // Nothing of an uncommitted batch is visible to the other connections.
        assert_eq!(rows(&reader).await, Vec::<i64>::new());
        first.commit().await.expect("first write committed");
        failing.await.unwrap();
        third.await.unwrap().expect("third write committed");

        assert_eq!(rows(&reader).await, vec![1, 3], "the failed write's row is gone, the others stay");
        assert_eq!(gate.counts().writes.load(Ordering::Relaxed), 3);
        assert_eq!(gate.counts().commits.load(Ordering::Relaxed), 1, "one COMMIT for the three");

        // A lone write afterwards commits by itself.
        let mut tx = gate.begin().await.unwrap();
        insert(&mut tx, 4).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(rows(&reader).await, vec![1, 3, 4]);
        assert_eq!(gate.counts().commits.load(Ordering::Relaxed), 2);
    }

    /// A write abandoned halfway (its caller's future dropped) leaves nothing
    /// behind, and the gate goes on serving.
    #[tokio::test]
    async fn a_dropped_write_is_rolled_back() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, reader) = pools(dir.path()).await;
        let gate = WriteGate::new(writer, false, Duration::from_secs(10));
        let mut tx = gate.begin().await.unwrap();
        insert(&mut tx, 7).await.unwrap();
        drop(tx);
        let mut tx = gate.begin().await.unwrap();
        insert(&mut tx, 8).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(rows(&reader).await, vec![8]);
    }

    /// The write that opened a batch fails with others queued behind it: its rows
    /// go and theirs still commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_first_write_takes_back_only_itself() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, reader) = pools(dir.path()).await;
        let gate = Arc::new(WriteGate::new(writer, false, Duration::from_secs(10)));

        let mut first = gate.begin().await.unwrap();
        insert(&mut first, 1).await.unwrap();
        insert(&mut first, 1).await.expect_err("duplicate key");
        let queued = tokio::spawn({
            let gate = gate.clone();
            async move {
                let mut tx = gate.begin().await.unwrap();
                insert(&mut tx, 2).await.unwrap();
                tx.commit().await
            }
        });
        queued_behind(&gate, 1).await;
        drop(first);
        queued.await.unwrap().expect("queued write committed");
        assert_eq!(rows(&reader).await, vec![2]);

        // The same, with the first write released before a later one fails: the
        // released one stays.
        let mut first = gate.begin().await.unwrap();
        insert(&mut first, 3).await.unwrap();
        let failing = tokio::spawn({
            let gate = gate.clone();
            async move {
                let mut tx = gate.begin().await.unwrap();
                insert(&mut tx, 4).await.unwrap();
                insert(&mut tx, 3).await.expect_err("duplicate key");
            }
        });
        queued_behind(&gate, 1).await;
        first.commit().await.expect("first write committed");
        failing.await.unwrap();
        assert_eq!(rows(&reader).await, vec![2, 3]);
    }

    /// A writer waits at most the acquire timeout for the batch.
    #[tokio::test]
    async fn a_writer_stuck_behind_a_long_write_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let (writer, _reader) = pools(dir.path()).await;
        let gate = WriteGate::new(writer, false, Duration::from_millis(200));
        let held = gate.begin().await.unwrap();
        assert!(matches!(gate.begin().await, Err(sqlx::Error::PoolTimedOut)));
        held.commit().await.unwrap();
        let mut conn =
            sqlx::SqliteConnection::connect(&format!("sqlite://{}", dir.path().join("gate.db").display()))
                .await
                .unwrap();
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM t").fetch_one(&mut conn).await.unwrap();
        assert_eq!(n, 0);
    }
}
