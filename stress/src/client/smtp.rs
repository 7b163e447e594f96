//! SMTP client: greeting, EHLO, STARTTLS, AUTH PLAIN/LOGIN, pipelined MAIL/RCPT/DATA,
//! NOOP, RSET, QUIT (RFC 5321, 3207, 4954, 2920).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;

use super::{ClientError, Conn, Endpoint, Result, TlsMode, text};

/// A reply: code and the text of its last line.
#[derive(Debug)]
pub struct Reply {
    pub code: u16,
    pub text: String,
}

/// What the server announced in its EHLO reply.
#[derive(Debug, Default, Clone)]
pub struct Extensions {
    pub pipelining: bool,
    pub starttls: bool,
    pub auth_plain: bool,
    pub auth_login: bool,
}

pub struct SmtpClient {
    conn: Conn,
    pub ext: Extensions,
    cmd: Vec<u8>,
    /// Closing (the server said 421) or out of step with the server (a transaction
    /// it opened could not be ended cleanly): the session must not be reused.
    broken: bool,
}

impl SmtpClient {
    /// Connect, read the greeting, EHLO, and STARTTLS + EHLO again when asked to.
    pub async fn connect(ep: &Endpoint, helo: &str) -> Result<SmtpClient> {
        let conn = Conn::connect(ep).await?;
        let mut c =
            SmtpClient { conn, ext: Extensions::default(), cmd: Vec::with_capacity(512), broken: false };
        c.expect(220).await?;
        c.ehlo(helo).await?;
        if ep.tls_mode == TlsMode::Starttls {
            if !c.ext.starttls {
                return Err(ClientError::Protocol("server does not offer STARTTLS".into()));
            }
            c.conn.write_all(b"STARTTLS\r\n").await?;
            c.expect(220).await?;
            c.conn = c.conn.upgrade(&ep.tls).await?;
            c.ehlo(helo).await?;
        }
        Ok(c)
    }

    /// See [`Conn::server_hung_up`]: checked before a cached session is reused.
    /// A session the server announced it closes (421), or one left out of step by
    /// a failed transaction, counts as closed too.
    pub fn server_hung_up(&mut self) -> bool {
        self.broken || self.conn.server_hung_up()
    }

    /// Read the greeting only (connect-flood holds connections without a session).
    pub async fn connect_greeting(ep: &Endpoint) -> Result<SmtpClient> {
        let conn = Conn::connect(ep).await?;
        let mut c = SmtpClient { conn, ext: Extensions::default(), cmd: Vec::new(), broken: false };
        c.expect(220).await?;
        Ok(c)
    }

    async fn ehlo(&mut self, helo: &str) -> Result<()> {
        self.cmd.clear();
        self.cmd.extend_from_slice(b"EHLO ");
        self.cmd.extend_from_slice(helo.as_bytes());
        self.cmd.extend_from_slice(b"\r\n");
        self.conn.write_all(&self.cmd).await?;
        let mut ext = Extensions::default();
        loop {
            let line = self.conn.read_line().await?;
            let (code, last) = parse_line(line)?;
            if code != 250 {
                return Err(ClientError::Smtp(code, text(line)));
            }
            let kw = line.get(4..).unwrap_or_default().to_ascii_uppercase();
            if kw.starts_with(b"PIPELINING") {
                ext.pipelining = true;
            } else if kw.starts_with(b"STARTTLS") {
                ext.starttls = true;
            } else if kw.starts_with(b"AUTH") {
                let t = String::from_utf8_lossy(&kw);
                ext.auth_plain |= t.split_whitespace().any(|m| m == "PLAIN");
                ext.auth_login |= t.split_whitespace().any(|m| m == "LOGIN");
            }
            if last {
                break;
            }
        }
        self.ext = ext;
        Ok(())
    }

    /// AUTH PLAIN with the initial response on the command line.
    pub async fn auth_plain(&mut self, user: &str, pass: &str) -> Result<()> {
        let token = B64.encode(format!("\0{user}\0{pass}"));
        self.conn.write_all(format!("AUTH PLAIN {token}\r\n").as_bytes()).await?;
        self.expect(235).await.map(drop)
    }

