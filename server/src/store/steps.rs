//! The write operations' step sequences, written once for both backends: COPY,
//! MOVE, EXPUNGE, mailbox create/delete/rename, account creation and the
//! conditional STORE, with their rules (INBOX, UID space, lock order, link before
//! unlink). Each runs over a [`StoreTx`], an open write transaction whose
//! primitives each backend implements with its own SQL; statements whose text both
//! dialects read alike (`$1` parameters) are defined here and run through
//! [`SharedSql`].

use std::future::Future;

use sqlx::{ColumnIndex, Database, Decode, Executor, FromRow, IntoArguments, Row, Type};

use super::common::{
    db_err, is_inbox, limit_column, normalize_email, normalize_flagset, normalize_mailbox_name, now_secs,
    parent_names, split_unchanged_since, u32_of, u64_of,
};
use super::{
    Account, ConditionalStore, FlagOp, FlagRow, FlagSet, Flags, ImportOutcome, ImportedAccount, Mailbox,
    SpecialUse, StoreError, StoreResult, UidSet,
};

/// A statement parameter of a statement both dialects share.
#[derive(Clone, Copy)]
pub(crate) enum Param<'a> {
    Int(i64),
    /// An integer or NULL.
    OptInt(Option<i64>),
    Text(&'a str),
    OptText(Option<&'a str>),
    Bytes(&'a [u8]),
    Bool(bool),
    /// A timestamp as PostgreSQL stores it (SQLite stores microseconds, `Int`).
    Time(chrono::DateTime<chrono::Utc>),
}

/// Binds a [`Param`]; one text for both databases, whose sqlx types differ.
pub(crate) trait BindParam: Database {
    fn bind_param<'q>(
        query: sqlx::query::Query<'q, Self, Self::Arguments>,
        param: Param<'_>,
    ) -> sqlx::query::Query<'q, Self, Self::Arguments>;
}

macro_rules! bind_param_for {
    ($($db:ty),*) => {$(
        impl BindParam for $db {
            fn bind_param<'q>(
                query: sqlx::query::Query<'q, Self, Self::Arguments>,
                param: Param<'_>,
            ) -> sqlx::query::Query<'q, Self, Self::Arguments> {
                match param {
                    Param::Int(v) => query.bind(v),
                    Param::OptInt(v) => query.bind(v),
                    Param::Text(v) => query.bind(v),
                    Param::OptText(v) => query.bind(v),
                    Param::Bytes(v) => query.bind(v),
                    Param::Bool(v) => query.bind(v),
                    Param::Time(v) => query.bind(v),
                }
            }
        }
    )*};
}

bind_param_for!(sqlx::Postgres, sqlx::Sqlite);

/// `sql` with `params` bound.
fn bound<DB: BindParam>(
    sql: &'static str,
    params: &[Param<'_>],
) -> sqlx::query::Query<'static, DB, DB::Arguments> {
    params.iter().fold(sqlx::query::<DB>(sql), |query, p| DB::bind_param(query, *p))
}

