//! Content checks by an outside scanner (rspamd, `[filter.rspamd]`), which the
//! acceptance rules (`crate::accept`) ask before anything is stored.
//!
//! - **A verdict** per message from rspamd's `/checkv2` ([`Filter::judge`]),
//!   turned into what becomes of it: refused (`reject`: 550), deferred
//!   (`soft reject`, `greylist`: 451), or delivered with `X-Spam-Score` —
//!   into the Junk mailbox, with `X-Spam: Yes` (and rspamd's subject for
//!   `rewrite subject`), when rspamd says it is spam.
//! - **Bounded cost**: no scanner configured costs nothing; messages over
//!   `max_size` are not sent; a scan takes at most `timeout_ms`; after
//!   `breaker_failures` failures in a row the pod stops asking for
//!   `breaker_retry_secs`, then lets one message probe (the gauge
//!   `mail_filter_rspamd_up`).
//! - **When rspamd cannot say**: `fail_mode = open` delivers the message with
//!   `X-Spam-Status: unchecked`, `closed` defers it (451 4.7.1); both count
//!   `mail_filter_rspamd_failures_total{reason}` and log a warning.
//! - **Learning** ([`Filter::learn`]): messages a user moves or copies into
//!   Junk are sent to `/learnspam`, out of Junk to `/learnham`, by a task of
//!   their own from a bounded queue (full: dropped and counted), so an IMAP
//!   reply never waits on rspamd.

pub mod rspamd;

use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, Opts, Registry};
use tokio::sync::mpsc;

use crate::config::{FailMode, RspamdConfig};
use crate::store::Store;
use mailcluster_model::{Mailbox, SpecialUse};
use rspamd::{Action, Client, Endpoint, Failure};

/// Messages of one COPY or MOVE sent to learning, at most: a user filing a
/// whole mailbox into Junk teaches the classifier no more from the rest.
const LEARN_PER_COMMAND: usize = 100;

/// Scan latency buckets, 1 ms to 10 s.
const SCAN_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The score rspamd gave a message, for the steps after the scan (a Sieve
/// script's spamtest reads it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpamScore {
    pub spam_score: f64,
    /// The score of rspamd's `reject` action: what `spam_score` is measured against.
    pub required_score: f64,
}

/// What becomes of a message after the scan.
#[derive(Debug, Clone, PartialEq)]
pub enum Judged {
    /// Store it: `raw` with the filter's header fields; `junk`: into Junk;
    /// `score`: when rspamd scanned it.
    Deliver { raw: Bytes, junk: bool, score: Option<SpamScore> },
    /// `550 5.7.1` with this text.
    Reject(String),
    /// `451 4.7.1` with this text.
    Defer(String),
}

/// The facts of a message the scanner is told besides its content.
pub struct Scan<'a> {
    pub queue_id: &'a str,
    pub from: &'a str,
    pub recipients: Vec<&'a str>,
    pub ip: Option<IpAddr>,
    pub helo: Option<&'a str>,
    /// The authenticated user, for submitted mail.
    pub user: Option<&'a str>,
    /// This pod's `Authentication-Results` field for the message, if its
    /// checks ran.
    pub authentication_results: Option<&'a str>,
    /// Where the filter's header fields go: after the trace fields the pod
    /// wrote first.
    pub header_at: usize,
}

/// The filter's series (`Metrics::new` registers them with the others).
#[derive(Clone)]
pub struct FilterMetrics {
    /// `mail_filter_rspamd_checks_total{action}`: verdicts by rspamd's action.
    pub checks: IntCounterVec,
    /// `mail_filter_rspamd_failures_total{reason}`: scans without a verdict.
    pub failures: IntCounterVec,
    /// `mail_filter_rspamd_unscanned_total{reason}`: messages not sent (too_large).
    pub unscanned: IntCounterVec,
    /// `mail_filter_rspamd_seconds`: the time of a scan that got an answer.
    pub seconds: Histogram,
    /// `mail_filter_rspamd_learns_total{class,result}` (spam|ham,
    /// sent|failed|dropped).
    pub learns: IntCounterVec,
    /// `mail_filter_rspamd_up`: 0 while the breaker is open.
    pub up: IntGauge,
}

