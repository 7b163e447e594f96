//! Workload inputs: test users, generated MIME messages, durations and sizes.
//!
//! Messages are built once per run (a few variants per size class) with
//! mail-builder and kept dot-stuffed, so sending one costs a `write_all` and no
//! per-message formatting: at 10,000 deliveries/s building MIME per message would
//! cost the generator more than the server.

use std::time::Duration;

use anyhow::{Context, bail};
use mail_builder::MessageBuilder;
use mailcluster_api::stress::{MessageSize, UsersSpec};

use crate::client::smtp::dot_stuff;

/// Test accounts (name, password).
#[derive(Clone, Debug)]
pub struct Users {
    pub list: Vec<(String, String)>,
}

/// Users above this count are refused: the list is held in memory and a typo in
/// `count` should not allocate gigabytes.
const MAX_USERS: u32 = 10_000_000;

impl Users {
    pub fn from_spec(spec: &UsersSpec) -> anyhow::Result<Users> {
        if let Some(file) = &spec.file {
            let text = std::fs::read_to_string(file).with_context(|| format!("reading users file {file}"))?;
            return Users::parse_file(&text, &spec.password);
        }
        if spec.count == 0 || spec.count > MAX_USERS {
            bail!("users count must be 1..={MAX_USERS}");
        }
        let list = (spec.first..spec.first.saturating_add(spec.count))
            .map(|n| (expand_template(&spec.template, n), spec.password.clone()))
            .collect();
        Ok(Users { list })
    }

