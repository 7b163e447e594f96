//! `[filter]`: content checks of incoming mail by an outside scanner, today
//! rspamd (`[filter.rspamd]`).

use serde::{Deserialize, Serialize};

use super::Secret;

/// `[filter]`: the scanners a message is shown before it is stored.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FilterConfig {
    pub rspamd: RspamdConfig,
}

/// What a message gets when rspamd cannot say (unreachable, slow, an error, or
/// the breaker open).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// Delivered unscanned, marked `X-Spam-Status: unchecked`.
    #[default]
    Open,
    /// Refused with `451 4.7.1`: the sender tries again later.
    Closed,
}

/// `[filter.rspamd]` (`MAILCLUSTER_FILTER__RSPAMD__*`): each message that
/// enters is scanned by rspamd's `/checkv2` before it is stored, and its action
/// decides its fate (docs/filtering.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RspamdConfig {
    /// `http://host:port` of rspamd's normal worker (11333), whose controller
    /// functions (learning) are on the same port when the worker is a
    /// controller, or at `learn_url`. Empty: no scanning, no cost.
    pub url: String,
    /// Where `/learnspam` and `/learnham` go (rspamd's controller, 11334);
    /// empty: `url`.
    pub learn_url: String,
    /// Sent as rspamd's `Password` header (the controller's password, needed
    /// for learning).
    pub password: Option<Secret>,
    /// The whole scan, connect to last byte of the answer.
    pub timeout_ms: u64,
    /// `open` (deliver unscanned) or `closed` (451) when rspamd cannot answer.
    pub fail_mode: FailMode,
    /// Scan mail from authenticated users too (submission); by default only
    /// mail arriving on the MX is scanned.
    pub scan_submission: bool,
    /// Larger messages are not scanned (rspamd's own practice: 2 MiB) and are
    /// marked `X-Spam-Status: unchecked (too large)`.
    pub max_size: u64,
    /// Consecutive failures after which the pod stops asking rspamd.
    pub breaker_failures: u32,
    /// How long the pod stops asking before one message probes rspamd again.
    pub breaker_retry_secs: u64,
    /// Learn requests (a message moved into or out of Junk) waiting to be sent;
    /// more are dropped and counted.
    pub learn_queue: usize,
}

impl Default for RspamdConfig {
    fn default() -> Self {
        RspamdConfig {
            url: String::new(),
            learn_url: String::new(),
            password: None,
            timeout_ms: 3000,
            fail_mode: FailMode::Open,
            scan_submission: false,
            max_size: 2 * 1024 * 1024,
            breaker_failures: 5,
            breaker_retry_secs: 10,
            learn_queue: 1000,
        }
    }
}

impl FilterConfig {
    pub(super) fn problems(&self, out: &mut Vec<String>) {
        let r = &self.rspamd;
        for (name, url) in [("filter.rspamd.url", &r.url), ("filter.rspamd.learn_url", &r.learn_url)] {
            // The client speaks plain HTTP/1.1: rspamd is reached inside the
            // cluster, as its own documentation has MTAs do.
            if !url.is_empty() && !url.starts_with("http://") {
                out.push(format!("{name} must start with http:// (got {url:?})"));
            }
        }
        for (name, value) in [
            ("filter.rspamd.timeout_ms", r.timeout_ms),
            ("filter.rspamd.max_size", r.max_size),
            ("filter.rspamd.breaker_failures", u64::from(r.breaker_failures)),
            ("filter.rspamd.breaker_retry_secs", r.breaker_retry_secs),
        ] {
            if value == 0 {
                out.push(format!("{name} must be greater than 0"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::*;

    fn load(vars: &[(&str, &str)]) -> Result<Config, String> {
        let env = vars.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        Config::load(None, env).map_err(|e| e.to_string())
    }

    #[test]
    fn rspamd_is_set_from_the_environment() {
        let c = load(&[
            ("MAILCLUSTER_FILTER__RSPAMD__URL", "http://rspamd:11333"),
            ("MAILCLUSTER_FILTER__RSPAMD__PASSWORD", "s3cret"),
            ("MAILCLUSTER_FILTER__RSPAMD__FAIL_MODE", "closed"),
            ("MAILCLUSTER_FILTER__RSPAMD__SCAN_SUBMISSION", "true"),
            ("MAILCLUSTER_FILTER__RSPAMD__TIMEOUT_MS", "500"),
        ])
        .unwrap();
        let r = &c.filter.rspamd;
        assert_eq!(r.url, "http://rspamd:11333");
        assert_eq!(r.password.as_ref().map(|p| p.expose()), Some("s3cret"));
        assert_eq!((r.fail_mode, r.scan_submission, r.timeout_ms), (FailMode::Closed, true, 500));
        assert!(!c.to_redacted_toml().contains("s3cret"));
        assert_eq!(Config::default().filter.rspamd.max_size, 2 * 1024 * 1024);
    }

    #[test]
    fn wrong_values_are_problems() {
        let err = load(&[
            ("MAILCLUSTER_FILTER__RSPAMD__URL", "https://rspamd:11333"),
            ("MAILCLUSTER_FILTER__RSPAMD__TIMEOUT_MS", "0"),
        ])
        .unwrap_err();
        assert!(err.contains("filter.rspamd.url must start with http://"), "{err}");
        assert!(err.contains("filter.rspamd.timeout_ms must be greater than 0"), "{err}");
        assert!(load(&[("MAILCLUSTER_FILTER__RSPAMD__FAIL_MODE", "maybe")]).is_err());
    }
}