impl FilterMetrics {
    pub fn new() -> FilterMetrics {
        FilterMetrics {
            checks: IntCounterVec::new(
                Opts::new("mail_filter_rspamd_checks_total", "Messages scanned by rspamd, by its action"),
                &["action"],
            )
            .expect("valid metric"),
            failures: IntCounterVec::new(
                Opts::new(
                    "mail_filter_rspamd_failures_total",
                    "Scans without a verdict (timeout, connect, status, answer, breaker_open)",
                ),
                &["reason"],
            )
            .expect("valid metric"),
            unscanned: IntCounterVec::new(
                Opts::new("mail_filter_rspamd_unscanned_total", "Messages not sent to rspamd (too_large)"),
                &["reason"],
            )
            .expect("valid metric"),
            seconds: Histogram::with_opts(
                HistogramOpts::new("mail_filter_rspamd_seconds", "Time of an rspamd scan that answered")
                    .buckets(SCAN_BUCKETS.to_vec()),
            )
            .expect("valid metric"),
            learns: IntCounterVec::new(
                Opts::new(
                    "mail_filter_rspamd_learns_total",
                    "Messages moved into or out of Junk sent to rspamd's classifier",
                ),
                &["class", "result"],
            )
            .expect("valid metric"),
            up: IntGauge::new(
                "mail_filter_rspamd_up",
                "1 while rspamd is asked, 0 while the breaker is open",
            )
            .expect("valid metric"),
        }
    }

    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.checks.clone()))?;
        registry.register(Box::new(self.failures.clone()))?;
        registry.register(Box::new(self.unscanned.clone()))?;
        registry.register(Box::new(self.seconds.clone()))?;
        registry.register(Box::new(self.learns.clone()))?;
        registry.register(Box::new(self.up.clone()))
    }
}

impl Default for FilterMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The process's content filter: nothing, or rspamd.
pub struct Filter {
    rspamd: Option<Rspamd>,
    metrics: FilterMetrics,
}

struct Rspamd {
    client: Client,
    config: RspamdConfig,
    breaker: Breaker,
    learn: Option<mpsc::Sender<LearnRequest>>,
}

/// Messages a user filed into or out of Junk: the destination mailbox and
/// their UIDs there.
struct LearnRequest {
    spam: bool,
    mailbox_id: i64,
    uids: Vec<u32>,
}

impl Filter {
    /// The filter `config` describes; its learning task reads message bodies
    /// from `store`.
    pub fn new(config: &RspamdConfig, store: &std::sync::Arc<dyn Store>, metrics: FilterMetrics) -> Filter {
        let Some(endpoint) = Endpoint::parse(&config.url) else {
            if !config.url.is_empty() {
                tracing::error!(url = %config.url, "filter.rspamd.url is not an http:// URL: no scanning");
            }
            return Filter { rspamd: None, metrics };
        };
        let password = config.password.as_ref().map(|p| p.expose());
        let timeout = Duration::from_millis(config.timeout_ms);
        let client = Client::new(endpoint.clone(), password, timeout);
        let learner = Endpoint::parse(&config.learn_url).unwrap_or(endpoint);
        let learner = Client::new(learner, password, timeout);
        // Learning needs its task; a process without a runtime (none serves
        // IMAP there) only scans.
        let learn = tokio::runtime::Handle::try_current().ok().map(|runtime| {
            let (tx, rx) = mpsc::channel(config.learn_queue.max(1));
            runtime.spawn(learn_task(rx, learner, store.clone(), config.max_size, metrics.clone()));
            tx
        });
        metrics.up.set(1);
        Filter {
            rspamd: Some(Rspamd {
                client,
                config: config.clone(),
                breaker: Breaker::new(
                    config.breaker_failures,
                    Duration::from_secs(config.breaker_retry_secs),
                ),
                learn,
            }),
            metrics,
        }
    }

