//! Who really sent mail arriving on the MX: SPF (RFC 7208), DKIM (RFC 6376),
//! ARC (RFC 8617) and DMARC (RFC 7489), by the `mail-auth` crate, with the
//! result recorded in an `Authentication-Results` header (RFC 8601) and the
//! sender domain's DMARC policy honoured.
//!
//! DNS work for one message runs under one time budget; running out of it, or a
//! resolver failure that leaves the verdict open, defers the message (451)
//! instead of letting it pass unchecked.

use std::net::IpAddr;
use std::time::Duration;

use mail_auth::common::headers::HeaderWriter;
use mail_auth::common::verify::DomainKey;
use mail_auth::dmarc::verify::DmarcParameters;
use mail_auth::dmarc::{Dmarc, Policy};
use mail_auth::spf::Spf;
use mail_auth::spf::verify::SpfParameters;
use mail_auth::{AuthenticatedMessage, AuthenticationResults, DkimResult, DmarcResult, SpfResult};

use crate::dns::Dns;
use mailcluster_api::config::InboundAuthConfig;

/// What to do with the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Deliver, with this `Authentication-Results` header field (CRLF-terminated)
    /// on top; `junk`: into the recipients' Junk mailbox (DMARC p=quarantine);
    /// `verified`: the MAIL FROM domain passed SPF or the message passed DMARC,
    /// so reports may go to the sender (anyone else's address may be forged).
    Accept { header: String, junk: bool, verified: bool },
    /// 550 5.7.1 with this text (DMARC p=reject).
    Reject(String),
    /// 451 with this enhanced status and text.
    Defer(&'static str, String),
}

/// The session facts the checks use.
pub struct Envelope<'a> {
    pub remote_ip: IpAddr,
    pub helo: &'a str,
    /// The MAIL FROM address; empty for the null sender.
    pub mail_from: &'a str,
}

pub async fn check(
    dns: &Dns,
    config: &InboundAuthConfig,
    authserv_id: &str,
    envelope: &Envelope<'_>,
    message: &[u8],
) -> Verdict {
    let budget = Duration::from_millis(config.dns_budget_ms);
    match tokio::time::timeout(budget, evaluate(dns, config, authserv_id, envelope, message)).await {
        Ok(verdict) => verdict,
        Err(_) => {
            Verdict::Defer("4.4.3", "Sender authentication DNS lookups took too long; try again later".into())
        }
    }
}

