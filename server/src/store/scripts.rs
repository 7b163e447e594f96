//! [`Scripts`] of both SQL backends: the Sieve scripts of an account and what
//! their vacation and duplicate tests remember.

use async_trait::async_trait;
use chrono::Utc;
use sha2::{Digest, Sha256};

use super::common::{db_err, is_unique_violation, u64_of};
use super::sql::Backend;
use super::steps::{Cols, Param, SharedSql};
use super::{ActiveScript, Scripts, SieveEntry, SieveQuota, StoreError, StoreResult};

/// The longest script name, in characters: RFC 5804 §1.6 has servers take at
/// least 128, and nothing is gained by taking more.
pub const MAX_SIEVE_NAME_CHARS: usize = 128;

/// What [`SEEN`] remembers, in its `kind` column.
const KIND_VACATION: i64 = 1;
const KIND_DUPLICATE: i64 = 2;

/// Records `key` as seen at `$4` until `$5`, unless it was seen after `$6`:
/// one row changed when it was not (so it is recorded now), none when it was.
/// Concurrent callers meet on the primary key, and the loser's update sees
/// the winner's row.
const SEEN: &str = "INSERT INTO sieve_seen (account_id, kind, key, seen_at, expires_at) \
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (account_id, kind, key) \
     DO UPDATE SET seen_at = excluded.seen_at, expires_at = excluded.expires_at \
     WHERE sieve_seen.seen_at <= $6";

/// Why `name` cannot name a Sieve script (RFC 5804 §1.6: no control
/// characters, no line or paragraph separators; here at most
/// [`MAX_SIEVE_NAME_CHARS`] characters and not empty), or `None` when it can.
pub fn sieve_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("a script name must not be empty");
    }
    if name.chars().count() > MAX_SIEVE_NAME_CHARS {
        return Some("a script name must be at most 128 characters");
    }
    if name.chars().any(|c| c.is_control() || c == '\u{2028}' || c == '\u{2029}') {
        return Some("a script name must not contain control characters");
    }
    None
}

fn checked_name(name: &str) -> StoreResult<&str> {
    match sieve_name_problem(name) {
        Some(why) => Err(StoreError::Invalid(why.into())),
        None => Ok(name),
    }
}

/// The seen-key of parts that may hold any octet but NUL-free text: a hash,
/// so that a long handle or id costs no more than a short one.
fn seen_key(parts: &[&str]) -> Vec<u8> {
    let mut h = Sha256::new();
    for part in parts {
        h.update(part.as_bytes());
        h.update([0]);
    }
    h.finalize().to_vec()
}

async fn seen<B: Backend>(
    store: &B,
    account_id: i64,
    kind: i64,
    key: &[u8],
    period_secs: u64,
) -> StoreResult<bool> {
    let now = Utc::now();
    let period = chrono::Duration::seconds(i64::try_from(period_secs).unwrap_or(i64::MAX / 2_000_000));
    let (since, until) = (now - period, now + period);
    let params = [
        Param::Int(account_id),
        Param::Int(kind),
        Param::Bytes(key),
        B::time(now),
        B::time(until),
        B::time(since),
    ];
    match store.execute(SEEN, &params).await {
        Ok(n) => Ok(n == 0),
        Err(e) if matches!(&e, sqlx::Error::Database(d) if d.is_foreign_key_violation()) => {
            Err(StoreError::NotFound(format!("account {account_id}")))
        }
        Err(e) => Err(db_err(e)),
    }
}

/// Opens a write transaction holding the account's Sieve lock; `NotFound`
/// for an unknown account.
async fn locked<B: Backend>(store: &B, account_id: i64) -> StoreResult<B::Tx> {
    let mut tx = store.begin().await?;
    match tx.fetch_int(B::ACCOUNT_SIEVE_LOCK, &[Param::Int(account_id)]).await? {
        Some(_) => Ok(tx),
        None => Err(StoreError::NotFound(format!("account {account_id}"))),
    }
}

const EXISTS: &str = "SELECT CAST(1 AS BIGINT) FROM sieve_scripts WHERE account_id = $1 AND name = $2";

#[async_trait]
impl<B: Backend> Scripts for B {
    async fn sieve_put(
        &self,
        account_id: i64,
        name: &str,
        source: &[u8],
        quota: SieveQuota,
    ) -> StoreResult<()> {
        let name = checked_name(name)?;
        if source.len() > quota.max_bytes {
            return Err(StoreError::OverQuota(format!(
                "a script of {} octets is over the limit of {}",
                source.len(),
                quota.max_bytes
            )));
        }
        // Counting and inserting under the account's lock: two new scripts
        // arriving at once cannot both take the last place.
        let mut tx = locked(self, account_id).await?;
        if tx.fetch_int(EXISTS, &[Param::Int(account_id), Param::Text(name)]).await?.is_none() {
            let count = "SELECT count(*) FROM sieve_scripts WHERE account_id = $1";
            let n = tx.fetch_int(count, &[Param::Int(account_id)]).await?.unwrap_or(0);
            if u64_of(n) >= quota.max_scripts as u64 {
                return Err(StoreError::OverQuota(format!(
                    "the account has {n} scripts, the most it may have"
                )));
            }
        }
        let size = i64::try_from(source.len()).unwrap_or(i64::MAX);
        let digest: [u8; 32] = Sha256::digest(source).into();
        let sql = "INSERT INTO sieve_scripts (account_id, name, source, size, active, digest) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (account_id, name) \
             DO UPDATE SET source = excluded.source, size = excluded.size, digest = excluded.digest";
        let params = [
            Param::Int(account_id),
            Param::Text(name),
            Param::Bytes(source),
            Param::Int(size),
            Param::Bool(false),
            Param::Bytes(&digest),
        ];
        tx.run(sql, &params).await?;
        tx.commit().await
    }