/// What the transactions of both backends do alike: run a statement of this
/// module (text both dialects read alike, `$1` parameters), and commit.
pub(crate) trait SharedSql: Send + Sized {
    fn commit(self) -> impl Future<Output = StoreResult<()>> + Send;
    /// The integer columns of the statement's first row, if any.
    fn fetch_ints(
        &mut self,
        sql: &'static str,
        params: &[Param<'_>],
    ) -> impl Future<Output = StoreResult<Option<Vec<i64>>>> + Send;
    /// The first column of the statement's first row, if any.
    fn fetch_int(
        &mut self,
        sql: &'static str,
        params: &[Param<'_>],
    ) -> impl Future<Output = StoreResult<Option<i64>>> + Send {
        async move { Ok(self.fetch_ints(sql, params).await?.and_then(|r| r.first().copied())) }
    }
    /// The first column of every row.
    fn fetch_ids(
        &mut self,
        sql: &'static str,
        params: &[Param<'_>],
    ) -> impl Future<Output = StoreResult<Vec<i64>>> + Send;
    fn run(
        &mut self,
        sql: &'static str,
        params: &[Param<'_>],
    ) -> impl Future<Output = StoreResult<()>> + Send {
        async move { self.execute(sql, params).await.map(drop).map_err(db_err) }
    }
    /// Rows changed, with the database's error for the caller to map.
    fn execute(
        &mut self,
        sql: &'static str,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;
}

/// An open write transaction of either backend: its connection and its COMMIT.
/// Whatever has both runs the shared statements ([`SharedSql`]).
pub(crate) trait OpenTx: Send + Sized {
    type Db: BindParam;
    fn conn(&mut self) -> &mut <Self::Db as Database>::Connection;
    fn commit_tx(self) -> impl Future<Output = StoreResult<()>> + Send;
}

impl<DB: BindParam> OpenTx for sqlx::Transaction<'_, DB> {
    type Db = DB;

    fn conn(&mut self) -> &mut DB::Connection {
        self
    }

    async fn commit_tx(self) -> StoreResult<()> {
        sqlx::Transaction::commit(self).await.map_err(db_err)
    }
}

impl<T> SharedSql for T
where
    T: OpenTx,
    for<'c> &'c mut <T::Db as Database>::Connection: Executor<'c, Database = T::Db>,
    <T::Db as Database>::Arguments: IntoArguments<T::Db>,
    i64: for<'r> Decode<'r, T::Db> + Type<T::Db>,
    <T::Db as Database>::QueryResult: RowsAffected,
    usize: ColumnIndex<<T::Db as Database>::Row>,
{
    async fn commit(self) -> StoreResult<()> {
        self.commit_tx().await
    }

    async fn fetch_ints(&mut self, sql: &'static str, params: &[Param<'_>]) -> StoreResult<Option<Vec<i64>>> {
        let Some(row) = bound(sql, params).fetch_optional(self.conn()).await.map_err(db_err)? else {
            return Ok(None);
        };
        (0..row.len()).map(|i| row.try_get(i).map_err(db_err)).collect::<StoreResult<_>>().map(Some)
    }

    async fn fetch_ids(&mut self, sql: &'static str, params: &[Param<'_>]) -> StoreResult<Vec<i64>> {
        let rows = bound(sql, params).fetch_all(self.conn()).await.map_err(db_err)?;
        rows.iter().map(|r| r.try_get(0).map_err(db_err)).collect()
    }

    async fn execute(&mut self, sql: &'static str, params: &[Param<'_>]) -> Result<u64, sqlx::Error> {
        execute_on(self.conn(), sql, params).await
    }
}

/// The rows `sql` returns, on a connection of either backend.
pub(crate) async fn fetch_all<'c, DB, E>(
    conn: E,
    sql: &'static str,
    params: &[Param<'_>],
) -> StoreResult<Vec<DB::Row>>
where
    DB: BindParam,
    E: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
{
    bound(sql, params).fetch_all(conn).await.map_err(db_err)
}

/// Runs `sql` on a connection of either backend: the rows it changed.
pub(crate) async fn execute_on<'c, DB, E>(
    conn: E,
    sql: &'static str,
    params: &[Param<'_>],
) -> Result<u64, sqlx::Error>
where
    DB: BindParam,
    E: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    DB::QueryResult: RowsAffected,
{
    Ok(bound(sql, params).execute(conn).await?.rows())
}

/// The rows a statement changed, as both backends' results tell it.
pub(crate) trait RowsAffected {
    fn rows(&self) -> u64;
}

impl RowsAffected for sqlx::postgres::PgQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

impl RowsAffected for sqlx::sqlite::SqliteQueryResult {
    fn rows(&self) -> u64 {
        self.rows_affected()
    }
}

/// The columns of a row of either backend, by name and stored type.
pub(crate) trait Cols {
    fn int(&self, name: &str) -> StoreResult<i64>;
    fn opt_int(&self, name: &str) -> StoreResult<Option<i64>>;
    fn int32(&self, name: &str) -> StoreResult<i32>;
    fn text(&self, name: &str) -> StoreResult<String>;
    fn opt_text(&self, name: &str) -> StoreResult<Option<String>>;
    fn blob(&self, name: &str) -> StoreResult<Vec<u8>>;
    fn boolean(&self, name: &str) -> StoreResult<bool>;
}

impl<R> Cols for R
where
    R: Row,
    for<'n> &'n str: ColumnIndex<R>,
    i64: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    i32: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    String: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    Vec<u8>: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    bool: for<'r> Decode<'r, R::Database> + Type<R::Database>,
{
    fn int(&self, name: &str) -> StoreResult<i64> {
        self.try_get(name).map_err(db_err)
    }
    fn opt_int(&self, name: &str) -> StoreResult<Option<i64>> {
        self.try_get(name).map_err(db_err)
    }
    fn int32(&self, name: &str) -> StoreResult<i32> {
        self.try_get(name).map_err(db_err)
    }
    fn text(&self, name: &str) -> StoreResult<String> {
        self.try_get(name).map_err(db_err)
    }
    fn opt_text(&self, name: &str) -> StoreResult<Option<String>> {
        self.try_get(name).map_err(db_err)
    }
    fn blob(&self, name: &str) -> StoreResult<Vec<u8>> {
        self.try_get(name).map_err(db_err)
    }
    fn boolean(&self, name: &str) -> StoreResult<bool> {
        self.try_get(name).map_err(db_err)
    }
}

/// The columns [`mailbox_from_row`] reads.
pub(crate) const MAILBOX_COLS: &str =
    "id, account_id, name, uid_validity, uid_next, highest_modseq, special_use, recent_floor";
pub(crate) const MAILBOX_BY_NAME: &str = "SELECT id, account_id, name, uid_validity, uid_next, highest_modseq, \
     special_use, recent_floor FROM mailboxes WHERE account_id = $1 AND name = $2";
pub(crate) const MAILBOX_BY_ID: &str = "SELECT id, account_id, name, uid_validity, uid_next, highest_modseq, \
     special_use, recent_floor FROM mailboxes WHERE id = $1";

pub(crate) fn mailbox_from_row(r: &impl Cols) -> StoreResult<Mailbox> {
    Ok(Mailbox {
        id: r.int("id")?,
        account_id: r.int("account_id")?,
        name: r.text("name")?,
        uid_validity: u32_of(r.int("uid_validity")?, "uid_validity")?,
        uid_next: u32_of(r.int("uid_next")?, "uid_next")?,
        highest_modseq: u64_of(r.int("highest_modseq")?),
        special_use: r.opt_text("special_use")?.as_deref().and_then(SpecialUse::parse),
        recent_floor: u32_of(r.int("recent_floor")?, "recent_floor")?,
    })
}

/// A `(uid, flags, keywords, modseq)` row. Flags are read as `i32`: PostgreSQL
/// stores them as INTEGER, and SQLite hands any integer out as one.
pub(crate) fn flag_row(r: &impl Cols) -> StoreResult<FlagRow> {
    Ok(FlagRow {
        uid: u32_of(r.int("uid")?, "uid")?,
        flags: super::common::flagset_from_row(i64::from(r.int32("flags")?), &r.text("keywords")?),
        modseq: u64_of(r.int("modseq")?),
    })
}

/// A STORE: `op` with `flags` (normalised) on the messages `uids`.
pub(crate) struct FlagChange<'a> {
    pub uids: &'a UidSet,
    pub op: FlagOp,
    pub flags: FlagSet,
}