async fn evaluate(
    dns: &Dns,
    config: &InboundAuthConfig,
    authserv_id: &str,
    envelope: &Envelope<'_>,
    message: &[u8],
) -> Verdict {
    let auth = &dns.authenticator;
    let helo = if envelope.helo.is_empty() { "unknown" } else { envelope.helo };
    // SPF checks the HELO identity, then the MAIL FROM domain (RFC 7208 §2.3).
    let mail_from_spf = envelope.mail_from.rsplit_once('@').map(|(_, d)| d).filter(|d| *d != helo);
    tokio::join!(dns.share_txt::<Spf>(helo), async {
        if let Some(d) = mail_from_spf {
            dns.share_txt::<Spf>(d).await;
        }
    });
    let spf = auth
        .verify_spf(dns.params(SpfParameters::verify(
            envelope.remote_ip,
            helo,
            authserv_id,
            envelope.mail_from,
        )))
        .await;
    let mail_from_domain = match envelope.mail_from.rsplit_once('@') {
        Some((_, d)) => d,
        None => helo,
    };
    let mut results = AuthenticationResults::new(authserv_id);
    results = if envelope.mail_from.is_empty() {
        results.with_spf_ehlo_result(&spf, envelope.remote_ip, helo)
    } else {
        results.with_spf_mailfrom_result(&spf, envelope.remote_ip, envelope.mail_from, helo)
    };
    let Some(parsed) = AuthenticatedMessage::parse(message) else {
        // Not a message the checks can read (no header section): SPF alone speaks.
        if spf.result() == SpfResult::TempError {
            return Verdict::Defer("4.4.3", "Temporary DNS failure checking SPF; try again later".into());
        }
        let verified = spf.result() == SpfResult::Pass && !envelope.mail_from.is_empty();
        return Verdict::Accept { header: results.to_header(), junk: false, verified };
    };
    let header_from = parsed.from.first().cloned().unwrap_or_default();
    // The other names known before the checks run: each signature's key and the
    // From domain's DMARC record.
    let keys: Vec<String> =
        parsed.dkim_headers.iter().map(|h| format!("{}._domainkey.{}", h.header.s, h.header.d)).collect();
    let dmarc_names = header_from.rsplit_once('@').map(|(_, d)| dmarc_tree_walk(d)).unwrap_or_default();
    tokio::join!(
        futures::future::join_all(keys.iter().map(|n| dns.share_txt::<DomainKey>(n))),
        futures::future::join_all(dmarc_names.iter().map(|n| dns.share_txt::<Dmarc>(n))),
    );
    let dkim = auth.verify_dkim(dns.params(&parsed)).await;
    let arc = auth.verify_arc(dns.params(&parsed)).await;
    let dmarc =
        auth.verify_dmarc(dns.params(DmarcParameters::new(&parsed, &dkim, mail_from_domain, &spf))).await;
    results = results
        .with_dkim_results(&dkim, &header_from)
        .with_arc_result(&arc, envelope.remote_ip)
        .with_dmarc_result(&dmarc);
    let header = results.to_header();

    let dmarc_result = dmarc.result();
    let temp = matches!(dmarc_result, DmarcResult::TempError(_))
        || (dmarc_result != DmarcResult::Pass
            && (spf.result() == SpfResult::TempError
                || dkim.iter().any(|d| matches!(d.result(), DkimResult::TempError(_)))));
    if temp {
        return Verdict::Defer("4.4.3", "Temporary DNS failure checking the sender; try again later".into());
    }
    let verified = dmarc_result == DmarcResult::Pass
        || (spf.result() == SpfResult::Pass && !envelope.mail_from.is_empty());
    if config.enforce_dmarc && matches!(dmarc_result, DmarcResult::Fail(_)) {
        match dmarc.policy() {
            Policy::Reject => {
                // The domain comes from the message's From: field, where a bare
                // CR or other control characters may sit: the reply is one line.
                let domain: String = dmarc.domain().chars().filter(|c| !c.is_control()).take(253).collect();
                return Verdict::Reject(format!(
                    "Message rejected by the DMARC policy of {domain} (RFC 7489)"
                ));
            }
            Policy::Quarantine => return Verdict::Accept { header, junk: true, verified },
            Policy::None | Policy::Unspecified => {}
        }
    }
    Verdict::Accept { header, junk: false, verified }
}

/// Removes the `Authentication-Results` fields of the header section starting
/// at `start` whose authserv-id is `authserv_id` (RFC 8601 §5: a receiver must
/// not let results that claim to be its own arrive from outside, or a forged
/// `dkim=pass` would read as this server's verdict). Other servers' results
/// stay. One pass over the header, whatever its shape.
pub fn remove_our_results(raw: &mut Vec<u8>, start: usize, authserv_id: &str) {
    // In place: every message from outside passes here, and one that carries no
    // such field (nearly all) must cost neither a copy nor an allocation. Kept
    // fields move down over removed ones; the rest moves once, if at all.
    let mut at = start.min(raw.len());
    let mut write = at;
    while at < raw.len() {
        // a field: its line and the continuation lines after it
        let mut end = at;
        loop {
            end = memchr::memchr(b'\n', &raw[end..]).map_or(raw.len(), |p| end + p + 1);
            if end >= raw.len() || !matches!(raw[end], b' ' | b'\t') {
                break;
            }
        }
        let field = &raw[at..end];
        if field == b"\r\n" || field == b"\n" {
            break;
        }
        if !is_our_result(field, authserv_id) {
            if write != at {
                raw.copy_within(at..end, write);
            }
            write += end - at;
        }
        at = end;
    }
    if write != at {
        raw.drain(write..at);
    }
}