    /// No filter.
    pub fn disabled() -> Filter {
        Filter { rspamd: None, metrics: FilterMetrics::new() }
    }

    /// Whether a message from an authenticated user is scanned too.
    pub fn scans_submission(&self) -> bool {
        self.rspamd.as_ref().is_some_and(|r| r.config.scan_submission)
    }

    pub fn enabled(&self) -> bool {
        self.rspamd.is_some()
    }

    /// Scans `raw` and says what becomes of it. Without a scanner the message
    /// is delivered unchanged.
    pub async fn judge(&self, scan: &Scan<'_>, raw: Bytes) -> Judged {
        let Some(r) = &self.rspamd else { return Judged::Deliver { raw, junk: false, score: None } };
        if raw.len() as u64 > r.config.max_size {
            self.metrics.unscanned.with_label_values(&["too_large"]).inc();
            let raw = with_fields(&raw, scan.header_at, "X-Spam-Status: unchecked (too large)\r\n", None);
            return Judged::Deliver { raw, junk: false, score: None };
        }
        let verdict = if r.breaker.allow() {
            let envelope = rspamd::Envelope {
                from: scan.from,
                recipients: scan.recipients.clone(),
                ip: scan.ip,
                helo: scan.helo,
                hostname: None,
                user: scan.user,
                queue_id: scan.queue_id,
                auth: scan.authentication_results.map(auth_headers).unwrap_or_default(),
            };
            let started = Instant::now();
            let result = r.client.check(&envelope, raw.clone()).await;
            match &result {
                Ok(_) => {
                    self.metrics.seconds.observe(started.elapsed().as_secs_f64());
                    r.breaker.success(&self.metrics.up);
                }
                Err(_) => r.breaker.failure(&self.metrics.up),
            }
            result
        } else {
            Err(Failure::Breaker)
        };
        let verdict = match verdict {
            Ok(v) => v,
            Err(failure) => {
                self.metrics.failures.with_label_values(&[failure.label()]).inc();
                if failure != Failure::Breaker {
                    tracing::warn!(id = %scan.queue_id, reason = failure.label(), "rspamd gave no verdict");
                }
                return match r.config.fail_mode {
                    FailMode::Open => {
                        let raw = with_fields(&raw, scan.header_at, "X-Spam-Status: unchecked\r\n", None);
                        Judged::Deliver { raw, junk: false, score: None }
                    }
                    FailMode::Closed => Judged::Defer("Content check unavailable; try again later".into()),
                };
            }
        };
        self.metrics.checks.with_label_values(&[verdict.action.label()]).inc();
        let score = SpamScore { spam_score: verdict.score, required_score: verdict.required_score };
        let score_field = format!("X-Spam-Score: {:.2} / {:.2}\r\n", verdict.score, verdict.required_score);
        match verdict.action {
            Action::Reject => {
                tracing::info!(id = %scan.queue_id, score = verdict.score, "refused by rspamd");
                Judged::Reject("Message refused as spam".into())
            }
            Action::SoftReject | Action::Greylist => Judged::Defer("Try again later".into()),
            Action::NoAction => Judged::Deliver {
                raw: with_fields(&raw, scan.header_at, &score_field, None),
                junk: false,
                score: Some(score),
            },
            Action::AddHeader | Action::RewriteSubject => {
                let fields = format!("X-Spam: Yes\r\n{score_field}");
                let subject = verdict.subject.as_deref();
                Judged::Deliver {
                    raw: with_fields(&raw, scan.header_at, &fields, subject),
                    junk: true,
                    score: Some(score),
                }
            }
        }
    }