impl<'a> FlagChange<'a> {
    /// Rejects keywords the store cannot keep (see [`normalize_flagset`]).
    pub fn new(uids: &'a UidSet, op: FlagOp, flags: &FlagSet) -> StoreResult<Self> {
        Ok(FlagChange { uids, op, flags: normalize_flagset(flags)? })
    }
}

/// A mailbox to insert.
pub(crate) struct NewMailbox<'a> {
    pub account_id: i64,
    pub name: &'a str,
    pub uid_validity: i64,
    pub special_use: Option<SpecialUse>,
}

/// The mailboxes a RENAME moves: `name` and, with `children`, those under it.
pub(crate) struct RenameFrom<'a> {
    pub account_id: i64,
    pub name: &'a str,
    pub children: bool,
}

/// An account to insert; its password already hashed.
pub(crate) struct NewAccount<'a> {
    pub email: &'a str,
    pub domain_id: i64,
    pub password_hash: &'a str,
}

/// A source row of COPY/MOVE/EXPUNGE; `D` is the backend's stored form of
/// INTERNALDATE.
#[derive(FromRow)]
pub(crate) struct LinkRow<D> {
    pub uid: i64,
    pub message_id: i64,
    pub flags: i32,
    pub keywords: String,
    pub internal_date: D,
    /// The message's octets, for the mailboxes' `bytes` counters.
    pub size: i64,
}

/// The columns of a [`LinkRow`].
pub(crate) const LINK_COLS: &str = "uid, message_id, flags, keywords, internal_date, size";

const SEEN: i32 = Flags::SEEN.0 as i32;

/// Counts `n` more messages (`unseen` of them unseen, `bytes` octets) in the
/// mailbox and takes `n` UIDs and a modseq for them: the first UID and the modseq.
pub(crate) const ADD_COUNTS: &str = "UPDATE mailboxes SET uid_next = uid_next + $1, highest_modseq = highest_modseq + 1, \
     messages = messages + $1, unseen = unseen + $2, bytes = bytes + $4 WHERE id = $3 \
     RETURNING uid_next - $1 AS first_uid, highest_modseq";