/// Whether a header field is `Authentication-Results` naming `authserv_id`.
fn is_our_result(field: &[u8], authserv_id: &str) -> bool {
    const NAME: &[u8] = b"authentication-results";
    let Some(colon) = memchr::memchr(b':', field) else { return false };
    if !field[..colon].trim_ascii_end().eq_ignore_ascii_case(NAME) {
        return false;
    }
    // CFWS, then the authserv-id: a token or a quoted string (RFC 8601 §2.2)
    let value = &field[colon + 1..];
    let mut i = 0;
    let mut depth = 0usize;
    while i < value.len() {
        match value[i] {
            b'(' => depth += 1,
            b')' if depth > 0 => depth -= 1,
            b'\\' if depth > 0 => i += 1,
            b' ' | b'\t' | b'\r' | b'\n' => {}
            _ if depth > 0 => {}
            _ => break,
        }
        i += 1;
    }
    let rest = &value[i.min(value.len())..];
    let id: Vec<u8> = match rest.strip_prefix(b"\"") {
        Some(quoted) => quoted.iter().take_while(|&&b| b != b'"').copied().collect(),
        None => rest
            .iter()
            .take_while(|&&b| !matches!(b, b';' | b' ' | b'\t' | b'\r' | b'\n' | b'('))
            .copied()
            .collect(),
    };
    id.eq_ignore_ascii_case(authserv_id.as_bytes())
}

/// The names the DMARC tree walk (RFC 9989 §4.10) asks, as mail-auth walks it: the
/// domain itself, then at most seven labels, then one label fewer at a time down to
/// the top-level domain. Empty below two labels (mail-auth asks nothing then).
fn dmarc_tree_walk(domain: &str) -> Vec<String> {
    let labels: Vec<&str> = domain.trim_end_matches('.').split('.').filter(|l| !l.is_empty()).collect();
    let total = labels.len();
    let mut names = Vec::new();
    if total < 2 {
        return names;
    }
    let mut count = total;
    loop {
        names.push(format!("_dmarc.{}", labels[total - count..].join(".")));
        if count == 1 {
            break;
        }
        count = if count >= 8 { 7 } else { count - 1 };
    }
    names
}

#[cfg(test)]
mod tests {
    use super::{dmarc_tree_walk, remove_our_results};

    #[test]
    fn our_authentication_results_are_removed_and_others_kept() {
        let header = "Return-Path: <a@b.test>\r\n\
            Authentication-Results: mx.example.org; dkim=pass\r\n\
            authentication-results :(comment (nested)) \"MX.Example.Org\";\r\n\tspf=pass\r\n\
            Authentication-Results: mx.example.org.evil; dkim=pass\r\n\
            Authentication-Results: other.test; dkim=fail\r\n\
            Subject: s\r\n\r\n\
            Authentication-Results: mx.example.org; in the body\r\n";
        let mut raw = header.as_bytes().to_vec();
        remove_our_results(&mut raw, 0, "mx.example.org");
        let out = String::from_utf8(raw).unwrap();
        assert_eq!(
            out,
            "Return-Path: <a@b.test>\r\n\
             Authentication-Results: mx.example.org.evil; dkim=pass\r\n\
             Authentication-Results: other.test; dkim=fail\r\n\
             Subject: s\r\n\r\n\
             Authentication-Results: mx.example.org; in the body\r\n"
        );
        let mut untouched = b"Subject: x\r\n\r\nbody".to_vec();
        remove_our_results(&mut untouched, 0, "mx.example.org");
        assert_eq!(untouched, b"Subject: x\r\n\r\nbody");
    }

    #[test]
    fn dmarc_tree_walk_names() {
        assert_eq!(dmarc_tree_walk("org-a.test"), ["_dmarc.org-a.test", "_dmarc.test"]);
        assert_eq!(
            dmarc_tree_walk("a.b.example.com."),
            ["_dmarc.a.b.example.com", "_dmarc.b.example.com", "_dmarc.example.com", "_dmarc.com"]
        );
        let deep = dmarc_tree_walk("1.2.3.4.5.6.7.8.9.example");
        assert_eq!(deep.len(), 8, "{deep:?}");
        assert_eq!(deep[1], "_dmarc.4.5.6.7.8.9.example", "then seven labels");
        assert!(dmarc_tree_walk("localhost").is_empty());
    }
}
