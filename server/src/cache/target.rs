//! Where the Redis master is: a fixed address (`redis://`, `rediss://`) or the one
//! a set of Sentinels names (`redis+sentinel://`, `rediss+sentinel://`).
//!
//! A Sentinel URL lists the Sentinels and the master's name:
//! `redis+sentinel://[[user]:password@]host[:port][,host[:port]…]/MASTER[/DB]`.
//! Sentinels default to port 26379. The user and password are the data nodes'
//! (Sentinels here run without authentication); `rediss+sentinel://` speaks TLS to
//! the data nodes. The master's address is asked of the Sentinels, in the order
//! listed, at connect time and again whenever the master stops serving us (after a
//! failover the old one refuses writes or is gone), so a pod follows a failover
//! without a restart.

use std::time::Duration;

use super::{CacheError, CacheResult};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// A fixed address: the URL as given.
    Direct(String),
    Sentinel {
        /// `redis://host:port` of each Sentinel.
        sentinels: Vec<String>,
        master: String,
        /// `redis` or `rediss`, for the data nodes.
        scheme: &'static str,
        /// `user:password@` or empty.
        auth: String,
        /// `/N` or empty.
        db: String,
    },
}

const SENTINEL_PORT: u16 = 26379;

impl RedisTarget {
    pub fn parse(url: &str) -> CacheResult<RedisTarget> {
        let (scheme, rest) = if let Some(r) = url.strip_prefix("redis+sentinel://") {
            ("redis", r)
        } else if let Some(r) = url.strip_prefix("rediss+sentinel://") {
            ("rediss", r)
        } else if url.starts_with("redis://") || url.starts_with("rediss://") {
            return Ok(RedisTarget::Direct(url.to_owned()));
        } else {
            // The URL may carry a password: name only its scheme.
            return Err(CacheError::Internal(format!(
                "unsupported cache URL scheme {:?} (expected redis://, rediss://, redis+sentinel:// or rediss+sentinel://)",
                url.split_once(':').map_or("", |(s, _)| s)
            )));
        };
        let bad = || {
            CacheError::Internal(
                "invalid Sentinel URL (expected redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/MASTER[/DB])"
                    .into(),
            )
        };
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((auth, rest)) => (format!("{auth}@"), rest),
            None => (String::new(), rest),
        };
        let (hosts, path) = rest.split_once('/').ok_or_else(bad)?;
        let mut parts = path.split('/');
        let master = parts.next().filter(|m| !m.is_empty()).ok_or_else(bad)?.to_owned();
        let db = match parts.next() {
            Some(d) if d.parse::<u32>().is_ok() => format!("/{d}"),
            Some(_) => return Err(bad()),
            None => String::new(),
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        let mut sentinels = Vec::new();
        for host in hosts.split(',') {
            if host.is_empty() {
                return Err(bad());
            }
            // `[::1]:26379`, `host:26379`, `host`.
            let has_port = match host.rfind(':') {
                Some(i) => host[i + 1..].parse::<u16>().is_ok() && !host[i..].contains(']'),
                None => false,
            };
            sentinels.push(if has_port {
                format!("redis://{host}")
            } else {
                format!("redis://{host}:{SENTINEL_PORT}")
            });
        }
        Ok(RedisTarget::Sentinel { sentinels, master, scheme, auth, db })
    }

    /// The URL of the master now: the given one, or the one the first Sentinel
    /// that answers names.
    pub async fn resolve(&self, timeout: Duration) -> CacheResult<String> {
        let RedisTarget::Sentinel { sentinels, master, scheme, auth, db } = self else {
            let RedisTarget::Direct(url) = self else { unreachable!() };
            return Ok(url.clone());
        };
        let mut last = String::from("no Sentinel listed");
        for sentinel in sentinels {
            match ask_sentinel(sentinel, master, timeout).await {
                Ok((host, port)) => {
                    let host = if host.contains(':') { format!("[{host}]") } else { host };
                    return Ok(format!("{scheme}://{auth}{host}:{port}{db}"));
                }
                Err(e) => last = format!("{}: {e}", sentinel.trim_start_matches("redis://")),
            }
        }
        Err(CacheError::Unavailable(format!("no Sentinel named a master {master:?} ({last})")))
    }
}

async fn ask_sentinel(sentinel: &str, master: &str, timeout: Duration) -> Result<(String, u16), String> {
    let client = ::redis::Client::open(sentinel).map_err(|e| e.to_string())?;
    let mut conn = tokio::time::timeout(timeout, client.get_multiplexed_async_connection())
        .await
        .map_err(|_| "no answer".to_string())?
        .map_err(|e| e.to_string())?;
    let addr: Option<(String, u16)> = tokio::time::timeout(
        timeout,
        ::redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg(master).query_async(&mut conn),
    )
    .await
    .map_err(|_| "no answer".to_string())?
    .map_err(|e| e.to_string())?;
    addr.ok_or_else(|| format!("knows no master {master:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(RedisTarget::parse("redis://h:1").unwrap(), RedisTarget::Direct("redis://h:1".into()));
        assert_eq!(
            RedisTarget::parse("rediss+sentinel://:pw@s1,s2:26380,[::1]:7/mymaster/2").unwrap(),
            RedisTarget::Sentinel {
                sentinels: vec![
                    "redis://s1:26379".into(),
                    "redis://s2:26380".into(),
                    "redis://[::1]:7".into()
                ],
                master: "mymaster".into(),
                scheme: "rediss",
                auth: ":pw@".into(),
                db: "/2".into(),
            }
        );
        for bad in [
            "redis+sentinel://s1",
            "redis+sentinel://s1/",
            "redis+sentinel://,s1/m",
            "redis+sentinel://s1/m/x",
        ] {
            assert!(RedisTarget::parse(bad).is_err(), "{bad}");
        }
        let e = RedisTarget::parse("memcached://:secret@h").unwrap_err().to_string();
        assert!(e.contains("memcached") && !e.contains("secret"), "{e}");
    }
}
