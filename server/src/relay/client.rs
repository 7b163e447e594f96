//! The SMTP client of the relay workers: one connection to one remote server,
//! carrying any number of transactions (RFC 5321 §3.3) with PIPELINING (RFC 2920)
//! when offered, STARTTLS (RFC 3207) and, towards a smarthost, AUTH PLAIN.
//!
//! Every read has a timeout and every reply a size bound: a remote server that
//! never answers, or sends an endless line, costs a bounded time and memory.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use mailcluster_model::{DsnNotify, DsnRequest, DsnRet};

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One reply: code, enhanced status (RFC 3463) when given, and its text lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub code: u16,
    pub lines: Vec<String>,
}

impl Reply {
    pub fn is_positive(&self) -> bool {
        (200..400).contains(&self.code)
    }
    pub fn is_permanent(&self) -> bool {
        self.code >= 500
    }
    /// The enhanced status code at the start of the first line, if any.
    pub fn enhanced(&self) -> Option<&str> {
        let first = self.lines.first()?.split_whitespace().next()?;
        let mut parts = first.split('.');
        let class = parts.next()?;
        (["2", "4", "5"].contains(&class)
            && parts.clone().count() == 2
            && parts.all(|p| !p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit())))
        .then_some(first)
    }
}

impl std::fmt::Display for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.code, self.lines.join(" / "))
    }
}

/// Why a connection could not be used (for this message or at all).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Io(String),
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server refused the connection as a whole (greeting, EHLO, STARTTLS,
    /// AUTH): the reply decides whether the next host is tried.
    #[error("{0}")]
    Refused(Reply),
}

impl ClientError {
    pub fn is_permanent(&self) -> bool {
        matches!(self, ClientError::Refused(r) if r.is_permanent())
    }
}

#[derive(Debug, Default, Clone)]
pub struct Extensions {
    pub pipelining: bool,
    pub starttls: bool,
    pub smtputf8: bool,
    pub eightbitmime: bool,
    pub size: Option<u64>,
    pub auth_plain: bool,
    /// RFC 3461: the server takes NOTIFY, ORCPT, RET and ENVID, and so the duty
    /// of reporting on the recipients it accepts.
    pub dsn: bool,
}

pub struct Timeouts {
    pub connect: Duration,
    pub command: Duration,
    pub data: Duration,
    pub max_reply_bytes: usize,
}

/// What became of one transaction.
#[derive(Debug)]
pub struct Sent {
    /// One reply per recipient, in order: the RCPT reply when it refused, else the
    /// reply to the message content (or to MAIL / DATA when those refused).
    pub per_recipient: Vec<Reply>,
    /// The sender's DSN request went along (the server offered DSN).
    pub dsn_passed: bool,
}

pub struct Client {
    io: Box<dyn Io>,
    rbuf: Vec<u8>,
    pub ext: Extensions,
    pub tls: bool,
    timeouts: Arc<Timeouts>,
    /// Transactions completed on this connection.
    pub transactions: usize,
    /// The content of the current transaction was (at least partly) written: from
    /// here on, a broken connection leaves the outcome unknown.
    pub content_sent: bool,
}

impl Client {
    /// Connects and reads the greeting.
    pub async fn connect(addr: SocketAddr, timeouts: Arc<Timeouts>) -> Result<Client, ClientError> {
        let tcp = tokio::time::timeout(timeouts.connect, TcpStream::connect(addr))
            .await
            .map_err(|_| ClientError::Timeout("the connection"))?
            .map_err(|e| ClientError::Io(format!("connect to {addr}: {e}")))?;
        let _ = tcp.set_nodelay(true);
        let mut client = Client {
            io: Box::new(tcp),
            rbuf: Vec::with_capacity(1024),
            ext: Extensions::default(),
            tls: false,
            timeouts,
            transactions: 0,
            content_sent: false,
        };
        let greeting = client.read_reply("the greeting").await?;
        if greeting.code != 220 {
            return Err(ClientError::Refused(greeting));
        }
        Ok(client)
    }