    /// Queues the messages a user copied or moved from `from` into `to`
    /// (`uids` there) for learning: into Junk as spam, out of Junk (but not
    /// into Trash) as ham. Never waits: a full queue drops them.
    pub fn learn(&self, from: &Mailbox, to: &Mailbox, uids: &[u32]) {
        let Some(tx) = self.rspamd.as_ref().and_then(|r| r.learn.as_ref()) else { return };
        let spam = match (is_junk(from), is_junk(to)) {
            (false, true) => true,
            // Spam thrown away is no judgement that it was ham.
            (true, false) if to.special_use != Some(SpecialUse::Trash) => false,
            _ => return,
        };
        let uids: Vec<u32> = uids.iter().copied().take(LEARN_PER_COMMAND).collect();
        let count = uids.len() as u64;
        if tx.try_send(LearnRequest { spam, mailbox_id: to.id, uids }).is_err() {
            self.metrics.learns.with_label_values(&[class(spam), "dropped"]).inc_by(count);
        }
    }
}

/// The mailbox marked `\Junk`, or named as the one delivery sends junk to.
fn is_junk(mailbox: &Mailbox) -> bool {
    mailbox.special_use == Some(SpecialUse::Junk) || mailbox.name == SpecialUse::Junk.default_name()
}

fn class(spam: bool) -> &'static str {
    if spam { "spam" } else { "ham" }
}

/// Sends the queued messages to rspamd's classifier, one at a time.
async fn learn_task(
    mut rx: mpsc::Receiver<LearnRequest>,
    client: Client,
    store: std::sync::Arc<dyn Store>,
    max_size: u64,
    metrics: FilterMetrics,
) {
    while let Some(request) = rx.recv().await {
        let label = class(request.spam);
        let set = mailcluster_model::UidSet::from_uids(&request.uids);
        let rows = match store.messages_by_uid(request.mailbox_id, &set).await {
            Ok(rows) => rows,
            Err(err) => {
                tracing::warn!(error = %err, "messages to learn not read");
                metrics.learns.with_label_values(&[label, "failed"]).inc_by(request.uids.len() as u64);
                continue;
            }
        };
        for row in rows {
            if u64::from(row.meta.size) > max_size {
                continue;
            }
            let result = match store.message_body(row.message_id).await {
                Ok(body) => client.learn(request.spam, body).await,
                Err(_) => Err(Failure::Answer),
            };
            match result {
                Ok(()) => metrics.learns.with_label_values(&[label, "sent"]).inc(),
                Err(failure) => {
                    tracing::debug!(reason = failure.label(), "rspamd did not learn a message");
                    metrics.learns.with_label_values(&[label, "failed"]).inc();
                }
            }
        }
    }
}

/// After `threshold` failures in a row rspamd is not asked for `retry`; then
/// one scan probes it, and its answer closes the breaker again.
struct Breaker {
    failures: AtomicU32,
    /// While set, no scan before this instant.
    open_until: Mutex<Option<Instant>>,
    threshold: u32,
    retry: Duration,
}

impl Breaker {
    fn new(threshold: u32, retry: Duration) -> Breaker {
        Breaker {
            failures: AtomicU32::new(0),
            open_until: Mutex::new(None),
            threshold: threshold.max(1),
            retry,
        }
    }

    /// Whether this scan may ask rspamd. The first one after the pause is the
    /// probe: the pause starts again for the others until it answers.
    fn allow(&self) -> bool {
        let mut open = self.open_until.lock().unwrap_or_else(|e| e.into_inner());
        match *open {
            None => true,
            Some(until) if Instant::now() >= until => {
                *open = Some(Instant::now() + self.retry);
                true
            }
            Some(_) => false,
        }
    }

    fn success(&self, up: &IntGauge) {
        self.failures.store(0, Ordering::Relaxed);
        let mut open = self.open_until.lock().unwrap_or_else(|e| e.into_inner());
        if open.take().is_some() {
            tracing::info!("rspamd answers again: scanning resumed");
            up.set(1);
        }
    }