/// The reverse for removed messages, with a new modseq for their tombstones.
const REMOVE_COUNTS: &str = "UPDATE mailboxes SET highest_modseq = highest_modseq + 1, messages = messages - $2, \
     unseen = unseen - $3, bytes = bytes - $4 WHERE id = $1 RETURNING highest_modseq";
/// Counts the mailbox empty, with a new modseq for the tombstones.
const EMPTY_COUNTS: &str = "UPDATE mailboxes SET highest_modseq = highest_modseq + 1, messages = 0, unseen = 0, \
     bytes = 0 WHERE id = $1 RETURNING highest_modseq";
/// A new mailbox `$1` (UIDVALIDITY `$2`) continuing mailbox `$3`'s UIDs, modseqs
/// and counters: where a renamed INBOX's messages go.
const CLONE_MAILBOX: &str = "INSERT INTO mailboxes (account_id, name, uid_validity, uid_next, highest_modseq, \
     messages, unseen, bytes) SELECT account_id, $1, $2, uid_next, highest_modseq, messages, unseen, bytes \
     FROM mailboxes WHERE id = $3 RETURNING id";
const MOVE_ALL_LINKS: &str = "UPDATE mailbox_messages SET mailbox_id = $1 WHERE mailbox_id = $2";
const MAILBOX_ID: &str = "SELECT id FROM mailboxes WHERE account_id = $1 AND name = $2";
const LINKED_BODIES: &str = "SELECT DISTINCT message_id FROM mailbox_messages WHERE mailbox_id = $1";
const DELETE_MAILBOX: &str = "DELETE FROM mailboxes WHERE id = $1";
/// Subscribes account `$1` to `$3` when it is subscribed to `$2`.
const MOVE_SUBSCRIPTION: &str = "INSERT INTO subscriptions (account_id, name) SELECT account_id, $3 \
     FROM subscriptions WHERE account_id = $1 AND name = $2 ON CONFLICT DO NOTHING";
const DROP_SUBSCRIPTION: &str = "DELETE FROM subscriptions WHERE account_id = $1 AND name = $2";

/// An open write transaction of one backend: the primitives the steps are made of.
/// Dropping it without [`StoreTx::commit`] rolls it back.
pub(crate) trait StoreTx: SharedSql {
    /// Adds `$2` to account `$1`'s last UIDVALIDITY (at least up to `$3`, now in
    /// seconds): the new last, no row when there is no such account.
    const BUMP_UID_VALIDITY: &'static str;
    /// A missing superior mailbox `$2` (UIDVALIDITY `$3`) of a created or renamed
    /// one in account `$1`.
    const INSERT_PARENT: &'static str;
    /// Serialises renames and creations in account `$1`, where the transaction
    /// alone does not: no row when it does not exist.
    const LOCK_ACCOUNT: Option<&'static str>;
    /// The id of domain `$1`, which a new account joins, held against deletion.
    const ACCOUNT_DOMAIN: &'static str;

    /// The stored form of INTERNALDATE.
    type Date: Send + Sync;