    /// AUTH LOGIN: two 334 challenges.
    pub async fn auth_login(&mut self, user: &str, pass: &str) -> Result<()> {
        self.conn.write_all(b"AUTH LOGIN\r\n").await?;
        self.expect(334).await?;
        self.conn.write_all(format!("{}\r\n", B64.encode(user)).as_bytes()).await?;
        self.expect(334).await?;
        self.conn.write_all(format!("{}\r\n", B64.encode(pass)).as_bytes()).await?;
        self.expect(235).await.map(drop)
    }

    /// One transaction. The message is the concatenation of `data`'s parts, which
    /// together must already be dot-stuffed and end with `\r\n.\r\n`.
    /// With PIPELINING, MAIL, RCPT and DATA leave in one write (one round trip saved
    /// per command, as any real MTA does).
    pub async fn send(&mut self, from: &str, rcpts: &[&str], data: &[&[u8]]) -> Result<()> {
        self.cmd.clear();
        self.cmd.extend_from_slice(format!("MAIL FROM:<{from}>\r\n").as_bytes());
        if self.ext.pipelining {
            for r in rcpts {
                self.cmd.extend_from_slice(format!("RCPT TO:<{r}>\r\n").as_bytes());
            }
            self.cmd.extend_from_slice(b"DATA\r\n");
            self.conn.write_all(&self.cmd).await?;
            // Read every reply before judging, so the stream stays in sync — up to a
            // 421: the server is closing the channel (RFC 5321 §3.8) and no further
            // reply will come. The transaction's failure is still the first one in
            // order (a refused sender is a 553 even if the server then hangs up).
            let mail = self.reply().await?;
            if mail.code == 421 {
                return Err(ClientError::Smtp(mail.code, mail.text));
            }
            let mut closing = None;
            let mut rcpt_err = None;
            let mut accepted = 0;
            for _ in rcpts {
                let r = self.reply().await?;
                if r.code == 421 {
                    closing = Some(r);
                    break;
                }
                if r.code / 100 == 2 {
                    accepted += 1;
                } else if rcpt_err.is_none() {
                    rcpt_err = Some(r);
                }
            }
            let data_reply = match closing {
                Some(_) => None,
                None => {
                    let r = self.reply().await?;
                    if r.code == 421 {
                        closing = Some(r);
                        None
                    } else {
                        Some(r)
                    }
                }
            };
            let data_open = data_reply.as_ref().is_some_and(|r| r.code == 354);
            let mail_open = mail.code / 100 == 2;
            if !mail_open {
                return self.abort(mail, false, data_open).await;
            }
            if accepted == 0
                && let Some(r) = rcpt_err
            {
                return match closing {
                    Some(_) => Err(ClientError::Smtp(r.code, r.text)),
                    None => self.abort(r, true, data_open).await,
                };
            }
            if let Some(r) = closing {
                return Err(ClientError::Smtp(r.code, r.text));
            }
            if accepted == 0 {
                let r = Reply { code: 554, text: "no recipients".into() };
                return self.abort(r, true, data_open).await;
            }
            let data_reply = data_reply.unwrap_or(Reply { code: 554, text: "no DATA reply".into() });
            if data_reply.code != 354 {
                return self.abort(data_reply, true, false).await;
            }
        } else {
            self.conn.write_all(&self.cmd).await?;
            self.expect(250).await?;
            for r in rcpts {
                self.conn.write_all(format!("RCPT TO:<{r}>\r\n").as_bytes()).await?;
                let reply = self.reply().await?;
                if reply.code != 250 {
                    return self.abort(reply, true, false).await;
                }
            }
            self.conn.write_all(b"DATA\r\n").await?;
            let reply = self.reply().await?;
            if reply.code != 354 {
                return self.abort(reply, true, false).await;
            }
        }
        self.conn.write_all_parts(data).await?;
        self.expect(250).await.map(drop)
    }

