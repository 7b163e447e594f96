//! POP3 sessions.

use serde::{Deserialize, Serialize};

/// `[pop3]` section of the server configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Pop3Config {}