    /// Takes the write locks of the given mailboxes (ascending, unique ids) and
    /// returns those that exist.
    fn lock_mailboxes(&mut self, ids: &[i64]) -> impl Future<Output = StoreResult<Vec<i64>>> + Send;
    /// The links of the given UIDs, ascending.
    fn links_in(
        &mut self,
        mailbox_id: i64,
        uids: &UidSet,
    ) -> impl Future<Output = StoreResult<Vec<LinkRow<Self::Date>>>> + Send;
    /// Writes `links` into the mailbox as UIDs `first_uid`… in order, stamped `modseq`.
    fn insert_links(
        &mut self,
        mailbox_id: i64,
        first_uid: i64,
        modseq: i64,
        links: &[LinkRow<Self::Date>],
    ) -> impl Future<Output = StoreResult<()>> + Send;
    /// Deletes the links of `uids`, leaving tombstones stamped `modseq`.
    fn delete_links(
        &mut self,
        mailbox_id: i64,
        uids: &[i64],
        modseq: i64,
    ) -> impl Future<Output = StoreResult<()>> + Send;
    /// Tombstones, stamped `modseq`, for every link of the mailbox.
    fn tombstone_all(&mut self, mailbox_id: i64, modseq: i64)
    -> impl Future<Output = StoreResult<()>> + Send;
    /// Removes those of the given bodies (ascending, unique ids) that no mailbox
    /// links any more.
    fn delete_orphans(&mut self, message_ids: &[i64]) -> impl Future<Output = StoreResult<()>> + Send;
    /// The mailbox of that name, write-locked when `lock`.
    fn mailbox_in(
        &mut self,
        account_id: i64,
        name: &str,
        lock: bool,
    ) -> impl Future<Output = StoreResult<Option<Mailbox>>> + Send;
    fn insert_mailbox(&mut self, new: NewMailbox<'_>) -> impl Future<Output = StoreResult<Mailbox>> + Send;
    /// `(id, name)` of the mailboxes `from` names, ascending by id and
    /// write-locked.
    fn rename_sources(
        &mut self,
        from: RenameFrom<'_>,
    ) -> impl Future<Output = StoreResult<Vec<(i64, String)>>> + Send;
    /// Renames mailboxes `ids` to `names`, with UIDVALIDITY `first`… in order.
    fn rename_mailboxes(
        &mut self,
        ids: &[i64],
        names: &[String],
        first: i64,
        to: &str,
    ) -> impl Future<Output = StoreResult<()>> + Send;
    /// Inserts the account: its id and creation time.
    fn insert_account(
        &mut self,
        new: NewAccount<'_>,
    ) -> impl Future<Output = StoreResult<(i64, chrono::DateTime<chrono::Utc>)>> + Send;
    /// Inserts the mailboxes of one account, subscribed.
    fn insert_default_mailboxes(
        &mut self,
        mailboxes: &[NewMailbox<'_>],
    ) -> impl Future<Output = StoreResult<()>> + Send;
    /// `(uid, modseq)` of the given UIDs.
    fn modseqs_in(
        &mut self,
        mailbox_id: i64,
        uids: &UidSet,
    ) -> impl Future<Output = StoreResult<Vec<(i64, i64)>>> + Send;
    /// A flag change in this transaction (see [`super::Messages::store_flags`]).
    fn store_flags(
        &mut self,
        mailbox_id: i64,
        change: FlagChange<'_>,
    ) -> impl Future<Output = StoreResult<Vec<FlagRow>>> + Send;
}

/// Locks the mailboxes in ascending id order; NotFound if one is missing.
pub(crate) async fn lock_mailboxes<T: StoreTx>(tx: &mut T, ids: &[i64]) -> StoreResult<()> {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    let found = tx.lock_mailboxes(&ids).await?;
    if let Some(missing) = ids.iter().find(|id| !found.contains(id)) {
        return Err(StoreError::NotFound(format!("mailbox {missing}")));
    }
    Ok(())
}

/// Links of how many messages are unseen, and their octets.
fn tally<D>(links: &[LinkRow<D>]) -> (i64, i64) {
    let unseen = links.iter().filter(|l| l.flags & SEEN == 0).count() as i64;
    (unseen, links.iter().map(|l| l.size).sum())
}

/// Links copies of `links` into `dest` with fresh UIDs, keeping flags and dates:
/// (source uid, new uid) pairs.
async fn add_links<T: StoreTx>(
    tx: &mut T,
    dest: i64,
    links: &[LinkRow<T::Date>],
) -> StoreResult<Vec<(u32, u32)>> {
    let n = links.len() as i64;
    let (unseen, bytes) = tally(links);
    let params = [Param::Int(n), Param::Int(unseen), Param::Int(dest), Param::Int(bytes)];
    let Some(&[first, modseq]) = tx.fetch_ints(ADD_COUNTS, &params).await?.as_deref() else {
        return Err(StoreError::NotFound(format!("mailbox {dest}")));
    };
    if !super::common::uids_fit(first, n) {
        return Err(StoreError::Invalid(format!("mailbox {dest} has run out of UIDs")));
    }
    tx.insert_links(dest, first, modseq, links).await?;
    links.iter().zip(first..).map(|(l, u)| Ok((u32_of(l.uid, "uid")?, u32_of(u, "uid")?))).collect()
}

/// Deletes the links, leaves tombstones, fixes the counters and removes bodies no
/// longer linked. `links` belong to `mailbox_id`.
pub(crate) async fn remove_links<T: StoreTx>(
    tx: &mut T,
    mailbox_id: i64,
    links: &[LinkRow<T::Date>],
) -> StoreResult<i64> {
    let (unseen, bytes) = tally(links);
    let params =
        [Param::Int(mailbox_id), Param::Int(links.len() as i64), Param::Int(unseen), Param::Int(bytes)];
    let Some(&[modseq]) = tx.fetch_ints(REMOVE_COUNTS, &params).await?.as_deref() else {
        return Err(StoreError::NotFound(format!("mailbox {mailbox_id}")));
    };
    let uids: Vec<i64> = links.iter().map(|l| l.uid).collect();
    tx.delete_links(mailbox_id, &uids, modseq).await?;
    let mut ids: Vec<i64> = links.iter().map(|l| l.message_id).collect();
    ids.sort_unstable();
    ids.dedup();
    tx.delete_orphans(&ids).await?;
    Ok(modseq)
}

/// COPY (`remove` false) or MOVE. Into the same mailbox too (RFC 6851 §3.3): the
/// links get new UIDs and, for MOVE, the old ones are expunged — in one
/// transaction, never a copy left behind.
pub(crate) async fn copy_or_move<T: StoreTx>(
    begin: impl Future<Output = StoreResult<T>>,
    src: i64,
    uids: &UidSet,
    dest: i64,
    remove: bool,
) -> StoreResult<Vec<(u32, u32)>> {
    let mut tx = begin.await?;
    lock_mailboxes(&mut tx, &[src, dest]).await?;
    let links = tx.links_in(src, uids).await?;
    if links.is_empty() {
        return Ok(Vec::new());
    }
    // Link first, unlink second: a body is never without a link in between
    // (which would delete it).
    let pairs = add_links(&mut tx, dest, &links).await?;
    if remove {
        remove_links(&mut tx, src, &links).await?;
    }
    tx.commit().await?;
    Ok(pairs)
}

/// Hands out `n` fresh UIDVALIDITY values for the account's mailboxes; the first,
/// or `None` when the account does not exist.
async fn alloc_uid_validity<T: StoreTx>(tx: &mut T, account_id: i64, n: i64) -> StoreResult<Option<i64>> {
    let params = [Param::Int(account_id), Param::Int(n), Param::Int(now_secs())];
    match tx.fetch_int(T::BUMP_UID_VALIDITY, &params).await? {
        Some(last) if last + 1 - n > 0 && last <= i64::from(u32::MAX) => Ok(Some(last + 1 - n)),
        Some(_) => Err(StoreError::Internal("UIDVALIDITY space exhausted".into())),
        None => Ok(None),
    }
}

/// One UIDVALIDITY for a mailbox of an account that must exist.
async fn one_uid_validity<T: StoreTx>(tx: &mut T, account_id: i64) -> StoreResult<i64> {
    alloc_uid_validity(tx, account_id, 1)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("account {account_id}")))
}

