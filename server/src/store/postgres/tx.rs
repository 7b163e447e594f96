//! The primitives of a write transaction (`StoreTx`) in PostgreSQL's dialect,
//! out of which `steps.rs` builds copy, move, mailbox create/rename/delete,
//! account creation and flag changes for both databases.

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};

use super::backend::store_flags_on;
use super::statements::{links_in_ranges, range_arrays};
use crate::store::common::{db_err, is_unique_violation};
use crate::store::steps::{
    FlagChange, LinkRow, MAILBOX_COLS, NewAccount, NewMailbox, Param, RenameFrom, SharedSql, StoreTx,
    mailbox_from_row,
};
use crate::store::*;

type Link = LinkRow<DateTime<Utc>>;

impl StoreTx for Transaction<'_, Postgres> {
    const BUMP_UID_VALIDITY: &'static str = "UPDATE accounts \
         SET last_uid_validity = GREATEST(last_uid_validity + $2, $3 + $2 - 1) WHERE id = $1 RETURNING last_uid_validity";
    const INSERT_PARENT: &'static str = "INSERT INTO mailboxes (account_id, name, uid_validity) VALUES ($1, $2, $3) \
         ON CONFLICT (account_id, name) DO NOTHING";
    const LOCK_ACCOUNT: Option<&'static str> = Some("SELECT id FROM accounts WHERE id = $1 FOR UPDATE");
    // KEY SHARE: a concurrent domain_del waits for us (and then sees the account)
    const ACCOUNT_DOMAIN: &'static str = "SELECT id FROM domains WHERE name = $1 FOR KEY SHARE";

    type Date = DateTime<Utc>;

    async fn lock_mailboxes(&mut self, ids: &[i64]) -> StoreResult<Vec<i64>> {
        // One form for any number of ids: with generic plans (see `generic_plans`)
        // the array statement keeps its plan like a scalar one would.
        sqlx::query_scalar("SELECT id FROM mailboxes WHERE id = ANY($1) ORDER BY id FOR UPDATE")
            .bind(ids)
            .fetch_all(&mut **self)
            .await
            .map_err(db_err)
    }

    async fn links_in(&mut self, mailbox_id: i64, uids: &UidSet) -> StoreResult<Vec<Link>> {
        let (los, his) = range_arrays(uids);
        if los.is_empty() {
            return Ok(Vec::new());
        }
        sqlx::query_as(concat!(
            "SELECT mm.uid, mm.message_id, mm.flags, mm.keywords, mm.internal_date, mm.size FROM ",
            links_in_ranges!(),
            " ORDER BY mm.uid"
        ))
        .bind(mailbox_id)
        .bind(&los)
        .bind(&his)
        .fetch_all(&mut **self)
        .await
        .map_err(db_err)
    }

    async fn insert_links(&mut self, dest: i64, first: i64, modseq: i64, links: &[Link]) -> StoreResult<()> {
        let new_uids: Vec<i64> = (first..first + links.len() as i64).collect();
        let message_ids: Vec<i64> = links.iter().map(|l| l.message_id).collect();
        let flags: Vec<i32> = links.iter().map(|l| l.flags).collect();
        let keywords: Vec<&str> = links.iter().map(|l| l.keywords.as_str()).collect();
        let dates: Vec<DateTime<Utc>> = links.iter().map(|l| l.internal_date).collect();
        let sizes: Vec<i64> = links.iter().map(|l| l.size).collect();
        sqlx::query(
            "INSERT INTO mailbox_messages (mailbox_id, uid, message_id, flags, keywords, modseq, internal_date, \
             size) \
             SELECT $1, u, m, f, k, $2, d, s \
             FROM UNNEST($3::bigint[], $4::bigint[], $5::int[], $6::text[], $7::timestamptz[], $8::bigint[]) \
             AS t(u, m, f, k, d, s)",
        )
        .bind(dest)
        .bind(modseq)
        .bind(&new_uids)
        .bind(&message_ids)
        .bind(&flags)
        .bind(&keywords)
        .bind(&dates)
        .bind(&sizes)
        .execute(&mut **self)
        .await
        .map_err(db_err)?;
        Ok(())
    }

    async fn delete_links(&mut self, mailbox_id: i64, uids: &[i64], modseq: i64) -> StoreResult<()> {
        sqlx::query("DELETE FROM mailbox_messages WHERE mailbox_id = $1 AND uid = ANY($2)")
            .bind(mailbox_id)
            .bind(uids)
            .execute(&mut **self)
            .await
            .map_err(db_err)?;
        sqlx::query(
            "INSERT INTO expunged (mailbox_id, uid, modseq) SELECT $1, u, $3 FROM UNNEST($2::bigint[]) AS u \
             ON CONFLICT (mailbox_id, uid) DO UPDATE SET modseq = EXCLUDED.modseq",
        )
        .bind(mailbox_id)
        .bind(uids)
        .bind(modseq)
        .execute(&mut **self)
        .await
        .map_err(db_err)?;
        Ok(())
    }

    async fn tombstone_all(&mut self, mailbox_id: i64, modseq: i64) -> StoreResult<()> {
        let sql = "INSERT INTO expunged (mailbox_id, uid, modseq) \
             SELECT mailbox_id, uid, $2 FROM mailbox_messages WHERE mailbox_id = $1 \
             ON CONFLICT (mailbox_id, uid) DO UPDATE SET modseq = EXCLUDED.modseq";
        self.run(sql, &[Param::Int(mailbox_id), Param::Int(modseq)]).await
    }

    async fn delete_orphans(&mut self, message_ids: &[i64]) -> StoreResult<()> {
        if message_ids.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "DELETE FROM messages m WHERE m.id = ANY($1) \
             AND NOT EXISTS (SELECT 1 FROM mailbox_messages mm WHERE mm.message_id = m.id)",
        )
        .bind(message_ids)
        .execute(&mut **self)
        .await
        .map_err(db_err)?;
        Ok(())
    }

    async fn mailbox_in(&mut self, account_id: i64, name: &str, lock: bool) -> StoreResult<Option<Mailbox>> {
        let sql = format!(
            "SELECT {MAILBOX_COLS} FROM mailboxes WHERE account_id = $1 AND name = $2{}",
            if lock { " FOR UPDATE" } else { "" }
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(account_id)
            .bind(name)
            .fetch_optional(&mut **self)
            .await
            .map_err(db_err)?;
        row.as_ref().map(mailbox_from_row).transpose()
    }

    async fn insert_mailbox(&mut self, new: NewMailbox<'_>) -> StoreResult<Mailbox> {
        let sql = format!(
            "INSERT INTO mailboxes (account_id, name, uid_validity, special_use) VALUES ($1, $2, $3, $4) \
             RETURNING {MAILBOX_COLS}"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(new.account_id)
            .bind(new.name)
            .bind(new.uid_validity)
            .bind(new.special_use.map(SpecialUse::as_str))
            .fetch_one(&mut **self)
            .await
            .map_err(|e| match e {
                e if is_unique_violation(&e) => StoreError::AlreadyExists(format!("mailbox {}", new.name)),
                e => db_err(e),
            })?;
        mailbox_from_row(&row)
    }

    async fn rename_sources(&mut self, from: RenameFrom<'_>) -> StoreResult<Vec<(i64, String)>> {
        sqlx::query_as(
            "SELECT id, name FROM mailboxes WHERE account_id = $1 \
             AND (name = $2 OR ($3 AND left(name, length($2) + 1) = $2 || '/')) ORDER BY id FOR UPDATE",
        )
        .bind(from.account_id)
        .bind(from.name)
        .bind(from.children)
        .fetch_all(&mut **self)
        .await
        .map_err(db_err)
    }

    async fn rename_mailboxes(
        &mut self,
        ids: &[i64],
        names: &[String],
        first: i64,
        to: &str,
    ) -> StoreResult<()> {
        let validities: Vec<i64> = (first..first + ids.len() as i64).collect();
        // The unique (account_id, name) constraint is checked per row, so a
        // single UPDATE renaming A/x → B/x fails only if B/x already exists.
        sqlx::query(
            "UPDATE mailboxes m SET name = t.n, uid_validity = t.v \
             FROM UNNEST($1::bigint[], $2::text[], $3::bigint[]) AS t(id, n, v) WHERE m.id = t.id",
        )
        .bind(ids)
        .bind(names)
        .bind(&validities)
        .execute(&mut **self)
        .await
        .map_err(|e| match e {
            e if is_unique_violation(&e) => StoreError::AlreadyExists(format!("a mailbox under {to}")),
            e => db_err(e),
        })?;
        Ok(())
    }

    async fn insert_account(&mut self, new: NewAccount<'_>) -> StoreResult<(i64, DateTime<Utc>)> {
        let res = sqlx::query_as(
            "INSERT INTO accounts (email, domain_id, password_hash) VALUES ($1, $2, $3) RETURNING id, created_at",
        )
        .bind(new.email)
        .bind(new.domain_id)
        .bind(new.password_hash)
        .fetch_one(&mut **self)
        .await;
        match res {
            Ok(row) => Ok(row),
            Err(e) if is_unique_violation(&e) => {
                Err(StoreError::AlreadyExists(format!("account {}", new.email)))
            }
            Err(e) => Err(db_err(e)),
        }
    }

    async fn insert_default_mailboxes(&mut self, mailboxes: &[NewMailbox<'_>]) -> StoreResult<()> {
        let accounts: Vec<i64> = mailboxes.iter().map(|m| m.account_id).collect();
        let names: Vec<&str> = mailboxes.iter().map(|m| m.name).collect();
        let validities: Vec<i64> = mailboxes.iter().map(|m| m.uid_validity).collect();
        let specials: Vec<Option<&str>> =
            mailboxes.iter().map(|m| m.special_use.map(SpecialUse::as_str)).collect();
        sqlx::query(
            "INSERT INTO mailboxes (account_id, name, uid_validity, special_use) \
             SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::bigint[], $4::text[])",
        )
        .bind(&accounts)
        .bind(&names)
        .bind(&validities)
        .bind(&specials)
        .execute(&mut **self)
        .await
        .map_err(db_err)?;
        sqlx::query(
            "INSERT INTO subscriptions (account_id, name) SELECT * FROM UNNEST($1::bigint[], $2::text[])",
        )
        .bind(&accounts)
        .bind(&names)
        .execute(&mut **self)
        .await
        .map_err(db_err)?;
        Ok(())
    }

    async fn modseqs_in(&mut self, mailbox_id: i64, uids: &UidSet) -> StoreResult<Vec<(i64, i64)>> {
        let (los, his) = range_arrays(uids);
        sqlx::query_as(concat!(
            "SELECT DISTINCT mm.uid, mm.modseq FROM ",
            links_in_ranges!(),
            " ORDER BY mm.uid"
        ))
        .bind(mailbox_id)
        .bind(&los)
        .bind(&his)
        .fetch_all(&mut **self)
        .await
        .map_err(db_err)
    }

    async fn store_flags(&mut self, mailbox_id: i64, change: FlagChange<'_>) -> StoreResult<Vec<FlagRow>> {
        store_flags_on(self, mailbox_id, change).await
    }
}