    /// EHLO (HELO when EHLO is refused), then STARTTLS when `tls` is given and the
    /// server offers it (or always, when `require_tls`), then EHLO again.
    pub async fn hello(
        &mut self,
        name: &str,
        tls: Option<(&TlsConnector, &str)>,
        require_tls: bool,
    ) -> Result<(), ClientError> {
        self.ehlo(name).await?;
        if let Some((connector, server_name)) = tls
            && (self.ext.starttls || require_tls)
        {
            if !self.ext.starttls {
                return Err(ClientError::Protocol(
                    "TLS is required and the server does not offer STARTTLS".into(),
                ));
            }
            let reply = self.command(b"STARTTLS\r\n", "the STARTTLS reply").await?;
            if reply.code != 220 {
                if require_tls {
                    return Err(ClientError::Refused(reply));
                }
                // Opportunistic TLS the server cannot give right now (454, RFC
                // 3207 §4): the session goes on in the clear, as before STARTTLS.
                return Ok(());
            }
            if !self.rbuf.is_empty() {
                // RFC 3207 §4.2: nothing may follow the 220 in the clear.
                return Err(ClientError::Protocol("data after the STARTTLS reply".into()));
            }
            let sni = rustls::pki_types::ServerName::try_from(server_name.to_string())
                .map_err(|e| ClientError::Protocol(format!("bad TLS server name {server_name}: {e}")))?;
            let io = std::mem::replace(&mut self.io, Box::new(tokio::io::empty()));
            let tls_stream = tokio::time::timeout(self.timeouts.command, connector.connect(sni, io))
                .await
                .map_err(|_| ClientError::Timeout("the TLS handshake"))?
                .map_err(|e| ClientError::Io(format!("TLS handshake: {e}")))?;
            self.io = Box::new(tls_stream);
            self.tls = true;
            self.ext = Extensions::default();
            self.ehlo(name).await?;
        } else if require_tls {
            return Err(ClientError::Protocol("TLS is required".into()));
        }
        Ok(())
    }

    async fn ehlo(&mut self, name: &str) -> Result<(), ClientError> {
        let reply = self.command(format!("EHLO {name}\r\n").as_bytes(), "the EHLO reply").await?;
        if reply.code == 250 {
            self.ext = parse_extensions(&reply);
            return Ok(());
        }
        if reply.is_permanent() && reply.code != 554 {
            // An SMTP-only server (RFC 5321 §3.2).
            let helo = self.command(format!("HELO {name}\r\n").as_bytes(), "the HELO reply").await?;
            if helo.code == 250 {
                self.ext = Extensions::default();
                return Ok(());
            }
            return Err(ClientError::Refused(helo));
        }
        Err(ClientError::Refused(reply))
    }

    /// AUTH PLAIN (RFC 4954 with RFC 4616).
    pub async fn auth_plain(&mut self, user: &str, password: &str) -> Result<(), ClientError> {
        use base64::Engine;
        if !self.ext.auth_plain {
            return Err(ClientError::Protocol("the smarthost does not offer AUTH PLAIN".into()));
        }
        let token = base64::engine::general_purpose::STANDARD.encode(format!("\0{user}\0{password}"));
        let reply = self.command(format!("AUTH PLAIN {token}\r\n").as_bytes(), "the AUTH reply").await?;
        if reply.code != 235 {
            return Err(ClientError::Refused(reply));
        }
        Ok(())
    }