/// Creates the missing superior names of `name` (RFC 3501 CREATE/RENAME).
async fn create_parents<T: StoreTx>(tx: &mut T, account_id: i64, name: &str) -> StoreResult<()> {
    for parent in parent_names(name) {
        let params = [Param::Int(account_id), Param::Text(&parent)];
        if tx.fetch_ints(MAILBOX_ID, &params).await?.is_none() {
            let uv = one_uid_validity(tx, account_id).await?;
            tx.run(T::INSERT_PARENT, &[Param::Int(account_id), Param::Text(&parent), Param::Int(uv)]).await?;
        }
    }
    Ok(())
}

/// See [`super::Mailboxes::mailbox_create`].
pub(crate) async fn mailbox_create<T: StoreTx>(
    begin: impl Future<Output = StoreResult<T>>,
    account_id: i64,
    name: &str,
    special_use: Option<SpecialUse>,
) -> StoreResult<Mailbox> {
    let name = normalize_mailbox_name(name)?;
    if is_inbox(&name) {
        return Err(StoreError::AlreadyExists("INBOX".into()));
    }
    let mut tx = begin.await?;
    // the account row update also serialises mailbox creation per account
    let uv = one_uid_validity(&mut tx, account_id).await?;
    if tx.mailbox_in(account_id, &name, false).await?.is_some() {
        return Err(StoreError::AlreadyExists(format!("mailbox {name}")));
    }
    create_parents(&mut tx, account_id, &name).await?;
    let new = NewMailbox { account_id, name: &name, uid_validity: uv, special_use };
    let mailbox = tx.insert_mailbox(new).await?;
    tx.commit().await?;
    Ok(mailbox)
}

/// See [`super::Mailboxes::mailbox_delete`].
pub(crate) async fn mailbox_delete<T: StoreTx>(
    begin: impl Future<Output = StoreResult<T>>,
    account_id: i64,
    name: &str,
) -> StoreResult<()> {
    let name = normalize_mailbox_name(name)?;
    if is_inbox(&name) {
        return Err(StoreError::Invalid("INBOX cannot be deleted".into()));
    }
    let mut tx = begin.await?;
    let mb = tx
        .mailbox_in(account_id, &name, true)
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("mailbox {name}")))?;
    let bodies = tx.fetch_ids(LINKED_BODIES, &[Param::Int(mb.id)]).await?;
    tx.run(DELETE_MAILBOX, &[Param::Int(mb.id)]).await?;
    tx.delete_orphans(&bodies).await?;
    tx.commit().await
}