    async fn sieve_list(&self, account_id: i64) -> StoreResult<Vec<SieveEntry>> {
        let sql = "SELECT name, active, size FROM sieve_scripts WHERE account_id = $1 ORDER BY name";
        let rows = self.fetch(false, sql, &[Param::Int(account_id)]).await?;
        rows.iter()
            .map(|r| {
                Ok(SieveEntry {
                    name: r.text("name")?,
                    active: r.boolean("active")?,
                    size: u64_of(r.int("size")?),
                })
            })
            .collect()
    }

    async fn sieve_get(&self, account_id: i64, name: &str) -> StoreResult<Option<Vec<u8>>> {
        let sql = "SELECT source FROM sieve_scripts WHERE account_id = $1 AND name = $2";
        let rows = self.fetch(false, sql, &[Param::Int(account_id), Param::Text(name)]).await?;
        rows.first().map(|r| r.blob("source")).transpose()
    }

    async fn sieve_delete(&self, account_id: i64, name: &str) -> StoreResult<()> {
        let name = checked_name(name)?;
        let sql = "DELETE FROM sieve_scripts WHERE account_id = $1 AND name = $2 AND active = $3";
        let params = [Param::Int(account_id), Param::Text(name), Param::Bool(false)];
        if self.execute(sql, &params).await.map_err(db_err)? > 0 {
            return Ok(());
        }
        match self.fetch(true, EXISTS, &params[..2]).await?.is_empty() {
            true => Err(StoreError::NotFound(format!("script {name}"))),
            false => Err(StoreError::Invalid(format!("script {name} is active"))),
        }
    }

    async fn sieve_rename(&self, account_id: i64, from: &str, to: &str) -> StoreResult<()> {
        let (from, to) = (checked_name(from)?, checked_name(to)?);
        let mut tx = locked(self, account_id).await?;
        if tx.fetch_int(EXISTS, &[Param::Int(account_id), Param::Text(from)]).await?.is_none() {
            return Err(StoreError::NotFound(format!("script {from}")));
        }
        if tx.fetch_int(EXISTS, &[Param::Int(account_id), Param::Text(to)]).await?.is_some() {
            return Err(StoreError::AlreadyExists(format!("script {to}")));
        }
        let sql = "UPDATE sieve_scripts SET name = $1 WHERE account_id = $2 AND name = $3";
        tx.execute(sql, &[Param::Text(to), Param::Int(account_id), Param::Text(from)]).await.map_err(
            |e| {
                if is_unique_violation(&e) {
                    StoreError::AlreadyExists(format!("script {to}"))
                } else {
                    db_err(e)
                }
            },
        )?;
        tx.commit().await
    }

    async fn sieve_activate(&self, account_id: i64, name: Option<&str>) -> StoreResult<()> {
        let name = name.map(checked_name).transpose()?;
        // Under the account's lock, so that two activations cannot both clear
        // the old script and then meet on the one-active index.
        let mut tx = locked(self, account_id).await?;
        if let Some(name) = name
            && tx.fetch_int(EXISTS, &[Param::Int(account_id), Param::Text(name)]).await?.is_none()
        {
            return Err(StoreError::NotFound(format!("script {name}")));
        }
        // Cleared first: the index allows one active row at every moment.
        let clear = "UPDATE sieve_scripts SET active = $1 WHERE account_id = $2 AND active = $3";
        tx.run(clear, &[Param::Bool(false), Param::Int(account_id), Param::Bool(true)]).await?;
        if let Some(name) = name {
            let set = "UPDATE sieve_scripts SET active = $1 WHERE account_id = $2 AND name = $3";
            tx.run(set, &[Param::Bool(true), Param::Int(account_id), Param::Text(name)]).await?;
        }
        tx.commit().await
    }

    async fn sieve_active(&self, account_id: i64) -> StoreResult<Option<(String, Vec<u8>)>> {
        let sql = "SELECT name, source FROM sieve_scripts WHERE account_id = $1 AND active = $2";
        let rows = self.fetch(false, sql, &[Param::Int(account_id), Param::Bool(true)]).await?;
        rows.first().map(|r| Ok((r.text("name")?, r.blob("source")?))).transpose()
    }

    async fn sieve_active_digests(&self) -> StoreResult<Vec<ActiveScript>> {
        let sql = "SELECT s.account_id, a.email, s.digest FROM sieve_scripts s \
             JOIN accounts a ON a.id = s.account_id WHERE s.active = $1";
        let rows = self.fetch(false, sql, &[Param::Bool(true)]).await?;
        rows.iter()
            .map(|r| {
                // A row written before digests were kept has none: a digest
                // no script has, so its source is read and compiled.
                let digest = <[u8; 32]>::try_from(r.blob("digest")?.as_slice()).unwrap_or([0; 32]);
                Ok(ActiveScript { account_id: r.int("account_id")?, email: r.text("email")?, digest })
            })
            .collect()
    }

    async fn sieve_vacation_seen(
        &self,
        account_id: i64,
        handle: &str,
        sender: &str,
        period_secs: u64,
    ) -> StoreResult<bool> {
        let key = seen_key(&[handle, &sender.to_lowercase()]);
        seen(self, account_id, KIND_VACATION, &key, period_secs).await
    }

    async fn sieve_duplicate_seen(&self, account_id: i64, key: &str, period_secs: u64) -> StoreResult<bool> {
        seen(self, account_id, KIND_DUPLICATE, &seen_key(&[key]), period_secs).await
    }

    async fn sieve_seen_prune(&self) -> StoreResult<u64> {
        let sql = "DELETE FROM sieve_seen WHERE expires_at <= $1";
        self.execute(sql, &[B::time(Utc::now())]).await.map_err(db_err)
    }
}
