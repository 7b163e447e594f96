//! POP3 client: greeting, STLS, USER/PASS, STAT, LIST, RETR, QUIT (RFC 1939, 2595).

use super::{ClientError, Conn, Endpoint, Result, TlsMode, text};

pub struct Pop3Client {
    conn: Conn,
}

impl Pop3Client {
    pub async fn connect(ep: &Endpoint) -> Result<Pop3Client> {
        let conn = Conn::connect(ep).await?;
        let mut c = Pop3Client { conn };
        c.ok().await?;
        if ep.tls_mode == TlsMode::Starttls {
            c.conn.write_all(b"STLS\r\n").await?;
            c.ok().await?;
            c.conn = c.conn.upgrade(&ep.tls).await?;
        }
        Ok(c)
    }

    pub async fn login(&mut self, user: &str, pass: &str) -> Result<()> {
        self.command(&format!("USER {user}")).await?;
        self.command(&format!("PASS {pass}")).await.map(drop)
    }

    /// STAT → (messages, octets).
    pub async fn stat(&mut self) -> Result<(u32, u64)> {
        let line = self.command("STAT").await?;
        let mut w = line.split_ascii_whitespace().skip(1);
        let n = w.next().and_then(|s| s.parse().ok());
        let size = w.next().and_then(|s| s.parse().ok());
        match (n, size) {
            (Some(n), Some(s)) => Ok((n, s)),
            _ => Err(ClientError::Protocol(format!("bad STAT reply: {line}"))),
        }
    }

    /// LIST → number of scan lines.
    pub async fn list(&mut self) -> Result<u64> {
        self.command("LIST").await?;
        Ok(self.skip_multiline().await?.0)
    }

    /// RETR n → bytes of the message.
    pub async fn retr(&mut self, n: u32) -> Result<u64> {
        self.command(&format!("RETR {n}")).await?;
        Ok(self.skip_multiline().await?.1)
    }

    pub async fn noop(&mut self) -> Result<()> {
        self.command("NOOP").await.map(drop)
    }

    pub async fn quit(mut self) -> Result<()> {
        let r = self.command("QUIT").await;
        self.conn.shutdown().await;
        r.map(drop)
    }

    async fn command(&mut self, cmd: &str) -> Result<String> {
        self.conn.write_all(format!("{cmd}\r\n").as_bytes()).await?;
        self.ok().await
    }

    async fn ok(&mut self) -> Result<String> {
        let line = self.conn.read_line().await?;
        if line.starts_with(b"+OK") {
            Ok(text(line))
        } else if line.starts_with(b"-ERR") {
            Err(ClientError::Pop3(text(&line[4..]).trim().to_string()))
        } else {
            Err(ClientError::Protocol(format!("bad POP3 status line: {}", text(line))))
        }
    }

    /// Read a multi-line response up to the terminating `.` line → (lines, bytes).
    async fn skip_multiline(&mut self) -> Result<(u64, u64)> {
        let (mut lines, mut bytes) = (0u64, 0u64);
        loop {
            let line = self.conn.read_line().await?;
            if line == b".\r\n" || line == b".\n" {
                return Ok((lines, bytes));
            }
            lines += 1;
            bytes += line.len() as u64;
        }
    }
}
