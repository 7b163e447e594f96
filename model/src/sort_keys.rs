//! Sort keys of a message from its header summaries (`message::address_summary`
//! and the decoded subject): what SORT and THREAD compare (RFC 5256, RFC 5957),
//! derived without the store so that the per-process sort cache and the commands
//! compute them the same way.

use std::borrow::Cow;

/// The first address of a header summary (`message::address_summary`: `Name
/// <local@domain>`, `local@domain` or a name alone, comma-separated; a group as
/// `name: <a@b>, Name <c@d>;`) as its ENVELOPE address structure has it
/// (RFC 3501 §7.4.2): a group's first structure is its start marker, whose
/// mailbox is the group's name. Names are stored decoded and may hold commas: a
/// first segment with an `@` and no `<` is a bare address, one with neither
/// belongs to a name that runs on to the first `<`.
struct FirstAddress<'a> {
    name: &'a str,
    /// addr-mailbox, or the group's name.
    mailbox: &'a str,
    host: &'a str,
}

fn first_address(summary: &str) -> FirstAddress<'_> {
    let summary = summary.trim();
    let none = FirstAddress { name: "", mailbox: "", host: "" };
    if summary.is_empty() {
        return none;
    }
    let open = summary.find('<');
    if let Some(colon) = summary.find(':')
        && open.is_none_or(|o| colon < o)
        && !summary[..colon].contains('@')
        && is_group_rest(&summary[colon + 1..])
    {
        return FirstAddress { name: "", mailbox: summary[..colon].trim(), host: "" };
    }
    let first = summary.split(", ").next().unwrap_or("");
    let (name, spec) = if first.contains('<') {
        let o = first.find('<').unwrap_or(0);
        (&first[..o], first[o + 1..].split('>').next().unwrap_or(""))
    } else if first.contains('@') {
        ("", first)
    } else {
        match open {
            Some(o) => (&summary[..o], summary[o + 1..].split('>').next().unwrap_or("")),
            // A name alone: no mailbox (RFC 3501 addr-mailbox NIL).
            None => (first, ""),
        }
    };
    let spec = spec.trim();
    let (mailbox, host) = spec.rsplit_once('@').unwrap_or((spec, ""));
    FirstAddress { name: name.trim(), mailbox, host }
}

/// What follows a group's `name:` in a summary: its members, each bracketed
/// (`<a@b>`, `Name <a@b>`), then `;`. A display name with a colon in it
/// (`Re: Bob <b@x>`) is followed by no `;`.
fn is_group_rest(rest: &str) -> bool {
    let mut rest = rest.trim_start();
    loop {
        if rest.starts_with(';') {
            return true;
        }
        let Some(close) = rest.find('>') else { return false };
        rest = rest[close + 1..].trim_start();
        match rest.strip_prefix(',') {
            Some(more) => rest = more.trim_start(),
            None => return rest.starts_with(';'),
        }
    }
}

/// SORT FROM / TO / CC (RFC 5256 §3): the addr-mailbox (local part) of the
/// first address; empty when there is none, which sorts before any address.
pub fn first_mailbox(summary: &str) -> &str {
    first_address(summary).mailbox
}

/// SORT DISPLAYFROM / DISPLAYTO (RFC 5957 §3): the display name of the first
/// address if it has one, else `mailbox@host`, else the mailbox (a group's
/// name), else empty.
pub fn first_display(summary: &str) -> Cow<'_, str> {
    let a = first_address(summary);
    match (a.name, a.mailbox, a.host) {
        ("", mailbox, "") => Cow::Borrowed(mailbox),
        ("", mailbox, host) => Cow::Owned(format!("{mailbox}@{host}")),
        (name, _, _) => Cow::Borrowed(name),
    }
}

/// The base subject (RFC 5256 §2.1): whitespace runs made single spaces, and the
/// `Re:`/`Fw:`/`Fwd:` leaders, `[blob]`s, `(fwd)` trailers and `[fwd: …]` wrappers
/// that replies and forwards add taken away, until none is left.
///
/// Also whether a reply or forward marker was taken away (THREAD REFERENCES
/// prefers a thread's original message over replies to it).
pub fn base_subject_of(subject: &str) -> (String, bool) {
    let mut reply = false;
    let mut s: String = subject.split_whitespace().collect::<Vec<_>>().join(" ");
    loop {
        // (2) trailers
        loop {
            let t = s.trim_end();
            // Compared as bytes: the subject is UTF-8, and a byte offset counted
            // from the end may fall inside a character (slicing there panics);
            // an ASCII match ends and starts on character boundaries.
            if t.len() >= 5 && t.as_bytes()[t.len() - 5..].eq_ignore_ascii_case(b"(fwd)") {
                s = t[..t.len() - 5].to_string();
                reply = true;
            } else {
                s = t.to_string();
                break;
            }
        }
        // (3)-(5) leaders and blobs
        loop {
            let before = s.len();
            s = s.trim_start().to_string();
            if let Some(rest) = strip_leader(&s) {
                s = rest.to_string();
                reply = true;
            } else if let Some(rest) = strip_blob(&s)
                && !rest.trim().is_empty()
            {
                s = rest.to_string();
            }
            if s.len() == before {
                break;
            }
        }
        // (6) a forward wrapper
        if s.len() >= 6 && s.as_bytes()[..5].eq_ignore_ascii_case(b"[fwd:") && s.ends_with(']') {
            s = s[5..s.len() - 1].to_string();
            reply = true;
            continue;
        }
        return (s, reply);
    }
}