/// See [`super::Mailboxes::mailbox_rename`].
pub(crate) async fn mailbox_rename<T: StoreTx>(
    begin: impl Future<Output = StoreResult<T>>,
    account_id: i64,
    from: &str,
    to: &str,
) -> StoreResult<()> {
    let from = normalize_mailbox_name(from)?;
    let to = normalize_mailbox_name(to)?;
    if is_inbox(&to) {
        return Err(StoreError::AlreadyExists("INBOX".into()));
    }
    // INBOX is the one mailbox whose children do not move with it, so
    // `INBOX` → `INBOX/old` is fine.
    if !is_inbox(&from) && to.starts_with(&format!("{from}/")) {
        return Err(StoreError::Invalid(format!("cannot rename {from} into its own child {to}")));
    }
    let mut tx = begin.await?;
    let locked = match T::LOCK_ACCOUNT {
        Some(sql) => tx.fetch_int(sql, &[Param::Int(account_id)]).await?.is_some(),
        // an unknown account has no mailbox to rename
        None => true,
    };
    if !locked {
        return Err(StoreError::NotFound(format!("account {account_id}")));
    }
    let sources =
        tx.rename_sources(RenameFrom { account_id, name: &from, children: !is_inbox(&from) }).await?;
    let Some(&(first_id, _)) = sources.first() else {
        return Err(StoreError::NotFound(format!("mailbox {from}")));
    };
    if tx.mailbox_in(account_id, &to, false).await?.is_some() {
        return Err(StoreError::AlreadyExists(format!("mailbox {to}")));
    }
    create_parents(&mut tx, account_id, &to).await?;
    if is_inbox(&from) {
        // RFC 3501 §6.3.5: the messages move to a new mailbox, INBOX stays (empty)
        let inbox = first_id;
        let uv = one_uid_validity(&mut tx, account_id).await?;
        let params = [Param::Text(&to), Param::Int(uv), Param::Int(inbox)];
        let Some(&[new_id]) = tx.fetch_ints(CLONE_MAILBOX, &params).await?.as_deref() else {
            return Err(StoreError::NotFound(format!("mailbox {from}")));
        };
        let Some(&[modseq]) = tx.fetch_ints(EMPTY_COUNTS, &[Param::Int(inbox)]).await?.as_deref() else {
            return Err(StoreError::NotFound(format!("mailbox {from}")));
        };
        tx.tombstone_all(inbox, modseq).await?;
        tx.run(MOVE_ALL_LINKS, &[Param::Int(new_id), Param::Int(inbox)]).await?;
    } else {
        let n = sources.len() as i64;
        let first = alloc_uid_validity(&mut tx, account_id, n)
            .await?
            .ok_or_else(|| StoreError::NotFound(format!("account {account_id}")))?;
        let ids: Vec<i64> = sources.iter().map(|s| s.0).collect();
        let names: Vec<String> =
            sources.iter().map(|(_, name)| format!("{to}{}", &name[from.len()..])).collect();
        tx.rename_mailboxes(&ids, &names, first, &to).await?;
        // A subscribed folder stays subscribed under its new name, as in Cyrus
        // and Dovecot: clients that list subscribed folders only (Thunderbird's
        // default) would otherwise lose it from view. A subscription to the new
        // name that already existed (subscriptions may name mailboxes that do
        // not exist, RFC 9051 §6.3.7) is kept once.
        for ((_, old), new) in sources.iter().zip(&names) {
            let params = [Param::Int(account_id), Param::Text(old), Param::Text(new)];
            tx.run(MOVE_SUBSCRIPTION, &params).await?;
            tx.run(DROP_SUBSCRIPTION, &params[..2]).await?;
        }
    }
    tx.commit().await
}

/// See [`super::Directory::account_create`].
pub(crate) async fn account_create<T: StoreTx>(
    begin: impl Future<Output = StoreResult<T>>,
    email: &str,
    password_hash: &str,
) -> StoreResult<Account> {
    let (email, domain) = normalize_email(email)?;
    let mut tx = begin.await?;
    let domain_id = tx
        .fetch_int(T::ACCOUNT_DOMAIN, &[Param::Text(&domain)])
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("domain {domain}")))?;
    let (id, created_at) = create_in(&mut tx, &email, domain_id, password_hash).await?;
    tx.commit().await?;
    Ok(Account {
        id,
        email,
        domain,
        password_hash: password_hash.to_string(),
        created_at,
        enabled: true,
        display_name: None,
    })
}

