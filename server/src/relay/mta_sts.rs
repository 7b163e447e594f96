//! MTA-STS (RFC 8461): a receiving domain's published demand that mail to it use
//! TLS with a certificate valid for its MX hosts, and only to the MX hosts it lists.
//!
//! Discovery is the `_mta-sts.DOMAIN` TXT record (its `id` says when the policy
//! changed); the policy is fetched over verified HTTPS from
//! `https://mta-sts.DOMAIN/.well-known/mta-sts.txt` and cached for its `max_age`.
//! A policy that cannot be fetched is treated as none unless one is cached (§5.1).
//! In `enforce` mode the relay only uses MX hosts the policy names, requires
//! STARTTLS and verifies the certificate; `testing` mode only logs.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mail_auth::mta_sts::MtaSts;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::dns::Dns;

/// Largest policy body read (RFC 8461 §3.3: 64 KiB).
const MAX_POLICY_BYTES: usize = 64 * 1024;
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest time a policy is kept (RFC 8461 §3.2: max_age at most 31557600).
const MAX_AGE_CAP: u64 = 31_557_600;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Enforce,
    Testing,
    None,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub mode: Mode,
    /// `mx` patterns: a host name, or `*.` and a domain (one leftmost label).
    pub mx: Vec<String>,
    pub max_age: u64,
}

impl Policy {
    /// RFC 8461 §3.2: `key: value` lines; version STSv1, mode, max_age and (for
    /// enforce and testing) at least one mx are required.
    pub fn parse(text: &str) -> Result<Policy, String> {
        let (mut version, mut mode, mut max_age, mut mx) = (None, None, None, Vec::new());
        for line in text.lines() {
            let Some((key, value)) = line.split_once(':') else { continue };
            let value = value.trim();
            match key.trim() {
                "version" => version = Some(value.to_string()),
                "mode" => {
                    mode = Some(match value {
                        "enforce" => Mode::Enforce,
                        "testing" => Mode::Testing,
                        "none" => Mode::None,
                        other => return Err(format!("unknown mode {other:?}")),
                    })
                }
                "max_age" => max_age = value.parse::<u64>().ok(),
                "mx" => mx.push(value.trim_end_matches('.').to_ascii_lowercase()),
                _ => {}
            }
        }
        if version.as_deref() != Some("STSv1") {
            return Err("not an STSv1 policy".into());
        }
        let mode = mode.ok_or("no mode")?;
        let max_age = max_age.ok_or("no max_age")?.min(MAX_AGE_CAP);
        if mode != Mode::None && mx.is_empty() {
            return Err("no mx".into());
        }
        Ok(Policy { mode, mx, max_age })
    }

    /// Whether `host` (an MX host name) is one the policy allows (§4.1).
    pub fn allows(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.mx.iter().any(|pattern| match pattern.strip_prefix("*.") {
            Some(parent) => {
                host.split_once('.').is_some_and(|(label, rest)| !label.is_empty() && rest == parent)
            }
            None => *pattern == host,
        })
    }
}

struct Cached {
    id: String,
    policy: Policy,
    until: Instant,
}

/// Policies of the domains this pod sends to.
pub struct MtaStsCache {
    entries: Mutex<HashMap<String, Cached>>,
    tls: tokio_rustls::TlsConnector,
    /// 443, except in tests.
    port: u16,
}

impl MtaStsCache {
    pub fn new(tls: tokio_rustls::TlsConnector, port: u16) -> MtaStsCache {
        MtaStsCache { entries: Mutex::new(HashMap::new()), tls, port }
    }

