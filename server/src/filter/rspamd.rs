//! rspamd's HTTP interface: `/checkv2` for a verdict, `/learnspam` and
//! `/learnham` for its classifier, over hyper's HTTP/1.1 client connections
//! (plain HTTP, as rspamd is reached inside the cluster).
//!
//! Every request is bounded: the whole exchange, connect to last byte, within
//! the configured time, and the answer's body at [`MAX_ANSWER`]. Idle
//! connections are kept for the next request, [`IDLE_CONNECTIONS`] at most.

use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use serde::Deserialize;

/// The largest answer taken from rspamd: a verdict with every symbol's
/// description fits in a fraction of this.
pub const MAX_ANSWER: usize = 256 * 1024;

/// Idle connections kept per rspamd address.
const IDLE_CONNECTIONS: usize = 32;

/// Where rspamd listens: `http://host:port[/prefix]`.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `host:port`, for connecting and the `Host` header.
    authority: String,
    /// The path before `/checkv2` (a proxy's prefix), without a trailing `/`.
    prefix: String,
}

impl Endpoint {
    /// None for anything but an `http://` URL.
    pub fn parse(url: &str) -> Option<Endpoint> {
        let rest = url.strip_prefix("http://")?;
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if authority.is_empty() || authority.contains('@') {
            return None;
        }
        // A port is needed to connect; rspamd has no standard one on port 80.
        let has_port = match authority.rsplit_once(':') {
            Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok() && !port.is_empty(),
            None => false,
        };
        let authority = if has_port { authority.to_string() } else { format!("{authority}:80") };
        Some(Endpoint { authority, prefix: path.trim_end_matches('/').to_string() })
    }
}

/// Why rspamd gave no verdict; the label of `mail_filter_rspamd_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The whole exchange took longer than the time allowed.
    Timeout,
    /// No connection, or it broke.
    Connect,
    /// An HTTP status other than 200.
    Status,
    /// A body larger than [`MAX_ANSWER`], or not the JSON rspamd sends.
    Answer,
    /// The breaker is open: rspamd was not asked.
    Breaker,
}

impl Failure {
    pub fn label(self) -> &'static str {
        match self {
            Failure::Timeout => "timeout",
            Failure::Connect => "connect",
            Failure::Status => "status",
            Failure::Answer => "answer",
            Failure::Breaker => "breaker_open",
        }
    }
}

/// rspamd's action for a message (its `action` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    NoAction,
    Greylist,
    AddHeader,
    RewriteSubject,
    SoftReject,
    Reject,
}

impl Action {
    fn parse(s: &str) -> Option<Action> {
        Some(match s {
            "no action" => Action::NoAction,
            "greylist" => Action::Greylist,
            "add header" => Action::AddHeader,
            "rewrite subject" => Action::RewriteSubject,
            "soft reject" => Action::SoftReject,
            "reject" => Action::Reject,
            _ => return None,
        })
    }

    /// The label of `mail_filter_rspamd_checks_total`.
    pub fn label(self) -> &'static str {
        match self {
            Action::NoAction => "no_action",
            Action::Greylist => "greylist",
            Action::AddHeader => "add_header",
            Action::RewriteSubject => "rewrite_subject",
            Action::SoftReject => "soft_reject",
            Action::Reject => "reject",
        }
    }
}

/// rspamd's verdict on one message.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub action: Action,
    pub score: f64,
    pub required_score: f64,
    /// The new subject, for `rewrite subject`.
    pub subject: Option<String>,
}

#[derive(Deserialize)]
struct Answer {
    action: String,
    #[serde(default)]
    score: f64,
    #[serde(default)]
    required_score: f64,
    #[serde(default)]
    subject: Option<String>,
}

/// Parses `/checkv2`'s JSON answer.
pub fn parse_verdict(body: &[u8]) -> Option<Verdict> {
    let answer: Answer = serde_json::from_slice(body).ok()?;
    let action = Action::parse(&answer.action)?;
    if !answer.score.is_finite() || !answer.required_score.is_finite() {
        return None;
    }
    Some(Verdict {
        action,
        score: answer.score,
        required_score: answer.required_score,
        subject: answer.subject.filter(|_| action == Action::RewriteSubject),
    })
}

/// What rspamd is told about a message besides its content (its request
/// headers, rspamd's protocol documentation).
#[derive(Debug, Default)]
pub struct Envelope<'a> {
    /// `From`: the envelope sender (empty for the null sender: not sent).
    pub from: &'a str,
    /// `Rcpt`, one each.
    pub recipients: Vec<&'a str>,
    /// `IP`: the client's address.
    pub ip: Option<IpAddr>,
    /// `Helo`.
    pub helo: Option<&'a str>,
    /// `Hostname`: the client's name, when it was looked up.
    pub hostname: Option<&'a str>,
    /// `User`: the authenticated user.
    pub user: Option<&'a str>,
    /// `Queue-Id`: the id of our logs and `Received` field.
    pub queue_id: &'a str,
    /// `SPF`, `DKIM`, `DMARC`: our own results as rspamd's `http_headers`
    /// module reads them (JSON), so that it need not check again.
    pub auth: Vec<(&'static str, String)>,
}

/// One rspamd address and the connections kept to it.
pub struct Client {
    endpoint: Endpoint,
    password: Option<HeaderValue>,
    timeout: Duration,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
}

impl Client {
    pub fn new(endpoint: Endpoint, password: Option<&str>, timeout: Duration) -> Client {
        let password = password.and_then(|p| HeaderValue::from_str(p).ok()).map(|mut v| {
            v.set_sensitive(true);
            v
        });
        Client { endpoint, password, timeout, idle: Mutex::new(Vec::new()) }
    }

