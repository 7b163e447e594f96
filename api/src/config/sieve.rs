//! `[sieve]`: accounts' Sieve scripts and the ManageSieve listener (RFC 5804).

use serde::{Deserialize, Serialize};

/// `[sieve]` section of the server configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SieveConfig {
    /// Largest script an account may store, in octets (ManageSieve's MAXSIZE).
    pub max_script_bytes: usize,
    /// Most scripts an account may keep.
    pub max_scripts: usize,
    /// Most `redirect` actions one script may take for a message (the
    /// MAXREDIRECTS capability, RFC 5804 §1.7).
    pub max_redirects: u32,
    /// Longest ManageSieve command line, literals not counted.
    pub max_line_bytes: usize,
    /// Largest literal (and command) a ManageSieve client may send before it
    /// logs in: an AUTHENTICATE response fits.
    pub preauth_max_literal_bytes: usize,
    /// Time from connecting to logging in, however busy the client keeps the
    /// connection.
    pub preauth_timeout_secs: u64,
    /// Inactivity after which a ManageSieve session is closed.
    pub idle_timeout_secs: u64,
    /// Simultaneous ManageSieve connections per client IP on each pod (0 =
    /// unlimited).
    pub max_connections_per_ip: usize,
    /// Erroneous commands (unknown, malformed, failed logins) before the
    /// connection is closed.
    pub max_errors: u32,
}

impl Default for SieveConfig {
    fn default() -> Self {
        SieveConfig {
            max_script_bytes: 64 * 1024,
            max_scripts: 16,
            max_redirects: 4,
            max_line_bytes: 8 * 1024,
            preauth_max_literal_bytes: 4 * 1024,
            preauth_timeout_secs: 60,
            idle_timeout_secs: 30 * 60,
            max_connections_per_ip: 16,
            max_errors: 10,
        }
    }
}

impl SieveConfig {
    pub(super) fn problems(&self, out: &mut Vec<String>) {
        for (name, value) in [
            ("sieve.max_script_bytes", self.max_script_bytes as u64),
            ("sieve.max_scripts", self.max_scripts as u64),
            ("sieve.preauth_timeout_secs", self.preauth_timeout_secs),
            ("sieve.idle_timeout_secs", self.idle_timeout_secs),
        ] {
            if value == 0 {
                out.push(format!("{name} must be greater than 0"));
            }
        }
        // Scripts travel in literals; lines carry only names and numbers.
        if self.max_line_bytes < 1024 {
            out.push("sieve.max_line_bytes must be at least 1024".into());
        }
        // AUTHENTICATE "PLAIN" with a user name and password of a few hundred
        // octets each, base64-encoded.
        if self.preauth_max_literal_bytes < 1024 {
            out.push("sieve.preauth_max_literal_bytes must be at least 1024".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn limits_that_would_refuse_every_script_or_login_are_problems() {
        let mut config = Config::default();
        assert!(config.problems().is_empty(), "{:?}", config.problems());
        config.sieve.max_script_bytes = 0;
        config.sieve.max_scripts = 0;
        config.sieve.preauth_max_literal_bytes = 100;
        config.sieve.max_line_bytes = 10;
        let problems = config.problems().join("\n");
        for needle in [
            "sieve.max_script_bytes must be greater than 0",
            "sieve.max_scripts must be greater than 0",
            "sieve.preauth_max_literal_bytes must be at least 1024",
            "sieve.max_line_bytes must be at least 1024",
        ] {
            assert!(problems.contains(needle), "missing {needle:?} in:\n{problems}");
        }
    }

    #[test]
    fn the_section_and_its_port_come_from_the_environment() {
        let env = [("MAILCLUSTER_SIEVE__MAX_SCRIPTS", "3"), ("MAILCLUSTER_MANAGESIEVE_PORT", "4190")];
        let config =
            Config::load(None, env.into_iter().map(|(k, v)| (k.to_string(), v.to_string()))).expect("config");
        assert_eq!((config.sieve.max_scripts, config.ports.managesieve), (3, 4190));
        assert_eq!(Config::default().ports.managesieve, 14190);
    }
}
