//! QUOTA (RFC 9208) with the STORAGE resource: GETQUOTA, GETQUOTAROOT, the
//! SETQUOTA refusal, and the OVERQUOTA check APPEND and COPY make.
//!
//! Every mailbox of an account is under one quota root, named `""`: the account's
//! limit is set by the administrator (`mailcluster user quota`, or the domain's
//! default), never by the user, so SETQUOTA is refused and `QUOTASET` is not
//! announced. An account without a limit has no quota root at all (§4.1.2: a
//! mailbox may have none).

use super::mailbox::name_from_bytes;
use super::session::{Outcome, Session, store_error};
use crate::proto::imap::encode;
use crate::store::StoreError;
use mailcluster_model::{Quota, UidSet};

/// The one quota root, as it goes on the wire.
const ROOT: &str = "\"\"";

/// Octets in RFC 9208's STORAGE unit.
const UNIT: u64 = 1024;

/// Why a write was refused for the quota: the tagged NO (RFC 9208 §5.2).
pub(crate) fn over_quota() -> Outcome {
    Outcome::no("[OVERQUOTA] Quota exceeded (storage)")
}

impl Session {
    pub(crate) async fn cmd_getquotaroot(&mut self, mailbox: &[u8]) -> Outcome {
        let name = match name_from_bytes(mailbox, self.utf8) {
            Ok(n) => n,
            Err(o) => return o,
        };
        let account = self.account().map(|a| a.id).unwrap_or_default();
        match self.app.store.mailbox_get(account, &name).await {
            Ok(Some(_)) => {}
            Ok(None) => return Outcome::no("[NONEXISTENT] No such mailbox"),
            Err(e) => return store_error(e),
        }
        let quota = match self.app.store.quota(account).await {
            Ok(q) => q,
            Err(e) => return quota_error(e),
        };
        let mailbox = encode::mailbox(&name, self.utf8);
        match quota_line(&quota) {
            Some(line) => {
                self.push(&format!("* QUOTAROOT {mailbox} {ROOT}"));
                self.push(&line);
            }
            None => self.push(&format!("* QUOTAROOT {mailbox}")),
        }
        Outcome::ok("GETQUOTAROOT completed")
    }

    pub(crate) async fn cmd_getquota(&mut self, root: &[u8]) -> Outcome {
        let account = self.account().map(|a| a.id).unwrap_or_default();
        let quota = match self.app.store.quota(account).await {
            Ok(q) => q,
            Err(e) => return quota_error(e),
        };
        match quota_line(&quota) {
            Some(line) if root.is_empty() => {
                self.push(&line);
                Outcome::ok("GETQUOTA completed")
            }
            _ => Outcome::no("[NONEXISTENT] No such quota root"),
        }
    }

    /// RFC 9208 §4.1.3: a server may refuse SETQUOTA; limits are set by the
    /// administrator here.
    pub(crate) fn cmd_setquota(&mut self) -> Outcome {
        Outcome::no("[NOPERM] Quotas are set by the administrator")
    }

    /// Refuses a COPY of `uids` out of `mailbox_id` that would not fit under the
    /// account's quota; their sizes are read only when the account has a limit at all.
    pub(crate) async fn copy_quota_refusal(&self, mailbox_id: i64, uids: &UidSet) -> Option<Outcome> {
        let account = self.account().map(|a| a.id)?;
        let quota = match self.app.store.quota(account).await {
            Ok(q) => q,
            Err(e) => return Some(quota_error(e)),
        };
        quota.limit()?;
        // The summary rows carry the size without decoding each message's metadata.
        let octets: u64 = match self.app.store.sort_rows(mailbox_id, uids).await {
            Ok(rows) => rows.iter().map(|r| u64::from(r.size)).sum(),
            Err(e) => return Some(store_error(e)),
        };
        (!quota.fits(octets)).then(over_quota)
    }
}

/// `* QUOTA "" (STORAGE used limit)` in units of 1024 octets, usage rounded up so
/// a nearly full account never reads as having room; `None` without a limit.
fn quota_line(quota: &Quota) -> Option<String> {
    let limit = quota.limit()?;
    Some(format!("* QUOTA {ROOT} (STORAGE {} {})", quota.used.div_ceil(UNIT), limit / UNIT))
}

fn quota_error(e: StoreError) -> Outcome {
    match e {
        // The account itself vanished under the session.
        StoreError::NotFound(_) => Outcome::no("[NONEXISTENT] No such quota root"),
        e => store_error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_is_reported_in_kibibytes_with_usage_rounded_up() {
        let q = Quota { account_limit: Some(10 * 1024 * 1024), domain_limit: Some(1), used: 1025 };
        assert_eq!(quota_line(&q).as_deref(), Some("* QUOTA \"\" (STORAGE 2 10240)"));
        let unlimited = Quota { account_limit: None, domain_limit: None, used: 5000 };
        assert_eq!(quota_line(&unlimited), None);
        let by_domain = Quota { account_limit: None, domain_limit: Some(2048), used: 0 };
        assert_eq!(quota_line(&by_domain).as_deref(), Some("* QUOTA \"\" (STORAGE 0 2)"));
    }

    #[test]
    fn a_message_fits_up_to_the_limit_exactly() {
        let q = Quota { account_limit: Some(1000), domain_limit: None, used: 600 };
        assert!(q.fits(400));
        assert!(!q.fits(401));
        let full = Quota { used: 1000, ..q };
        assert!(full.fits(0));
        assert!(!full.fits(1));
    }
}
