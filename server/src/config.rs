//! Server configuration: a TOML file plus `MAILCLUSTER_*` environment overrides.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub smtp: crate::smtp::SmtpConfig,
    pub imap: crate::imap::ImapConfig,
    pub pop3: crate::pop3::Pop3Config,
}