    /// One user per line: `name password`, `name:password` or just `name` (default
    /// password). Blank lines and `#` comments are skipped.
    pub fn parse_file(text: &str, default_password: &str) -> anyhow::Result<Users> {
        let mut list = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (u, p) = match line.split_once(|c: char| c.is_whitespace() || c == ':') {
                Some((u, p)) => (u.trim(), p.trim()),
                None => (line, default_password),
            };
            list.push((u.to_string(), p.to_string()));
        }
        if list.is_empty() {
            bail!("users file lists no users");
        }
        Ok(Users { list })
    }

    pub fn get(&self, i: usize) -> (&str, &str) {
        let (u, p) = &self.list[i % self.list.len()];
        (u, p)
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// `user{:04}@x` with 7 → `user0007@x`; `{}` → plain number.
pub fn expand_template(template: &str, n: u32) -> String {
    let mut out = String::with_capacity(template.len() + 8);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('}') else {
            out.push_str(&rest[open..]);
            return out;
        };
        let spec = &rest[open + 1..open + close];
        match spec.strip_prefix(":0").and_then(|w| w.parse::<usize>().ok()) {
            Some(width) => out.push_str(&format!("{n:0width$}")),
            None if spec.is_empty() || spec == ":" => out.push_str(&n.to_string()),
            None => out.push_str(&rest[open..=open + close]),
        }
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

/// Parse `500ms`, `30s`, `2m`, `1h`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let s = s.trim();
    let (num, mult) = if let Some(v) = s.strip_suffix("ms") {
        (v, 0.001)
    } else if let Some(v) = s.strip_suffix('s') {
        (v, 1.0)
    } else if let Some(v) = s.strip_suffix('m') {
        (v, 60.0)
    } else if let Some(v) = s.strip_suffix('h') {
        (v, 3600.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num.trim().parse().with_context(|| format!("invalid duration {s:?}"))?;
    if !v.is_finite() || v < 0.0 || v * mult > 7.0 * 86400.0 {
        bail!("duration {s:?} out of range (0..7 days)");
    }
    Ok(Duration::from_secs_f64(v * mult))
}

/// `4096`, `4k`, `64KiB`, `1M` → bytes.
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.trim_end_matches("ib").trim_end_matches('b');
    let (num, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1024),
        Some('m') => (&t[..t.len() - 1], 1024 * 1024),
        _ => (t, 1),
    };
    let v: u64 = num.trim().parse().with_context(|| format!("invalid size {s:?}"))?;
    Ok(v * mult)
}

/// Largest message the generator builds (keeps a typo from allocating gigabytes).
const MAX_MESSAGE: u64 = 64 * 1024 * 1024;
const VARIANTS: usize = 4;

/// Pre-built messages by size class, with cumulative weights for picking.
pub struct Messages {
    classes: Vec<(u64, Vec<Vec<u8>>)>,
    total_weight: u64,
}

impl Messages {
    pub fn build(sizes: &[MessageSize]) -> anyhow::Result<Messages> {
        let default = [MessageSize { bytes: 4096, weight: 1, attachment: false }];
        let sizes = if sizes.is_empty() { &default[..] } else { sizes };
        let mut classes = Vec::new();
        let mut acc = 0u64;
        for s in sizes {
            if s.bytes > MAX_MESSAGE {
                bail!("message size {} above the {MAX_MESSAGE}-byte limit", s.bytes);
            }
            if s.weight == 0 {
                continue;
            }
            acc += s.weight as u64;
            let variants = (0..VARIANTS).map(|v| build_message(s.bytes, s.attachment, v)).collect();
            classes.push((acc, variants));
        }
        if classes.is_empty() {
            bail!("every message size has weight 0");
        }
        Ok(Messages { classes, total_weight: acc })
    }

    /// Pick a message from a uniform random number.
    pub fn pick(&self, r: u64) -> &[u8] {
        let w = r % self.total_weight;
        let class = self.classes.iter().find(|(cum, _)| w < *cum).unwrap_or(&self.classes[0]);
        let v = (r / self.total_weight) as usize % class.1.len();
        &class.1[v]
    }
}

/// A real MIME message of roughly `bytes` bytes, dot-stuffed and terminated, without
/// a `From:` header: the sender writes its own in front (see `engine`), so one pool
/// serves every sender and the header always matches the envelope.
pub fn build_message(bytes: u64, attachment: bool, variant: usize) -> Vec<u8> {
    // Headers and MIME structure take ~400 bytes; the rest is body.
    let body_len = bytes.saturating_sub(400) as usize;
    let line = "The quick brown fox jumps over the lazy dog while the mail queue drains. ";
    let mut text = String::with_capacity(body_len.min(4096) + 80);
    let text_len = if attachment { body_len.min(512) } else { body_len };
    while text.len() < text_len {
        text.push_str(line);
        if text.len() % 1000 < line.len() {
            text.push_str("\r\n");
        }
    }
    text.truncate(text_len.max(1));
    let subject = format!("stress message {bytes} bytes #{variant}");
    let mut b = MessageBuilder::new()
        .to(("Recipient", "rcpt@example.test"))
        .subject(subject)
        .message_id(format!("stress.{bytes}.{variant}@example.test"))
        .text_body(text);
    if attachment {
        // Base64 inflates by 4/3; aim the encoded size at the requested total.
        let raw = body_len.saturating_sub(512) * 3 / 4;
        let data: Vec<u8> =
            (0..raw).map(|i| (i as u8).wrapping_mul(31).wrapping_add(variant as u8)).collect();
        b = b.attachment("application/octet-stream", format!("data-{variant}.bin"), data);
    }
    let raw = b.write_to_vec().unwrap_or_default();
    dot_stuff(&without_header(&raw, b"message-id"))
}

/// `raw` without the header field `name` (lower case): the builder always writes a
/// Message-ID, and each send writes its own unique one instead.
fn without_header(raw: &[u8], name: &[u8]) -> Vec<u8> {
    let header_end = raw.windows(4).position(|w| w == b"\r\n\r\n").map_or(raw.len(), |p| p + 2);
    let mut out = Vec::with_capacity(raw.len());
    let mut skipping = false;
    for line in raw[..header_end].split_inclusive(|&b| b == b'\n') {
        let continuation = line.first().is_some_and(|b| *b == b' ' || *b == b'\t');
        if !continuation {
            skipping = line.len() > name.len()
                && line[..name.len()].eq_ignore_ascii_case(name)
                && line[name.len()] == b':';
        }
        if !skipping {
            out.extend_from_slice(line);
        }
    }
    out.extend_from_slice(&raw[header_end..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooled_messages_carry_no_message_id() {
        let m = build_message(4096, false, 3);
        let text = String::from_utf8_lossy(&m);
        let (head, body) = text.split_once("\r\n\r\n").expect("header and body");
        assert!(!head.to_ascii_lowercase().contains("message-id:"), "{head}");
        assert!(head.contains("Subject: stress message 4096 bytes #3"), "{head}");
        assert!(body.contains("quick brown fox"));
        let folded = b"A: 1\r\nMessage-ID:\r\n <x@y>\r\nB: 2\r\n\r\nMessage-ID: body\r\n";
        assert_eq!(without_header(folded, b"message-id"), b"A: 1\r\nB: 2\r\n\r\nMessage-ID: body\r\n");
    }

    #[test]
    fn templates() {
        assert_eq!(expand_template("user{:04}@example.test", 7), "user0007@example.test");
        assert_eq!(expand_template("u{}", 12), "u12");
        assert_eq!(expand_template("plain", 1), "plain");
        assert_eq!(expand_template("odd{x}", 1), "odd{x}");
        assert_eq!(expand_template("open{", 1), "open{");
    }

    #[test]
    fn users_file() {
        let u = Users::parse_file("# c\nalice pw1\nbob:pw2\n\ncarol\n", "dflt").expect("users");
        assert_eq!(u.list[0], ("alice".into(), "pw1".into()));
        assert_eq!(u.list[1], ("bob".into(), "pw2".into()));
        assert_eq!(u.list[2], ("carol".into(), "dflt".into()));
        assert!(Users::parse_file("# only comments\n", "x").is_err());
        let spec = UsersSpec { count: 3, first: 9, ..Default::default() };
        let u = Users::from_spec(&spec).expect("users");
        assert_eq!(u.get(0).0, "user0009@example.test");
        assert_eq!(u.get(4).0, "user0010@example.test");
    }

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration("500ms").ok(), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m").ok(), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("3").ok(), Some(Duration::from_secs(3)));
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("soon").is_err());
        assert_eq!(parse_size("64KiB").ok(), Some(65536));
        assert_eq!(parse_size("1M").ok(), Some(1 << 20));
        assert_eq!(parse_size("4096").ok(), Some(4096));
    }

    #[test]
    fn messages_are_mime_of_requested_size() {
        for (size, att) in [(4096u64, false), (65536, true), (1 << 20, true)] {
            let m = build_message(size, att, 1);
            let len = m.len() as f64;
            assert!((len - size as f64).abs() / (size as f64) < 0.15, "size {size}: got {len}");
            assert!(m.ends_with(b"\r\n.\r\n"));
            let text = String::from_utf8_lossy(&m);
            assert!(text.contains("MIME-Version: 1.0"));
            assert!(!text.starts_with("From:") && !text.contains("\nFrom:"), "sender-neutral: {text:.300}");
            if att {
                assert!(text.contains("multipart/mixed"));
                assert!(text.contains("Content-Transfer-Encoding: base64"));
            }
        }
        let pool = Messages::build(&[
            MessageSize { bytes: 1000, weight: 3, attachment: false },
            MessageSize { bytes: 20000, weight: 1, attachment: true },
        ])
        .expect("pool");
        let big = (0..4000u64).filter(|r| pool.pick(r.wrapping_mul(2654435761)).len() > 10_000).count();
        assert!((700..1300).contains(&big), "{big}");
    }
}