    /// One transaction. `Err` means the connection broke or the server answered
    /// out of protocol: the outcome of the message is unknown to the caller only
    /// if the content had been sent (see [`ClientError`]); it is never reused.
    /// `dsn`: what the sender asked of delivery status notifications, passed on
    /// when the server offers DSN (RFC 3461 §5.2.1).
    pub async fn send(
        &mut self,
        from: &str,
        rcpts: &[String],
        message: &[u8],
        dsn: &DsnRequest,
    ) -> Result<Sent, ClientError> {
        self.content_sent = false;
        let dsn_passed = self.ext.dsn;
        let sent = |per_recipient| Sent { per_recipient, dsn_passed };
        let rcpt_line = |r: &str| {
            let mut line = format!("RCPT TO:<{r}>");
            if dsn_passed && let Some(d) = dsn.recipient(r) {
                if let Some(n) = d.notify {
                    line.push_str(" NOTIFY=");
                    line.push_str(&notify_value(n));
                }
                match (&d.orcpt, &d.orcpt_type) {
                    (Some(orcpt), None) => {
                        line.push_str(" ORCPT=rfc822;");
                        line.push_str(&xtext(orcpt));
                    }
                    // Another address type travels as it came (it is already in
                    // that type's own encoding).
                    (Some(orcpt), Some(kind)) => {
                        line.push_str(&format!(" ORCPT={kind};{orcpt}"));
                    }
                    (None, _) => {}
                }
            }
            line.push_str("\r\n");
            line
        };
        let mut mail = format!("MAIL FROM:<{from}>");
        if self.ext.size.is_some() {
            mail.push_str(&format!(" SIZE={}", message.len()));
        }
        let utf8 = !from.is_ascii() || rcpts.iter().any(|r| !r.is_ascii());
        if utf8 && self.ext.smtputf8 {
            mail.push_str(" SMTPUTF8");
        }
        if self.ext.eightbitmime && !message.is_ascii() {
            mail.push_str(" BODY=8BITMIME");
        }
        if dsn_passed {
            match dsn.ret {
                Some(DsnRet::Full) => mail.push_str(" RET=FULL"),
                Some(DsnRet::Hdrs) => mail.push_str(" RET=HDRS"),
                None => {}
            }
            if let Some(envid) = &dsn.envid {
                mail.push_str(" ENVID=");
                mail.push_str(&xtext(envid));
            }
        }
        mail.push_str("\r\n");
        let mut replies_to_rcpt = Vec::with_capacity(rcpts.len());
        let mut accepted = Vec::new();
        let data_reply;
        if self.ext.pipelining {
            let mut batch = mail.into_bytes();
            for r in rcpts {
                batch.extend_from_slice(rcpt_line(r).as_bytes());
            }
            batch.extend_from_slice(b"DATA\r\n");
            self.write(&batch).await?;
            let mail_reply = self.read_reply("the MAIL reply").await?;
            for (i, _) in rcpts.iter().enumerate() {
                let r = self.read_reply("a RCPT reply").await?;
                if r.is_positive() {
                    accepted.push(i);
                }
                replies_to_rcpt.push(r);
            }
            data_reply = self.read_reply("the DATA reply").await?;
            if !mail_reply.is_positive() || accepted.is_empty() {
                // RFC 2920 §3.1: a server may still answer the pipelined DATA with
                // 354; an empty message (a lone ".") ends that data phase, so the
                // connection stays in step. Then the transaction is reset.
                if data_reply.code == 354 {
                    self.write(b".\r\n").await?;
                    let _ = self.read_reply("the reply to the empty message").await?;
                }
                self.reset().await?;
                if !mail_reply.is_positive() {
                    return Ok(sent(vec![mail_reply; rcpts.len()]));
                }
                return Ok(sent(replies_to_rcpt));
            }
        } else {
            let mail_reply = self.command(mail.as_bytes(), "the MAIL reply").await?;
            if !mail_reply.is_positive() {
                return Ok(sent(vec![mail_reply; rcpts.len()]));
            }
            for (i, r) in rcpts.iter().enumerate() {
                let reply = self.command(rcpt_line(r).as_bytes(), "a RCPT reply").await?;
                if reply.is_positive() {
                    accepted.push(i);
                }
                replies_to_rcpt.push(reply);
            }
            if accepted.is_empty() {
                self.reset().await?;
                return Ok(sent(replies_to_rcpt));
            }
            data_reply = self.command(b"DATA\r\n", "the DATA reply").await?;
        }
        if data_reply.code != 354 {
            if data_reply.code < 400 {
                return Err(ClientError::Protocol(format!("unexpected reply to DATA: {data_reply}")));
            }
            if !accepted.is_empty() {
                for &i in &accepted {
                    replies_to_rcpt[i] = data_reply.clone();
                }
            }
            self.reset().await?;
            return Ok(sent(replies_to_rcpt));
        }
        // DATA's transparency (RFC 5321 §4.5.2) is POP3's multi-line encoding.
        let mut stuffed = Vec::new();
        crate::proto::pop3::encode_message(message, None, &mut stuffed);
        self.content_sent = true;
        self.write(&stuffed).await?;
        let final_reply = tokio::time::timeout(self.timeouts.data, self.read_reply_inner())
            .await
            .map_err(|_| ClientError::Timeout("the reply to the message"))??;
        for &i in &accepted {
            replies_to_rcpt[i] = final_reply.clone();
        }
        self.transactions += 1;
        Ok(sent(replies_to_rcpt))
    }