    /// The policy `domain` publishes, if any.
    pub async fn policy(&self, dns: &Dns, domain: &str) -> Option<Policy> {
        let record = dns
            .authenticator
            .txt_lookup::<MtaSts>(format!("_mta-sts.{domain}."), Some(&dns.caches.txt))
            .await;
        let cached = {
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            entries.get(domain).filter(|c| c.until > Instant::now()).map(|c| (c.id.clone(), c.policy.clone()))
        };
        let Ok(record) = record else {
            // No record (or no answer): a cached policy still holds until it expires.
            return cached.map(|(_, p)| p);
        };
        if let Some((id, policy)) = &cached
            && *id == record.id
        {
            return Some(policy.clone());
        }
        match self.fetch(dns, domain).await {
            Ok(policy) => {
                let until = Instant::now() + Duration::from_secs(policy.max_age);
                let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
                entries.insert(
                    domain.to_string(),
                    Cached { id: record.id.clone(), policy: policy.clone(), until },
                );
                Some(policy)
            }
            Err(e) => {
                tracing::info!(domain, error = %e, "MTA-STS policy not fetched");
                cached.map(|(_, p)| p)
            }
        }
    }

    /// GET the policy over HTTPS with a verified certificate (HTTP/1.0: no
    /// chunked body to decode), no redirects.
    async fn fetch(&self, dns: &Dns, domain: &str) -> Result<Policy, String> {
        let host = format!("mta-sts.{domain}");
        let addrs = dns.addresses(&host).await.map_err(|e| e.to_string())?;
        let ip = *addrs.first().ok_or_else(|| format!("{host} has no address"))?;
        let name = rustls::pki_types::ServerName::try_from(host.clone()).map_err(|e| e.to_string())?;
        let body = tokio::time::timeout(FETCH_TIMEOUT, async {
            let tcp = tokio::net::TcpStream::connect((ip, self.port)).await.map_err(|e| e.to_string())?;
            let mut tls = self.tls.connect(name, tcp).await.map_err(|e| format!("TLS: {e}"))?;
            let request = format!(
                "GET /.well-known/mta-sts.txt HTTP/1.0\r\nHost: {host}\r\nUser-Agent: mailcluster\r\n\r\n"
            );
            tls.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
            let mut response = Vec::new();
            let mut chunk = [0u8; 8192];
            loop {
                let n = match tls.read(&mut chunk).await {
                    Ok(n) => n,
                    // A server that closes without close_notify has still sent its body.
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => 0,
                    Err(e) => return Err(e.to_string()),
                };
                if n == 0 {
                    break;
                }
                response.extend_from_slice(&chunk[..n]);
                if response.len() > MAX_POLICY_BYTES + 8192 {
                    return Err("policy too large".into());
                }
            }
            Ok::<Vec<u8>, String>(response)
        })
        .await
        .map_err(|_| "timed out".to_string())??;
        let text = String::from_utf8_lossy(&body);
        let (head, body) = text.split_once("\r\n\r\n").ok_or("malformed HTTP response")?;
        let status = head.lines().next().unwrap_or("");
        if status.split_whitespace().nth(1) != Some("200") {
            return Err(format!("HTTP status {status:?}"));
        }
        Policy::parse(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rfc_example_and_matches_patterns() {
        let p = Policy::parse(
            "version: STSv1\r\nmode: enforce\r\nmx: mail.example.com\r\nmx: *.example.net\r\nmx: backupmx.example.com\r\nmax_age: 604800\r\n",
        )
        .unwrap();
        assert_eq!(p.mode, Mode::Enforce);
        assert_eq!(p.max_age, 604800);
        assert!(p.allows("mail.example.com") && p.allows("MAIL.example.com."));
        assert!(p.allows("mx1.example.net"));
        assert!(!p.allows("a.b.example.net"), "a wildcard covers one label");
        assert!(!p.allows("example.net") && !p.allows("evil.example.org"));
    }

    #[test]
    fn refuses_incomplete_policies() {
        assert!(Policy::parse("mode: enforce\nmx: a\nmax_age: 1\n").is_err());
        assert!(Policy::parse("version: STSv1\nmode: enforce\nmax_age: 1\n").is_err());
        assert!(Policy::parse("version: STSv1\nmode: strict\nmx: a\nmax_age: 1\n").is_err());
        assert_eq!(
            Policy::parse("version: STSv1\nmode: none\nmax_age: 99999999999\n").unwrap().max_age,
            MAX_AGE_CAP
        );
    }
}
