//! Where mail for an address goes, as every RCPT asks it: the store's answer
//! ([`crate::store::Addresses::recipient`]) kept in the cache, read again in the
//! background before it expires, with subaddresses (RFC 5233) and the
//! postmaster rules (RFC 5321 §4.5.1). The admin paths drop an address's entry
//! through [`forget`] when they change what it leads to.

use std::sync::PoisonError;
use std::time::Duration;

use mailcluster_model::Recipient as Lookup;

use crate::app::App;
use crate::cache::{Cache, CacheResult};
use crate::proto::smtp::split_address;
use crate::store::StoreResult;

/// Drops `address`'s cached entry, so that every pod reads the store at its
/// next RCPT for it.
pub async fn forget(cache: &dyn Cache, address: &str) -> CacheResult<()> {
    cache.value_del(&recipient_key(address)).await
}

/// [`lookup`] with the postmaster rules of RFC 5321 §4.5.1: the
/// bare `<postmaster>` is always a local recipient, and so is `postmaster@`
/// every local domain. They go to `smtp.postmaster` when it is set; else to
/// the domain's own `postmaster@` account (the bare form: the hostname's
/// domain when it is local, else the first local domain), which is created,
/// without a known password, the first time mail for it arrives and nobody
/// made it: the mail is kept until an administrator sets a password.
pub async fn resolve(app: &App, address: &str) -> StoreResult<Option<Lookup>> {
    let configured = &app.config.smtp.postmaster;
    let bare = address.eq_ignore_ascii_case("postmaster");
    // Every RCPT passes here: the local part is looked at before anything
    // is allocated.
    let postmaster_local =
        address.rsplit_once('@').is_some_and(|(l, _)| l.eq_ignore_ascii_case("postmaster"));
    if !bare && !postmaster_local {
        return lookup(app, address).await;
    }
    let postmaster_of = split_address(address).map(|(_, d)| d);
    if !bare && let found @ Some(Lookup::Mailbox { .. } | Lookup::NotLocal) = lookup(app, address).await? {
        return Ok(found);
    }
    if !configured.is_empty() {
        return Ok(Some(match lookup(app, configured).await? {
            Some(found @ Lookup::Mailbox { .. }) => found,
            // Not deliverable here: refuse as unknown, never as a relay attempt.
            _ => Lookup::NoSuchUser,
        }));
    }
    let domain = match postmaster_of {
        Some(d) => d.to_ascii_lowercase(),
        None => {
            let hostname = app.config.hostname.to_ascii_lowercase();
            if app.store.domain_exists(&hostname).await? {
                hostname
            } else {
                match app.store.domain_list().await?.into_iter().min() {
                    Some(d) => d,
                    None => return Ok(Some(Lookup::NoSuchUser)),
                }
            }
        }
    };
    let target = format!("postmaster@{domain}");
    match lookup(app, &target).await? {
        Some(Lookup::NoSuchUser) => {}
        found => return Ok(found),
    }
    create_postmaster(app, &target).await?;
    let _ = app.cache.value_del(&recipient_key(&target)).await;
    Ok(Some(match lookup(app, &target).await? {
        Some(found @ Lookup::Mailbox { .. }) => found,
        _ => Lookup::NoSuchUser,
    }))
}

/// Creates `postmaster@domain` with the hash of a random secret nobody holds
/// (logging in needs `mailcluster user passwd`). Another session creating it
/// at the same moment is not an error: the lookup after finds it.
async fn create_postmaster(app: &App, email: &str) -> StoreResult<()> {
    let hash = tokio::task::spawn_blocking(|| {
        let mut secret = [0u8; 32];
        rand::fill(&mut secret);
        crate::auth::hash_password(&crate::cache::hex(&secret))
    })
    .await
    .map_err(|e| crate::store::StoreError::Internal(format!("hashing: {e}")))?
    .map_err(|e| crate::store::StoreError::Internal(e.to_string()))?;
    match app.store.account_create(email, &hash).await {
        Ok(_) => {
            tracing::warn!(
                account = email,
                "mail for postmaster arrived and no such account existed: created it without a password \
                 (RFC 5321 §4.5.1); set one with `mailcluster user passwd` or set smtp.postmaster"
            );
            Ok(())
        }
        Err(e) => {
            tracing::debug!(error = %e, account = email, "postmaster account not created (it may exist now)");
            Ok(())
        }
    }
}