    async fn reset(&mut self) -> Result<(), ClientError> {
        let r = self.command(b"RSET\r\n", "the RSET reply").await?;
        if r.code != 250 {
            return Err(ClientError::Refused(r));
        }
        Ok(())
    }

    /// QUIT, politely and briefly: the outcome does not matter any more.
    pub async fn quit(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            if self.io.write_all(b"QUIT\r\n").await.is_ok() {
                let _ = self.read_reply_inner().await;
            }
            let _ = self.io.shutdown().await;
        })
        .await;
    }

    async fn command(&mut self, line: &[u8], what: &'static str) -> Result<Reply, ClientError> {
        self.write(line).await?;
        self.read_reply(what).await
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        tokio::time::timeout(self.timeouts.command, async {
            self.io.write_all(bytes).await?;
            self.io.flush().await
        })
        .await
        .map_err(|_| ClientError::Timeout("the server to take data"))?
        .map_err(|e| ClientError::Io(format!("write: {e}")))
    }

    async fn read_reply(&mut self, what: &'static str) -> Result<Reply, ClientError> {
        tokio::time::timeout(self.timeouts.command, self.read_reply_inner())
            .await
            .map_err(|_| ClientError::Timeout(what))?
    }

    /// Reads one (possibly multi-line) reply, at most `max_reply_bytes` long.
    async fn read_reply_inner(&mut self) -> Result<Reply, ClientError> {
        let mut lines = Vec::new();
        let mut total = 0usize;
        let mut code = None;
        loop {
            let line = loop {
                if let Some(pos) = memchr::memchr(b'\n', &self.rbuf) {
                    let mut line: Vec<u8> = self.rbuf.drain(..=pos).collect();
                    line.pop();
                    if line.last() == Some(&b'\r') {
                        line.pop();
                    }
                    break line;
                }
                if self.rbuf.len() + total > self.timeouts.max_reply_bytes {
                    return Err(ClientError::Protocol("reply too long".into()));
                }
                let mut chunk = [0u8; 4096];
                let n = self.io.read(&mut chunk).await.map_err(|e| ClientError::Io(format!("read: {e}")))?;
                if n == 0 {
                    return Err(ClientError::Io("connection closed by the server".into()));
                }
                self.rbuf.extend_from_slice(&chunk[..n]);
            };
            total += line.len() + 2;
            if total > self.timeouts.max_reply_bytes {
                return Err(ClientError::Protocol("reply too long".into()));
            }
            if line.len() < 3 || !line[..3].iter().all(u8::is_ascii_digit) {
                return Err(ClientError::Protocol(format!(
                    "malformed reply line {:?}",
                    String::from_utf8_lossy(&line[..line.len().min(80)])
                )));
            }
            let this: u16 = std::str::from_utf8(&line[..3]).ok().and_then(|s| s.parse().ok()).unwrap_or(0);
            if *code.get_or_insert(this) != this {
                return Err(ClientError::Protocol("reply lines with different codes".into()));
            }
            let more = line.get(3) == Some(&b'-');
            let text = String::from_utf8_lossy(line.get(4..).unwrap_or_default()).into_owned();
            lines.push(text);
            if !more {
                return Ok(Reply { code: this, lines });
            }
        }
    }
}

/// RFC 3461 §4.1's NOTIFY value.
fn notify_value(n: DsnNotify) -> String {
    let events = [(n.success, "SUCCESS"), (n.failure, "FAILURE"), (n.delay, "DELAY")];
    let named: Vec<&str> = events.iter().filter(|(on, _)| *on).map(|(_, name)| *name).collect();
    if named.is_empty() { "NEVER".into() } else { named.join(",") }
}

/// RFC 3461 §4's xtext: `+`, `=` and what is not printable ASCII as `+XX`.
fn xtext(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (b'!'..=b'~').contains(&b) && b != b'+' && b != b'=' {
            out.push(b as char);
        } else {
            out.push_str(&format!("+{b:02X}"));
        }
    }
    out
}