/// `*subj-blob subj-refwd`: blobs, then `re`/`fw`/`fwd`, optional spaces, an
/// optional blob, and `:`. The rest of the subject after it, if there is one.
fn strip_leader(s: &str) -> Option<&str> {
    let mut rest = s;
    while let Some(r) = strip_blob(rest) {
        rest = r;
    }
    let lower = rest.get(..3).map(str::to_ascii_lowercase).unwrap_or_default();
    rest = if lower == "fwd" {
        &rest[3..]
    } else if lower.starts_with("re") || lower.starts_with("fw") {
        &rest[2..]
    } else {
        return None;
    };
    rest = rest.trim_start();
    if let Some(r) = strip_blob(rest) {
        rest = r;
    }
    rest.strip_prefix(':')
}

/// `"[" *BLOBCHAR "]" *WSP` at the start: the rest after it.
fn strip_blob(s: &str) -> Option<&str> {
    let inner = s.strip_prefix('[')?;
    let close = inner.find(']')?;
    if inner[..close].contains('[') {
        return None;
    }
    Some(inner[close + 1..].trim_start())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_subjects_per_rfc5256() {
        for (subject, base) in [
            ("Hello", "Hello"),
            ("Re: Hello", "Hello"),
            ("RE: re: Fwd: Hello", "Hello"),
            ("Re: [mailcluster] Hello", "Hello"),
            ("[mailcluster] Re: Hello", "Hello"),
            ("Re [2]: Hello", "Hello"),
            ("Fw:  Hello   world (fwd)", "Hello world"),
            ("Hello (fwd) (FWD)", "Hello"),
            ("[Fwd: Re: Hello]", "Hello"),
            ("[only a blob]", "[only a blob]"),
            ("Re:", ""),
            ("Reply to all", "Reply to all"),
            ("Fwd", "Fwd"),
            ("", ""),
            // Multi-byte characters where a marker's byte offset would fall.
            ("Grüße", "Grüße"),
            ("ßßß", "ßßß"),
            ("Re: Größe (fwd)", "Größe"),
            ("[Fwd: Grüße]", "Grüße"),
            ("[Fwd: ßß]", "ßß"),
        ] {
            assert_eq!(base_subject_of(subject).0, base, "{subject:?}");
        }
        // No offset panics, wherever the characters fall.
        let mixed = "[Fwd: Ré: ünïcödé ßß (fwd)]€";
        for (at, _) in mixed.char_indices() {
            base_subject_of(&mixed[at..]);
            base_subject_of(&mixed[..at]);
        }
    }

    #[test]
    fn first_display_is_the_name_else_the_address() {
        assert_eq!(first_display("Alice Smith <alice@example.com>, bob@example.org"), "Alice Smith");
        assert_eq!(first_display("bob@example.org, Alice <alice@example.com>"), "bob@example.org");
        assert_eq!(first_display("Doe, John <john@example.com>, x@y"), "Doe, John");
        // A group's first address structure is its start marker: the group's name.
        assert_eq!(first_display("Team: <x@example.com>, <y@example.com>;"), "Team");
        assert_eq!(first_display("Team: Y <y@example.com>;, z@example.org"), "Team");
        assert_eq!(first_display("Re: Bob <b@example.com>"), "Re: Bob");
        assert_eq!(first_display("Undisclosed recipients: ;"), "Undisclosed recipients");
        assert_eq!(first_display("Only A Name"), "Only A Name");
        assert_eq!(first_display("Grüße <g@example.de>"), "Grüße");
        assert_eq!(first_display(""), "");
    }

    #[test]
    fn first_mailbox_is_the_local_part_of_the_first_address() {
        assert_eq!(first_mailbox("Alice <alice@example.com>, bob@example.org"), "alice");
        assert_eq!(first_mailbox("\"Doe, John\" <john@example.com>"), "john");
        assert_eq!(first_mailbox("bob@example.org, carol@example.org"), "bob");
        // The first address, not the first bracketed one.
        assert_eq!(first_mailbox("bob@example.org, Alice <alice@example.com>"), "bob");
        assert_eq!(first_mailbox("Doe, John <john@example.com>, x@y"), "john");
        assert_eq!(first_mailbox("Team: <x@example.com>, <y@example.com>;"), "Team");
        assert_eq!(first_mailbox("Empty: ;, a@example.com"), "Empty");
        assert_eq!(first_mailbox("Only A Name"), "");
        assert_eq!(first_mailbox(""), "");
    }
}
