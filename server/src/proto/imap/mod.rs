//! IMAP4rev1 grammar (RFC 3501 and the extensions we announce), without sockets.
//!
//! Complete commands (lines plus the literals they announce, within their limits)
//! come from [`super::frame::CommandFramer`].
//!
//! - [`parse`]: turns one complete command into a [`parse::Request`]. Most commands
//!   are parsed by `imap-codec`; the few its 1.0 release does not know (ID,
//!   NAMESPACE, UID EXPUNGE, and MULTIAPPEND's several messages per APPEND) by a
//!   small tokenizer here.
//! - [`encode`]: response syntax helpers (quoted strings, literals, flag lists) and
//!   [`utf7`]: modified UTF-7 mailbox names (RFC 3501 §5.1.3).
//!
//! Responses are written as bytes rather than through `imap-codec`'s response
//! types: ENVELOPE and BODYSTRUCTURE are stored pre-rendered at delivery (see
//! [`mailcluster_model::message`]), and FETCH bodies are written straight from the stored bytes;
//! building typed responses would re-parse and copy both.

pub mod encode;
pub mod parse;
pub mod utf7;

/// The tag of a command (its first word), or `*` when there is none.
pub fn tag_of(cmd: &[u8]) -> String {
    let end = cmd.iter().position(|&b| b == b' ' || b == b'\r' || b == b'\n').unwrap_or(cmd.len());
    let tag = &cmd[..end.min(64)];
    if tag.is_empty() || !tag.iter().all(|b| b.is_ascii_graphic() && !b"(){%*\"\\+".contains(b)) {
        return "*".into();
    }
    String::from_utf8_lossy(tag).into_owned()
}