    /// A transaction failed before its content: report the first error, and leave
    /// the session ready for the next one. A server keeps the sender of a
    /// transaction whose recipients all failed (RFC 5321 §4.1.1.9: only RSET, or
    /// the end of the content, clears it), so the transaction is reset — without it
    /// the next MAIL would meet `503 sender already specified`. If the server
    /// nevertheless opened DATA, the only ways out are sending content (which it
    /// would deliver) or hanging up: the session is given up instead.
    async fn abort(&mut self, first: Reply, mail_open: bool, data_open: bool) -> Result<()> {
        if data_open {
            self.broken = true;
            self.conn.shutdown().await;
        } else if mail_open {
            self.conn.write_all(b"RSET\r\n").await?;
            if self.reply().await?.code != 250 {
                self.broken = true;
            }
        }
        Err(ClientError::Smtp(first.code, first.text))
    }

    pub async fn noop(&mut self) -> Result<()> {
        self.conn.write_all(b"NOOP\r\n").await?;
        self.expect(250).await.map(drop)
    }

    pub async fn rset(&mut self) -> Result<()> {
        self.conn.write_all(b"RSET\r\n").await?;
        self.expect(250).await.map(drop)
    }

    pub async fn quit(mut self) -> Result<()> {
        self.conn.write_all(b"QUIT\r\n").await?;
        let r = self.reply().await;
        self.conn.shutdown().await;
        r.map(drop)
    }

    /// Read one (possibly multi-line) reply. A 421 is the server closing the
    /// channel (RFC 5321 §3.8): its end of stream may still be on the way, so the
    /// session is marked for closing here rather than left for
    /// [`SmtpClient::server_hung_up`] to notice — a next transaction written in
    /// between would meet a closed connection instead of a reply.
    pub async fn reply(&mut self) -> Result<Reply> {
        loop {
            let line = self.conn.read_line().await?;
            let (code, last) = parse_line(line)?;
            if last {
                self.broken |= code == 421;
                return Ok(Reply { code, text: text(line) });
            }
        }
    }

    async fn expect(&mut self, code: u16) -> Result<Reply> {
        let r = self.reply().await?;
        if r.code == code { Ok(r) } else { Err(ClientError::Smtp(r.code, r.text)) }
    }
}

/// `250-text` → (250, false); `250 text` / `250` → (250, true).
fn parse_line(line: &[u8]) -> Result<(u16, bool)> {
    let bad = || ClientError::Protocol(format!("bad SMTP reply line: {}", text(line)));
    if line.len() < 3 || !line[..3].iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    let code = (line[0] - b'0') as u16 * 100 + (line[1] - b'0') as u16 * 10 + (line[2] - b'0') as u16;
    match line.get(3) {
        Some(b'-') => Ok((code, false)),
        Some(b' ') | Some(b'\r') | Some(b'\n') | None => Ok((code, true)),
        _ => Err(bad()),
    }
}

/// Dot-stuff a message and terminate it with `.\r\n` (RFC 5321 §4.5.2). Bare LFs are
/// normalised to CRLF so the server never sees an ambiguous line end.
pub fn dot_stuff(msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(msg.len() + msg.len() / 64 + 8);
    let mut at_line_start = true;
    let mut prev = 0u8;
    for &b in msg {
        if b == b'\n' && prev != b'\r' {
            out.push(b'\r');
        }
        if at_line_start && b == b'.' {
            out.push(b'.');
        }
        out.push(b);
        at_line_start = b == b'\n';
        prev = b;
    }
    if !out.ends_with(b"\r\n") {
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b".\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_lines() {
        assert_eq!(parse_line(b"250-PIPELINING\r\n").ok(), Some((250, false)));
        assert_eq!(parse_line(b"250 ok\r\n").ok(), Some((250, true)));
        assert_eq!(parse_line(b"354\r\n").ok(), Some((354, true)));
        assert!(parse_line(b"hello\r\n").is_err());
        assert!(parse_line(b"25").is_err());
    }

    #[test]
    fn stuffing() {
        assert_eq!(dot_stuff(b"a\r\n.b\r\n"), b"a\r\n..b\r\n.\r\n");
        assert_eq!(dot_stuff(b".x\ny"), b"..x\r\ny\r\n.\r\n");
    }
}
