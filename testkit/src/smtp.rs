//! A remote SMTP server for the relay's tests, whose answers the test sets while
//! it runs: the greeting (normal, endless, silent), the reply to RCPT, and whether
//! the end of DATA is answered at all. It records every message it was sent.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Greeting {
    Normal,
    /// "220-" lines forever.
    Endless,
    /// Accepts the connection and says nothing.
    Silent,
}

#[derive(Clone, Debug)]
struct Behaviour {
    greeting: Greeting,
    rcpt_reply: String,
    mail_reply: String,
    /// RCPT of this local part is refused with 550 5.1.1, whatever `rcpt_reply`.
    unknown_user: Option<String>,
    /// STARTTLS is offered but answered with 454.
    starttls_refused: bool,
    /// DATA gets 354 even when no recipient was accepted (RFC 2920 allows it);
    /// the content that follows is then thrown away.
    data_without_recipients: bool,
    /// The end of DATA gets no answer (the connection is held, then dropped).
    hold: bool,
    /// EHLO offers DSN (RFC 3461).
    dsn: bool,
}

/// A message the remote took, answered or not.
#[derive(Debug, Clone)]
pub struct Received {
    pub from: String,
    pub rcpts: Vec<String>,
    pub data: String,
    /// The end of DATA was answered with 250.
    pub acknowledged: bool,
    /// The message came over TLS (after STARTTLS).
    pub tls: bool,
    /// The MAIL command line as sent, parameters and all.
    pub mail_line: String,
    /// The accepted RCPT command lines as sent.
    pub rcpt_lines: Vec<String>,
}

