//! The POP3 operation of a worker: a whole session (login, STAT, LIST, one
//! RETR, QUIT) per job, as a POP3 client polls; nothing is kept between jobs,
//! since a maildrop stays locked while its session is open.

use std::sync::Arc;
use std::time::Instant;

use mailcluster_api::stress::Protocol;

use super::worker::Worker;
use crate::client::ClientError;
use crate::client::pop3::Pop3Client;

impl Worker {
    pub(super) async fn pop3_session(&mut self) -> Result<u64, ClientError> {
        let ep = self.endpoint(Protocol::Pop3)?;
        let u = self.next_user();
        let env = Arc::clone(&self.env);
        let (user, pass) = env.users.get(u);
        let t = Instant::now();
        let mut c = Pop3Client::connect(&ep).await?;
        c.login(user, pass).await?;
        self.rec.ok_aux("pop3-login", t.elapsed());
        let t = Instant::now();
        let (n, _) = c.stat().await?;
        self.rec.ok_aux("pop3-stat", t.elapsed());
        let t = Instant::now();
        c.list().await?;
        self.rec.ok_aux("pop3-list", t.elapsed());
        let mut bytes = 0;
        if n > 0 {
            let t = Instant::now();
            bytes = c.retr((self.random() % n as u64) as u32 + 1).await?;
            self.rec.ok_aux("pop3-retr", t.elapsed());
        }
        c.quit().await?;
        Ok(bytes)
    }
}
