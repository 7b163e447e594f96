//! Response syntax helpers.

use mailcluster_model::{FlagSet, Flags};

pub use mailcluster_model::message::{nstring, quoted, string};

/// A mailbox name as it goes on the wire, always quoted (every client accepts a
/// quoted name; atoms would need the astring rules checked): modified UTF-7, or
/// UTF-8 as stored once the client enabled UTF8=ACCEPT (RFC 9755 §3 allows UTF-8
/// in a quoted string then; a literal would be valid too, but clients look for
/// the quoted form in LIST). Stored names hold no control characters.
pub fn mailbox(name: &str, utf8: bool) -> String {
    if utf8 { quoted(name) } else { string(super::utf7::encode(name).as_bytes()) }
}

/// `(\Seen \Flagged $Keyword)`.
/// MAILBOXID (RFC 8474 §4) of the mailbox with this store id. Object ids are
/// built from the store's row ids: never reused (PostgreSQL sequences, SQLite
/// AUTOINCREMENT), kept by RENAME (the row is renamed in place) and the same from
/// every pod. The leading letter keeps them from being all digits and keeps a
/// mailbox's id apart from a message's (§8.1).
pub fn mailbox_id(id: i64) -> String {
    format!("F{id}")
}

/// EMAILID (RFC 8474 §5.1) of the stored message with this id: COPY and MOVE
/// link the same stored message, so a copy keeps its EMAILID as §5.1 asks.
pub fn email_id(id: i64) -> String {
    format!("M{id}")
}

/// The stored message an EMAILID names, when it is one [`email_id`] gives out
/// (ids are case sensitive and compared exactly: `M042` names nothing).
pub fn email_id_value(id: &[u8]) -> Option<i64> {
    let digits = std::str::from_utf8(id.strip_prefix(b"M")?).ok()?;
    let value: i64 = digits.parse().ok().filter(|&v| v > 0)?;
    (email_id(value).as_bytes() == id).then_some(value)
}

pub fn flag_list(flags: &FlagSet) -> String {
    flag_list_recent(flags, false)
}

/// [`flag_list`] with `\Recent` when the message is recent for the session (a
/// session flag: never stored, never settable).
pub fn flag_list_recent(flags: &FlagSet, recent: bool) -> String {
    let mut out = String::from("(");
    let recent = recent.then_some("\\Recent");
    for name in flags.system.names().chain(recent) {
        if out.len() > 1 {
            out.push(' ');
        }
        out.push_str(name);
    }
    for kw in &flags.keywords {
        if out.len() > 1 {
            out.push(' ');
        }
        out.push_str(kw);
    }
    out.push(')');
    out
}

/// The system flags every mailbox supports.
pub const SYSTEM_FLAGS: &str = "\\Answered \\Flagged \\Deleted \\Seen \\Draft";

/// Ascending inclusive ranges as a sequence set (`1:3,7`).
pub fn uid_ranges(ranges: &[(u32, u32)]) -> String {
    let mut out = String::new();
    for &(lo, hi) in ranges {
        if !out.is_empty() {
            out.push(',');
        }
        if lo == hi {
            out.push_str(&lo.to_string());
        } else {
            out.push_str(&format!("{lo}:{hi}"));
        }
    }
    out
}

/// `1:3,5` from ascending numbers.
pub fn sequence_set(nums: &[u32]) -> String {
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for &n in nums {
        match ranges.last_mut() {
            Some(last) if n == last.1.wrapping_add(1) => last.1 = n,
            _ => ranges.push((n, n)),
        }
    }
    uid_ranges(&ranges)
}

/// `dd-Mon-yyyy hh:mm:ss +zzzz` (INTERNALDATE), in the date's own zone.
pub fn internal_date(date: &chrono::DateTime<chrono::FixedOffset>) -> String {
    format!("\"{}\"", date.format("%d-%b-%Y %H:%M:%S %z"))
}

/// True when `flags` holds `flag` (for search evaluation).
pub fn has(flags: &FlagSet, flag: Flags) -> bool {
    flags.system.contains(flag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_sets() {
        assert_eq!(sequence_set(&[1, 2, 3, 5, 7, 8]), "1:3,5,7:8");
        assert_eq!(sequence_set(&[4]), "4");
        assert_eq!(sequence_set(&[]), "");
    }

    #[test]
    fn flags() {
        let f = FlagSet { system: Flags::SEEN.union(Flags::DELETED), keywords: vec!["$Junk".into()] };
        assert_eq!(flag_list(&f), "(\\Seen \\Deleted $Junk)");
        assert_eq!(flag_list(&FlagSet::default()), "()");
    }
}