pub struct ScriptedRemote {
    pub addr: SocketAddr,
    behaviour: Arc<Mutex<Behaviour>>,
    received: Arc<Mutex<Vec<Received>>>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl ScriptedRemote {
    /// Listens on 127.0.0.1 (a free port), answering RCPT with `rcpt_reply`.
    pub async fn start(rcpt_reply: &str) -> ScriptedRemote {
        Self::start_with_tls(rcpt_reply, None).await
    }

    /// [`ScriptedRemote::start`], offering STARTTLS with `tls` when given.
    pub async fn start_with_tls(rcpt_reply: &str, tls: Option<Arc<rustls::ServerConfig>>) -> ScriptedRemote {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let behaviour = Arc::new(Mutex::new(Behaviour {
            greeting: Greeting::Normal,
            rcpt_reply: rcpt_reply.to_string(),
            mail_reply: "250 2.1.0 ok".into(),
            unknown_user: None,
            data_without_recipients: false,
            starttls_refused: false,
            hold: false,
            dsn: false,
        }));
        let received = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let (b, r, c) = (behaviour.clone(), received.clone(), connections.clone());
        let tls = tls.clone();
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve_one(Box::new(sock), b.clone(), r.clone(), tls.clone(), false));
            }
        });
        ScriptedRemote { addr, behaviour, received, connections, task }
    }

    pub fn set_rcpt_reply(&self, reply: &str) {
        lock(&self.behaviour).rcpt_reply = reply.to_string();
    }

    pub fn set_mail_reply(&self, reply: &str) {
        lock(&self.behaviour).mail_reply = reply.to_string();
    }

    /// Offers STARTTLS (even without a TLS configuration) and answers it with 454.
    pub fn set_starttls_refused(&self, on: bool) {
        lock(&self.behaviour).starttls_refused = on;
    }

    /// Answers DATA with 354 even without recipients.
    pub fn set_data_without_recipients(&self, on: bool) {
        lock(&self.behaviour).data_without_recipients = on;
    }

    /// Refuses RCPT of `local_part@…` with 550 5.1.1.
    pub fn set_unknown_user(&self, local_part: &str) {
        lock(&self.behaviour).unknown_user = Some(local_part.to_string());
    }

    pub fn set_greeting(&self, g: Greeting) {
        lock(&self.behaviour).greeting = g;
    }

    pub fn set_hold(&self, hold: bool) {
        lock(&self.behaviour).hold = hold;
    }

    /// Offers DSN in the EHLO reply, or not.
    pub fn set_dsn(&self, on: bool) {
        lock(&self.behaviour).dsn = on;
    }

    pub fn received(&self) -> Vec<Received> {
        lock(&self.received).clone()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for ScriptedRemote {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn address_of(arg: &str) -> String {
    arg.trim().trim_start_matches('<').split('>').next().unwrap_or("").to_string()
}

/// One connection; the behaviour is read at each step, so a change applies to
/// connections the relay keeps open too.
async fn serve_one(
    sock: Box<dyn Io>,
    b: Arc<Mutex<Behaviour>>,
    received: Arc<Mutex<Vec<Received>>>,
    tls: Option<Arc<rustls::ServerConfig>>,
    is_tls: bool,
) {
    let mut r = BufReader::new(sock);
    let greeting = if is_tls { Greeting::Normal } else { lock(&b).greeting.clone() };
    match greeting {
        Greeting::Silent => {
            tokio::time::sleep(Duration::from_secs(60)).await;
            return;
        }
        Greeting::Endless => {
            let line = format!("220-{}\r\n", "x".repeat(500));
            for _ in 0..100_000 {
                if r.write_all(line.as_bytes()).await.is_err() {
                    return;
                }
            }
            return;
        }
        Greeting::Normal => {}
    }
    if !is_tls {
        let _ = r.write_all(b"220 remote.test ESMTP\r\n").await;
    }
    let (mut from, mut rcpts, mut in_transaction) = (String::new(), Vec::new(), false);
    let (mut mail_line, mut rcpt_lines) = (String::new(), Vec::new());
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let cmd = line.trim_end().to_string();
        let upper = cmd.to_ascii_uppercase();
        let reply = if upper.starts_with("EHLO") {
            let offer = (tls.is_some() || lock(&b).starttls_refused) && !is_tls;
            let starttls = if offer { "250-STARTTLS\r\n" } else { "" };
            let dsn = if lock(&b).dsn { "250-DSN\r\n" } else { "" };
            format!("250-remote.test\r\n{starttls}{dsn}250-PIPELINING\r\n250 SIZE 10000000\r\n")
        } else if upper == "STARTTLS" && !is_tls && lock(&b).starttls_refused {
            "454 4.7.0 TLS not available due to temporary reason\r\n".to_string()
        } else if upper == "STARTTLS" && !is_tls {
            let Some(config) = tls.clone() else {
                let _ = r.write_all(b"502 5.5.1 no TLS here\r\n").await;
                continue;
            };
            let _ = r.write_all(b"220 2.0.0 go ahead\r\n").await;
            let Ok(stream) = tokio_rustls::TlsAcceptor::from(config).accept(r.into_inner()).await else {
                return;
            };
            return Box::pin(serve_one(Box::new(stream), b, received, tls, true)).await;
        } else if upper.starts_with("MAIL FROM:") {
            from = address_of(&cmd[10..]);
            rcpts.clear();
            rcpt_lines.clear();
            mail_line = cmd.clone();
            let reply = lock(&b).mail_reply.clone();
            in_transaction = reply.starts_with('2');
            format!("{reply}\r\n")
        } else if upper.starts_with("RCPT TO:") && !in_transaction {
            "503 5.5.1 need MAIL first\r\n".to_string()
        } else if upper.starts_with("RCPT TO:") {
            let rcpt = address_of(&cmd[8..]);
            let behaviour = lock(&b).clone();
            let unknown = behaviour.unknown_user.is_some_and(|u| {
                rcpt.split_once('@').is_some_and(|(local, _)| local.eq_ignore_ascii_case(&u))
            });
            let reply = if unknown { "550 5.1.1 no such user".to_string() } else { behaviour.rcpt_reply };
            if reply.starts_with('2') {
                rcpts.push(rcpt);
                rcpt_lines.push(cmd.clone());
            }
            format!("{reply}\r\n")
        } else if upper == "DATA" {
            if rcpts.is_empty() && !lock(&b).data_without_recipients {
                "554 5.5.1 no valid recipients\r\n".into()
            } else {
                let _ = r.write_all(b"354 go ahead\r\n").await;
                let mut data = String::new();
                loop {
                    line.clear();
                    if r.read_line(&mut line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    if line == ".\r\n" {
                        break;
                    }
                    data.push_str(&line);
                }
                if rcpts.is_empty() {
                    // Content after a 354 without recipients goes nowhere.
                    if r.write_all(b"554 5.5.1 no valid recipients\r\n").await.is_err() {
                        return;
                    }
                    continue;
                }
                let hold = lock(&b).hold;
                lock(&received).push(Received {
                    from: from.clone(),
                    rcpts: rcpts.clone(),
                    data,
                    acknowledged: !hold,
                    tls: is_tls,
                    mail_line: mail_line.clone(),
                    rcpt_lines: rcpt_lines.clone(),
                });
                if hold {
                    tokio::time::sleep(Duration::from_secs(120)).await;
                    return;
                }
                in_transaction = false;
                "250 2.0.0 queued\r\n".into()
            }
        } else if upper == "RSET" {
            in_transaction = false;
            rcpts.clear();
            "250 2.0.0 ok\r\n".into()
        } else if upper == "QUIT" {
            let _ = r.write_all(b"221 bye\r\n").await;
            return;
        } else {
            "500 5.5.2 what\r\n".into()
        };
        if r.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}