    fn failure(&self, up: &IntGauge) {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        if failures < self.threshold {
            return;
        }
        let mut open = self.open_until.lock().unwrap_or_else(|e| e.into_inner());
        if open.is_none() {
            tracing::warn!(
                failures,
                retry_secs = self.retry.as_secs(),
                "rspamd keeps failing: not asked until the next probe"
            );
            up.set(0);
        }
        *open = Some(Instant::now() + self.retry);
    }
}

/// The filter's fields this pod writes, which a message must not bring itself.
const OUR_FIELDS: [&[u8]; 3] = [b"x-spam", b"x-spam-score", b"x-spam-status"];

/// `raw` with `fields` inserted at `at` (the end of the trace fields), the
/// fields of [`OUR_FIELDS`] the message brought removed, and its `Subject`
/// replaced by `subject` when there is one.
fn with_fields(raw: &[u8], at: usize, fields: &str, subject: Option<&str>) -> Bytes {
    let at = at.min(raw.len());
    let header_end = mailcluster_model::message::find_header_end(raw).unwrap_or(raw.len()).max(at);
    let mut out = Vec::with_capacity(raw.len() + fields.len() + 64);
    out.extend_from_slice(&raw[..at]);
    out.extend_from_slice(fields.as_bytes());
    if let Some(subject) = subject {
        out.extend_from_slice(b"Subject: ");
        out.extend_from_slice(encoded_subject(subject).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    // One pass over the header's fields, each with its folded lines.
    let mut skipping = false;
    for line in raw[at..header_end].split_inclusive(|&b| b == b'\n') {
        let folded = line.first().is_some_and(|&b| b == b' ' || b == b'\t');
        if !folded {
            let name = line.iter().position(|&b| b == b':').map(|i| line[..i].trim_ascii_end());
            skipping = name.is_some_and(|name| {
                OUR_FIELDS.iter().any(|f| name.eq_ignore_ascii_case(f))
                    || (subject.is_some() && name.eq_ignore_ascii_case(b"subject"))
            });
        }
        if !skipping {
            out.extend_from_slice(line);
        }
    }
    out.extend_from_slice(&raw[header_end..]);
    Bytes::from(out)
}

/// A subject as a header field's text: control characters dropped, at most
/// 998 octets, and RFC 2047-encoded when it is not ASCII.
pub(crate) fn encoded_subject(subject: &str) -> String {
    use base64::Engine as _;
    let clean: String = subject.chars().filter(|c| !c.is_control()).collect();
    let mut end = clean.len().min(900);
    while !clean.is_char_boundary(end) {
        end -= 1;
    }
    let clean = &clean[..end];
    if clean.is_ascii() {
        return clean.to_string();
    }
    // Encoded words of at most 75 characters (RFC 2047 §2), folded.
    let mut words = Vec::new();
    let mut chunk = String::new();
    for c in clean.chars() {
        if chunk.len() + c.len_utf8() > 45 {
            words.push(std::mem::take(&mut chunk));
        }
        chunk.push(c);
    }
    words.push(chunk);
    words
        .iter()
        .map(|w| format!("=?utf-8?b?{}?=", base64::engine::general_purpose::STANDARD.encode(w)))
        .collect::<Vec<_>>()
        .join("\r\n ")
}

/// Our `Authentication-Results` as rspamd's `SPF`, `DKIM` and `DMARC` request
/// headers (its `http_headers` module: with it enabled, rspamd takes these
/// results instead of checking again).
fn auth_headers(field: &str) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let mut dkim = Vec::new();
    // The first part is the field name and the authserv-id.
    for part in field.split(';').skip(1) {
        let mut words = part.split_whitespace();
        let Some((method, result)) = words.next().and_then(|w| w.split_once('=')) else { continue };
        let rest: Vec<&str> = words.collect();
        let property =
            |name: &str| rest.iter().find_map(|w| w.strip_prefix(name)).map(|v| v.trim_end_matches(';'));
        match method.to_ascii_lowercase().as_str() {
            "spf" => {
                let r = match result {
                    "pass" => "pass",
                    "fail" => "fail",
                    "softfail" => "softfail",
                    "neutral" => "neutral",
                    "temperror" => "tempfail",
                    "permerror" => "permfail",
                    _ => "na",
                };
                out.push(("spf", serde_json::json!({ "result": r }).to_string()));
            }
            "dkim" => {
                let r = match result {
                    "pass" => "pass",
                    "fail" => "fail",
                    "temperror" => "tempfail",
                    "permerror" => "permfail",
                    _ => "na",
                };
                let domain = property("header.d=").unwrap_or("unknown");
                dkim.push(serde_json::json!({ "result": r, "domain": domain }));
            }
            "dmarc" => {
                let r = match result {
                    "pass" => "pass",
                    "fail" => match property("policy.dmarc=") {
                        Some("reject") => "reject",
                        Some("quarantine") => "quarantine",
                        _ => "softfail",
                    },
                    "temperror" => "tempfail",
                    "permerror" => "permfail",
                    _ => "na",
                };
                out.push(("dmarc", serde_json::json!({ "result": r }).to_string()));
            }
            _ => {}
        }
    }
    if !dkim.is_empty() {
        out.push(("dkim", serde_json::json!({ "results": dkim }).to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_go_after_the_trace_and_replace_the_senders_own() {
        let raw = b"Return-Path: <a@b>\r\nX-Spam: No\r\nSubject: hi\r\n there\r\nX-Spam-Score: -99\r\n\tfolded\r\nTo: c@d\r\n\r\nX-Spam: body\r\n";
        let out = with_fields(raw, 20, "X-Spam: Yes\r\n", Some("[SPAM] hi"));
        assert_eq!(
            String::from_utf8_lossy(&out),
            "Return-Path: <a@b>\r\nX-Spam: Yes\r\nSubject: [SPAM] hi\r\nTo: c@d\r\n\r\nX-Spam: body\r\n"
        );
        let out = with_fields(b"Subject: x\r\n\r\nb\r\n", 0, "X-Spam-Score: 1.00 / 15.00\r\n", None);
        assert_eq!(&out[..], b"X-Spam-Score: 1.00 / 15.00\r\nSubject: x\r\n\r\nb\r\n");
    }

    #[test]
    fn subjects_are_one_safe_field() {
        assert_eq!(encoded_subject("a\r\nBcc: x"), "aBcc: x");
        let e = encoded_subject("Ünïcödé");
        assert!(e.starts_with("=?utf-8?b?") && e.ends_with("?="), "{e}");
    }

    #[test]
    fn our_results_become_rspamds_headers() {
        let field = "Authentication-Results: mx.test;\r\n\tdkim=pass header.d=org-a.test header.s=s1 header.b=abc;\r\n\tspf=softfail (x) smtp.mailfrom=a@org-a.test;\r\n\tdmarc=fail header.from=org-a.test policy.dmarc=quarantine\r\n";
        let h = auth_headers(field);
        assert!(h.contains(&("spf", r#"{"result":"softfail"}"#.into())), "{h:?}");
        assert!(h.contains(&("dmarc", r#"{"result":"quarantine"}"#.into())), "{h:?}");
        assert!(
            h.contains(&("dkim", r#"{"results":[{"domain":"org-a.test","result":"pass"}]}"#.into())),
            "{h:?}"
        );
    }

    #[test]
    fn the_breaker_opens_after_the_threshold_and_lets_one_probe() {
        let up = IntGauge::new("up", "up").unwrap();
        let b = Breaker::new(2, Duration::from_millis(50));
        b.failure(&up);
        assert!(b.allow());
        b.failure(&up);
        assert!(!b.allow(), "open after two failures");
        std::thread::sleep(Duration::from_millis(60));
        assert!(b.allow(), "the probe");
        assert!(!b.allow(), "only one probe");
        b.success(&up);
        assert!(b.allow());
        assert_eq!(up.get(), 1);
    }
}
