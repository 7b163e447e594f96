//! IMAP sessions.

use serde::{Deserialize, Serialize};

/// `[imap]` section of the server configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImapConfig {}