/// `user@domain` of `user+detail@domain` (RFC 5233), when the local part
/// has one of the configured delimiters after its first character.
pub fn without_detail(delimiters: &str, address: &str) -> Option<String> {
    let (local, domain) = address.rsplit_once('@')?;
    let at = local.char_indices().skip(1).find(|(_, c)| delimiters.contains(*c))?.0;
    Some(format!("{}@{domain}", &local[..at]))
}

/// Checks a recipient: `None` for an address without a domain, else the
/// cached answer or [`crate::store::Addresses::recipient`]'s, with its user
/// after the configured delimiters.
pub async fn lookup(app: &App, address: &str) -> StoreResult<Option<Lookup>> {
    if split_address(address).is_none() {
        return Ok(None);
    }
    let ttl = Duration::from_secs(app.config.smtp.recipient_cache_ttl_secs);
    let user = || without_detail(&app.config.smtp.recipient_delimiter, address);
    if ttl.is_zero() {
        return Ok(Some(app.store.recipient(address, user().as_deref()).await?));
    }
    let key = recipient_key(address);
    if let Ok(Some(v)) = app.cache.value_get_hot(&key).await
        && let Some((hit, written)) = decode_lookup(&v)
    {
        if written.is_some_and(|written| refresh_due(written, ttl)) {
            refresh(app, key, address.to_string(), user(), ttl);
        }
        return Ok(Some(hit));
    }
    let found = app.store.recipient(address, user().as_deref()).await?;
    remember_recipient(&*app.cache, &key, &found, ttl).await;
    Ok(Some(found))
}

/// Reads an entry that will soon expire again, in the background, and
/// caches the answer anew: a recipient that keeps getting mail is then
/// never looked up on its RCPT's path, and entries cached together (by a
/// burst, or a pod's start) do not all miss together a TTL later. One read
/// per entry at a time in the process; a failed one leaves the entry to
/// expire.
fn refresh(app: &App, key: String, address: String, user: Option<String>, ttl: Duration) {
    let refreshing = app.refreshing_recipients.clone();
    if !refreshing.lock().unwrap_or_else(PoisonError::into_inner).insert(key.clone()) {
        return;
    }
    let (store, cache) = (app.store.clone(), app.cache.clone());
    tokio::spawn(async move {
        match store.recipient(&address, user.as_deref()).await {
            Ok(found) => remember_recipient(&*cache, &key, &found, ttl).await,
            Err(err) => tracing::debug!(error = %err, "recipient entry not refreshed"),
        }
        refreshing.lock().unwrap_or_else(PoisonError::into_inner).remove(&key);
    });
}

/// The cache key of `address`'s recipient entry, the same on every pod.
pub fn recipient_key(address: &str) -> String {
    format!("smtp:rcpt:{}", address.to_lowercase())
}

/// Caches a recipient's lookup. Negative answers (and aliases, whose accounts
/// are cached on their own) are kept briefly so that a newly created user is
/// not refused for long. Cache trouble only costs a store lookup.
async fn remember_recipient(cache: &dyn Cache, key: &str, found: &Lookup, ttl: Duration) {
    let ttl = if matches!(found, Lookup::Mailbox { .. }) { ttl } else { ttl.min(NEGATIVE_TTL) };
    let _ = cache.value_put(key, encode_lookup(found, unix_millis()).as_bytes(), ttl).await;
}

/// How long an answer other than an account's INBOX is cached, at most.
const NEGATIVE_TTL: Duration = Duration::from_secs(5);