fn parse_extensions(reply: &Reply) -> Extensions {
    let mut ext = Extensions::default();
    for line in reply.lines.iter().skip(1) {
        let mut words = line.split_whitespace();
        let Some(keyword) = words.next() else { continue };
        match keyword.to_ascii_uppercase().as_str() {
            "PIPELINING" => ext.pipelining = true,
            "STARTTLS" => ext.starttls = true,
            "SMTPUTF8" => ext.smtputf8 = true,
            "8BITMIME" => ext.eightbitmime = true,
            "SIZE" => ext.size = Some(words.next().and_then(|s| s.parse().ok()).unwrap_or(0)),
            "AUTH" => ext.auth_plain = words.any(|m| m.eq_ignore_ascii_case("PLAIN")),
            "DSN" => ext.dsn = true,
            _ => {}
        }
    }
    ext
}

/// Entry points of the fuzz targets (`fuzz/`): the reply reader over any
/// stream, and the EHLO keyword parser. Not for other use.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// A client over `io` that has read no greeting, its replies bounded by
    /// `max_reply_bytes`.
    pub fn client<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        io: S,
        max_reply_bytes: usize,
    ) -> Client {
        let timeouts = Timeouts {
            connect: Duration::from_secs(1),
            command: Duration::from_secs(1),
            data: Duration::from_secs(1),
            max_reply_bytes,
        };
        Client {
            io: Box::new(io),
            rbuf: Vec::new(),
            ext: Extensions::default(),
            tls: false,
            timeouts: Arc::new(timeouts),
            transactions: 0,
            content_sent: false,
        }
    }

    /// The next reply, read as every command's reply is read (without the timer).
    pub async fn read_reply(client: &mut Client) -> Result<Reply, ClientError> {
        client.read_reply_inner().await
    }

    /// Bytes read from the server and not yet part of a reply.
    pub fn buffered(client: &Client) -> usize {
        client.rbuf.len()
    }

    pub fn extensions(reply: &Reply) -> Extensions {
        parse_extensions(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_stuffing_doubles_leading_dots_and_terminates() {
        let dot_stuff = |m: &[u8]| {
            let mut out = Vec::new();
            crate::proto::pop3::encode_message(m, None, &mut out);
            out
        };
        assert_eq!(dot_stuff(b".a\r\nb\r\n..c\r\n"), b"..a\r\nb\r\n...c\r\n.\r\n");
        assert_eq!(dot_stuff(b"no newline"), b"no newline\r\n.\r\n");
        assert_eq!(dot_stuff(b"x\r\n.\r\n"), b"x\r\n..\r\n.\r\n");
    }

    #[test]
    fn enhanced_status_is_read_from_the_first_line() {
        let r = Reply { code: 550, lines: vec!["5.1.1 no such user".into()] };
        assert_eq!(r.enhanced(), Some("5.1.1"));
        let r = Reply { code: 550, lines: vec!["no such user".into()] };
        assert_eq!(r.enhanced(), None);
    }

    #[test]
    fn extensions_from_ehlo() {
        let r = Reply {
            code: 250,
            lines: vec![
                "mx.test".into(),
                "PIPELINING".into(),
                "SIZE 1000".into(),
                "AUTH LOGIN PLAIN".into(),
                "STARTTLS".into(),
            ],
        };
        let e = parse_extensions(&r);
        assert!(e.pipelining && e.starttls && e.auth_plain && !e.smtputf8 && !e.dsn);
        assert_eq!(e.size, Some(1000));
        let r = Reply { code: 250, lines: vec!["mx.test".into(), "DSN".into()] };
        assert!(parse_extensions(&r).dsn);
    }

    #[test]
    fn dsn_parameters_are_written_as_rfc_3461_has_them() {
        assert_eq!(xtext("a+b=c d@\u{e9}.test"), "a+2Bb+3Dc+20d@+C3+A9.test");
        let n = |success, failure, delay| notify_value(DsnNotify { success, failure, delay });
        assert_eq!(n(false, false, false), "NEVER");
        assert_eq!(n(true, true, false), "SUCCESS,FAILURE");
        assert_eq!(n(false, true, true), "FAILURE,DELAY");
    }
}