/// The account row and its default mailboxes, in `tx`: its id and creation time.
async fn create_in<T: StoreTx>(
    tx: &mut T,
    email: &str,
    domain_id: i64,
    password_hash: &str,
) -> StoreResult<(i64, chrono::DateTime<chrono::Utc>)> {
    let (id, created_at) = tx.insert_account(NewAccount { email, domain_id, password_hash }).await?;
    let defaults: Vec<(&str, Option<SpecialUse>)> = std::iter::once(("INBOX", None))
        .chain(SpecialUse::ALL.into_iter().map(|u| (u.default_name(), Some(u))))
        .collect();
    let first = alloc_uid_validity(tx, id, defaults.len() as i64)
        .await?
        .ok_or_else(|| StoreError::Internal("account vanished".into()))?;
    let mailboxes: Vec<NewMailbox<'_>> = defaults
        .into_iter()
        .zip(first..)
        .map(|((name, special_use), uid_validity)| NewMailbox {
            account_id: id,
            name,
            uid_validity,
            special_use,
        })
        .collect();
    tx.insert_default_mailboxes(&mailboxes).await?;
    Ok((id, created_at))
}

/// See [`super::Directory::accounts_import`]: one transaction for the batch.
pub(crate) async fn accounts_import<T: StoreTx>(
    begin: impl Future<Output = StoreResult<T>>,
    batch: &[ImportedAccount],
) -> StoreResult<ImportOutcome> {
    let mut tx = begin.await?;
    let mut domains: std::collections::HashMap<String, i64> = std::collections::HashMap::new();
    let mut outcome = ImportOutcome::default();
    for a in batch {
        let (email, domain) = normalize_email(&a.email)?;
        let domain_id = domain_id_in(&mut tx, &mut domains, &domain).await?;
        if tx.fetch_int("SELECT id FROM accounts WHERE email = $1", &[Param::Text(&email)]).await?.is_some() {
            outcome.existing.push(email);
            continue;
        }
        let (id, _) = create_in(&mut tx, &email, domain_id, &a.password_hash).await?;
        if a.quota.is_some() {
            let params = [Param::OptInt(limit_column(a.quota)), Param::Int(id)];
            tx.run("UPDATE accounts SET quota_bytes = $1 WHERE id = $2", &params).await?;
        }
        for alias in &a.aliases {
            let (address, alias_domain) = normalize_email(alias)?;
            let alias_domain_id = domain_id_in(&mut tx, &mut domains, &alias_domain).await?;
            let sql =
                "INSERT INTO aliases (domain_id, address, target) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";
            tx.run(sql, &[Param::Int(alias_domain_id), Param::Text(&address), Param::Text(&email)]).await?;
        }
        outcome.created += 1;
    }
    tx.commit().await?;
    Ok(outcome)
}

/// The id of a served domain, looked up once per batch.
async fn domain_id_in<T: StoreTx>(
    tx: &mut T,
    known: &mut std::collections::HashMap<String, i64>,
    domain: &str,
) -> StoreResult<i64> {
    if let Some(id) = known.get(domain) {
        return Ok(*id);
    }
    let id = tx
        .fetch_int(T::ACCOUNT_DOMAIN, &[Param::Text(domain)])
        .await?
        .ok_or_else(|| StoreError::NotFound(format!("domain {domain}")))?;
    known.insert(domain.to_string(), id);
    Ok(id)
}

/// See [`super::Messages::store_flags_unchanged_since`]: the test and the change
/// under the mailbox's write lock, which every flag change takes first, so no
/// change lands between them. Committed only when rows changed.
pub(crate) async fn store_flags_unchanged_since<T: StoreTx>(
    begin: impl Future<Output = StoreResult<T>>,
    mailbox_id: i64,
    uids: &UidSet,
    (op, flags): (FlagOp, &FlagSet),
    unchanged_since: u64,
) -> StoreResult<ConditionalStore> {
    let mut tx = begin.await?;
    lock_mailboxes(&mut tx, &[mailbox_id]).await?;
    let rows = tx.modseqs_in(mailbox_id, uids).await?;
    let (passed, modified) = split_unchanged_since(rows, unchanged_since)?;
    let changed = if passed.is_empty() {
        Vec::new()
    } else {
        tx.store_flags(mailbox_id, FlagChange::new(&UidSet::from_uids(&passed), op, flags)?).await?
    };
    if !changed.is_empty() {
        tx.commit().await?;
    }
    Ok(ConditionalStore { changed, modified })
}