/// Whether an account's entry written at `written` (Unix milliseconds) is in
/// the last quarter of its `ttl`, when it is read again. Entries of a TTL
/// under 4 s are left to expire.
fn refresh_due(written: u64, ttl: Duration) -> bool {
    let ttl = ttl.as_millis() as u64;
    ttl >= 4_000 && unix_millis().saturating_sub(written) >= ttl - ttl / 4
}

fn unix_millis() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// An entry: `m:account:mailbox:limited:written` (pods that know only the
/// first three fields read it too), `a:` and a line per target, `u` or `r`.
fn encode_lookup(l: &Lookup, written_millis: u64) -> String {
    match l {
        Lookup::Mailbox { account_id, mailbox_id, limited } => {
            format!("m:{account_id}:{mailbox_id}:{}:{written_millis}", u8::from(*limited))
        }
        // addresses hold no control characters: a line per target
        Lookup::Alias(targets) => format!("a:{}", targets.join("\n")),
        Lookup::NoSuchUser => "u".into(),
        Lookup::NotLocal => "r".into(),
    }
}

/// An entry and, for an account's, when it was written (absent in entries of
/// older pods).
fn decode_lookup(v: &[u8]) -> Option<(Lookup, Option<u64>)> {
    let s = std::str::from_utf8(v).ok()?;
    match s {
        "u" => Some((Lookup::NoSuchUser, None)),
        "r" => Some((Lookup::NotLocal, None)),
        _ if s.starts_with("a:") => {
            Some((Lookup::Alias(s[2..].split('\n').map(str::to_string).collect()), None))
        }
        _ => {
            let mut it = s.strip_prefix("m:")?.split(':');
            let account_id = it.next()?.parse().ok()?;
            let mailbox_id = it.next()?.parse().ok()?;
            let limited = match it.next()? {
                "0" => false,
                "1" => true,
                _ => return None,
            };
            let written = it.next().and_then(|w| w.parse().ok());
            Some((Lookup::Mailbox { account_id, mailbox_id, limited }, written))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_cache_encoding_round_trips() {
        for l in [
            Lookup::Mailbox { account_id: 7, mailbox_id: 42, limited: false },
            Lookup::Mailbox { account_id: 7, mailbox_id: 42, limited: true },
            Lookup::Alias(vec!["a@example.com".into()]),
            Lookup::Alias(vec!["a@example.com".into(), "b@example.com".into()]),
            Lookup::NoSuchUser,
            Lookup::NotLocal,
        ] {
            let written = matches!(l, Lookup::Mailbox { .. }).then_some(1_700_000_000_123);
            assert_eq!(decode_lookup(encode_lookup(&l, 1_700_000_000_123).as_bytes()), Some((l, written)));
        }
        // an entry of a pod that did not write the time is read, and expires
        let older = Lookup::Mailbox { account_id: 7, mailbox_id: 42, limited: true };
        assert_eq!(decode_lookup(b"m:7:42:1"), Some((older, None)));
        assert_eq!(decode_lookup(b"m:x:1:0"), None);
        // an entry cached by a pod without quotas is a miss, not a wrong answer
        assert_eq!(decode_lookup(b"m:7:42"), None);
        assert_eq!(decode_lookup(b"garbage"), None);
    }

    #[test]
    fn entries_are_refreshed_in_the_last_quarter_of_their_ttl() {
        let ttl = Duration::from_secs(30);
        let now = unix_millis();
        assert!(!refresh_due(now, ttl));
        assert!(!refresh_due(now - 22_000, ttl));
        assert!(refresh_due(now - 23_000, ttl));
        assert!(refresh_due(now - 40_000, ttl), "an entry kept past its time");
        assert!(!refresh_due(now + 60_000, ttl), "a clock behind the writer's");
        assert!(!refresh_due(now - 3_000, Duration::from_secs(3)), "short TTLs are left to expire");
    }
}