    /// Scans `message`: rspamd's verdict, or why there is none.
    pub async fn check(&self, envelope: &Envelope<'_>, message: Bytes) -> Result<Verdict, Failure> {
        let mut headers = HeaderMap::new();
        let mut add = |name: &'static str, value: &[u8]| {
            // A value that cannot be a header (control characters) is left out
            // rather than sent altered.
            if let Ok(v) = HeaderValue::from_bytes(value) {
                headers.append(HeaderName::from_static(name), v);
            }
        };
        if !envelope.from.is_empty() {
            add("from", envelope.from.as_bytes());
        }
        for r in &envelope.recipients {
            add("rcpt", r.as_bytes());
        }
        if let Some(ip) = envelope.ip {
            add("ip", ip.to_string().as_bytes());
        }
        if let Some(helo) = envelope.helo {
            add("helo", helo.as_bytes());
        }
        if let Some(hostname) = envelope.hostname {
            add("hostname", hostname.as_bytes());
        }
        if let Some(user) = envelope.user {
            add("user", user.as_bytes());
        }
        add("queue-id", envelope.queue_id.as_bytes());
        for (name, value) in &envelope.auth {
            add(name, value.as_bytes());
        }
        let (status, body) = self.post("/checkv2", headers, message).await?;
        if status != StatusCode::OK {
            return Err(Failure::Status);
        }
        parse_verdict(&body).ok_or(Failure::Answer)
    }

    /// Teaches rspamd's classifier `message` as spam (`/learnspam`) or ham
    /// (`/learnham`). rspamd answers 208 for a message it had already learnt
    /// that way: done as well.
    pub async fn learn(&self, spam: bool, message: Bytes) -> Result<(), Failure> {
        let path = if spam { "/learnspam" } else { "/learnham" };
        let (status, _) = self.post(path, HeaderMap::new(), message).await?;
        match status {
            StatusCode::OK | StatusCode::ALREADY_REPORTED => Ok(()),
            _ => Err(Failure::Status),
        }
    }

    async fn post(
        &self,
        path: &str,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), Failure> {
        match tokio::time::timeout(self.timeout, self.exchange(path, headers, body)).await {
            Ok(result) => result,
            Err(_) => Err(Failure::Timeout),
        }
    }

    async fn exchange(
        &self,
        path: &str,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), Failure> {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(format!("{}{path}", self.endpoint.prefix))
            .header(http::header::HOST, self.endpoint.authority.as_str())
            .body(Full::new(body))
            .map_err(|_| Failure::Connect)?;
        request.headers_mut().extend(headers);
        if let Some(password) = &self.password {
            request.headers_mut().insert(HeaderName::from_static("password"), password.clone());
        }
        // A kept connection rspamd closed meanwhile fails before it carries
        // the request (a scan or a learn may be sent again): once more on a
        // new one.
        let (sender, response) = match self.idle_connection() {
            Some(mut sender) => match sender.try_send_request(request).await {
                Ok(response) => (sender, response),
                Err(mut err) => {
                    let Some(request) = err.take_message() else { return Err(Failure::Connect) };
                    let mut sender = self.connect().await?;
                    let response = sender.send_request(request).await.map_err(|_| Failure::Connect)?;
                    (sender, response)
                }
            },
            None => {
                let mut sender = self.connect().await?;
                let response = sender.send_request(request).await.map_err(|_| Failure::Connect)?;
                (sender, response)
            }
        };
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|_| Failure::Answer)?
            .to_bytes();
        if sender.is_ready() {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            if idle.len() < IDLE_CONNECTIONS {
                idle.push(sender);
            }
        }
        Ok((status, body))
    }

    /// A kept connection still open, if there is one.
    fn idle_connection(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(sender) = idle.pop() {
            if sender.is_ready() {
                return Some(sender);
            }
        }
        None
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, Failure> {
        let stream = tokio::net::TcpStream::connect(self.endpoint.authority.as_str())
            .await
            .map_err(|_| Failure::Connect)?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|_| Failure::Connect)?;
        // The connection's own task: it ends when rspamd or the last handle
        // closes it.
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "rspamd connection ended");
            }
        });
        Ok(sender)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let e = Endpoint::parse("http://rspamd:11333").unwrap();
        assert_eq!((e.authority.as_str(), e.prefix.as_str()), ("rspamd:11333", ""));
        let e = Endpoint::parse("http://[::1]:11333/scan/").unwrap();
        assert_eq!((e.authority.as_str(), e.prefix.as_str()), ("[::1]:11333", "/scan"));
        assert_eq!(Endpoint::parse("http://rspamd").unwrap().authority, "rspamd:80");
        assert!(Endpoint::parse("https://rspamd:11333").is_none());
        assert!(Endpoint::parse("http://user@rspamd:1").is_none());
    }

    #[test]
    fn verdicts() {
        let v = parse_verdict(br#"{"action":"rewrite subject","score":7.5,"required_score":15,"subject":"[SPAM] hi","symbols":{}}"#)
            .unwrap();
        assert_eq!(v.action, Action::RewriteSubject);
        assert_eq!(v.subject.as_deref(), Some("[SPAM] hi"));
        let v =
            parse_verdict(br#"{"action":"no action","score":-1,"required_score":15,"subject":"x"}"#).unwrap();
        assert_eq!((v.action, v.subject), (Action::NoAction, None));
        assert!(parse_verdict(br#"{"action":"discard","score":1}"#).is_none());
        assert!(parse_verdict(b"<html>").is_none());
    }
}
