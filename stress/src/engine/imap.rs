//! The IMAP operations of a worker: logins, searches and fetches over a plain
//! session, and the commands of a mail client's session (`imap-mix`), which
//! keeps its own list of the mailbox and queues what a client does next.

use std::sync::Arc;
use std::time::Instant;

use mailcluster_api::stress::{AuthMechanism, Protocol};

use super::ImapCmd;
use super::worker::Worker;
use crate::client::ClientError;
use crate::client::imap::ImapClient;

/// A mail client's IMAP session (`imap-mix`).
pub(super) struct MuaSession {
    pub(super) client: ImapClient,
    /// Index of the user logged in.
    pub(super) user: usize,
    /// UIDs of INBOX as this session knows them (flag sync, APPENDUID, deletes).
    pub(super) uids: Vec<u32>,
    pub(super) cursor: usize,
    /// Commands after LOGIN so far.
    pub(super) ops: u32,
    /// Commands the session does next, before any drawn one.
    pub(super) pending: std::collections::VecDeque<ImapCmd>,
}

pub(super) struct ImapSession {
    pub(super) client: ImapClient,
    pub(super) uids: Vec<u32>,
    /// Next index into `uids`.
    pub(super) cursor: usize,
    /// Operations on this session so far.
    pub(super) ops: u32,
}

impl Worker {
    /// A login on a connection of its own (LOGIN, or AUTHENTICATE PLAIN), closed after.
    pub(super) async fn imap_auth(&mut self, plain: bool) -> Result<u64, ClientError> {
        let ep = self.endpoint(Protocol::Imap)?;
        let u = self.next_user();
        let (user, pass) = self.env.users.get(u);
        let t0 = Instant::now();
        let mut c = ImapClient::connect(&ep).await?;
        self.rec.ok_aux("imap-connect", t0.elapsed());
        if plain {
            c.authenticate_plain(user, pass).await?;
        } else {
            c.login(user, pass).await?;
        }
        let _ = c.logout().await;
        Ok(0)
    }

    pub(super) async fn imap_search(&mut self) -> Result<u64, ClientError> {
        let s = self.imap_session().await?;
        let n = s.client.uid_search("UNSEEN").await?.len();
        self.imap_used().await;
        Ok(n as u64)
    }

    /// One message of INBOX, whole (`body`) or its header.
    pub(super) async fn imap_fetch(&mut self, body: bool) -> Result<u64, ClientError> {
        let s = self.imap_session().await?;
        // The UID list is loaded on first use (a session opened by a search has
        // none yet) and reloaded while empty (a mixed run fills the mailbox).
        if s.uids.is_empty() {
            s.uids = s.client.uid_search("ALL").await?;
        }
        if s.uids.is_empty() {
            return Err(ClientError::Imap("empty-mailbox".into(), "INBOX has no messages".into()));
        }
        let uid = s.uids[s.cursor % s.uids.len()];
        s.cursor += 1;
        let item = if body { "BODY.PEEK[]" } else { "BODY.PEEK[HEADER]" };
        let bytes = s.client.uid_fetch(uid, item).await?;
        self.imap_used().await;
        Ok(bytes)
    }

    async fn imap_session(&mut self) -> Result<&mut ImapSession, ClientError> {
        if self.imap.is_none() {
            let t0 = Instant::now();
            let (mut client, _) = self.imap_connect_login().await?;
            client.select("INBOX", false).await?;
            self.rec.ok_aux("imap-session", t0.elapsed());
            // Start each session at a different message so workers on the same
            // mailbox do not all fetch the same UID.
            let cursor = (self.random() % 1024) as usize;
            self.imap = Some(ImapSession { client, uids: Vec::new(), cursor, ops: 0 });
        }
        match &mut self.imap {
            Some(s) => Ok(s),
            None => Err(ClientError::Closed),
        }
    }

    async fn imap_used(&mut self) {
        let limit = self.plan.ops_per_connection;
        let done = match &mut self.imap {
            Some(s) => {
                s.ops += 1;
                limit > 0 && s.ops >= limit
            }
            None => false,
        };
        if done && let Some(s) = self.imap.take() {
            let _ = s.client.logout().await;
        }
    }

    /// The command a client session does next: opening it, what it queued, LOGOUT
    /// once it has done `opsPerConnection` commands, else the drawn one (an APPEND
    /// when the mailbox is empty and the drawn command needs a message).
    pub(super) fn next_imap_cmd(&mut self, drawn: ImapCmd) -> ImapCmd {
        let limit = self.plan.ops_per_connection;
        let Some(s) = &mut self.mua else { return ImapCmd::Login };
        if let Some(cmd) = s.pending.pop_front() {
            return cmd;
        }
        if limit > 0 && s.ops >= limit {
            return ImapCmd::Logout;
        }
        if drawn.needs_message() && s.uids.is_empty() { ImapCmd::Append } else { drawn }
    }

    pub(super) async fn imap_client_command(&mut self, cmd: ImapCmd) -> Result<u64, ClientError> {
        match cmd {
            ImapCmd::Login => self.imap_client_login().await,
            ImapCmd::Logout => {
                let s = self.mua.take().ok_or(ClientError::Closed)?;
                s.client.logout().await?;
                Ok(0)
            }
            cmd => self.imap_client_in_session(cmd).await,
        }
    }

    async fn imap_client_login(&mut self) -> Result<u64, ClientError> {
        let (client, u) = self.imap_connect_login().await?;
        let cursor = self.random() as usize;
        let pending = [ImapCmd::List, ImapCmd::Status, ImapCmd::Select, ImapCmd::FetchFlags].into();
        self.mua = Some(MuaSession { client, user: u, uids: Vec::new(), cursor, ops: 0, pending });
        Ok(0)
    }

    /// A new IMAP connection logged in as the next user (LOGIN, or AUTHENTICATE
    /// PLAIN with `auth: plain`), and that user's index.
    async fn imap_connect_login(&mut self) -> Result<(ImapClient, usize), ClientError> {
        let ep = self.endpoint(Protocol::Imap)?;
        let u = self.next_user();
        let env = Arc::clone(&self.env);
        let (user, pass) = env.users.get(u);
        let mut client = ImapClient::connect(&ep).await?;
        if self.plan.auth == AuthMechanism::Plain {
            client.authenticate_plain(user, pass).await?;
        } else {
            client.login(user, pass).await?;
        }
        Ok((client, u))
    }

    async fn imap_client_in_session(&mut self, cmd: ImapCmd) -> Result<u64, ClientError> {
        let r = self.random();
        let env = Arc::clone(&self.env);
        let counter = self.counter;
        let s = self.mua.as_mut().ok_or(ClientError::Closed)?;
        s.ops += 1;
        // A message of the session's list: consecutive reads walk it from a random
        // start, as a reader going down the list does.
        let at = |s: &mut MuaSession| {
            s.cursor = s.cursor.wrapping_add(1);
            s.cursor % s.uids.len().max(1)
        };
        if cmd.needs_message() && s.uids.is_empty() {
            return Err(ClientError::Imap("empty-mailbox".into(), "INBOX has no messages".into()));
        }
        let bytes = match cmd {
            ImapCmd::List => {
                s.client.command(r#"LIST "" "*""#).await?;
                0
            }
            ImapCmd::Status => {
                s.client.command("STATUS INBOX (MESSAGES UNSEEN UIDNEXT)").await?;
                0
            }
            ImapCmd::Select => {
                s.client.select("INBOX", false).await?;
                0
            }
            ImapCmd::FetchFlags => {
                // Messages already \Deleted are left out: the next EXPUNGE (this
                // session's or another's) takes them, as a client hides them.
                let resp = s.client.command("UID FETCH 1:* (FLAGS)").await?;
                s.uids = resp.uids;
                s.uids.retain(|u| !resp.deleted.contains(u));
                s.uids.sort_unstable();
                s.uids.dedup();
                0
            }
            ImapCmd::FetchEnvelope => {
                let first = at(s);
                let last = (first + 24).min(s.uids.len() - 1);
                let (lo, hi) = (s.uids[first], s.uids[last]);
                let cmd = format!("UID FETCH {lo}:{hi} (UID FLAGS RFC822.SIZE INTERNALDATE ENVELOPE)");
                s.client.command(&cmd).await?.literal_bytes
            }
            ImapCmd::FetchBody => {
                let i = at(s);
                s.client.uid_fetch(s.uids[i], "BODY.PEEK[]").await?
            }
            ImapCmd::Store => {
                let uid = s.uids[r as usize % s.uids.len()];
                let change =
                    ["+FLAGS (\\Seen)", "-FLAGS (\\Seen)", "+FLAGS (\\Flagged)", "-FLAGS (\\Flagged)"]
                        [(counter % 4) as usize];
                s.client.command(&format!("UID STORE {uid} {change}")).await?;
                0
            }
            ImapCmd::Delete => {
                let uid = s.uids.remove(r as usize % s.uids.len());
                s.client.command(&format!("UID STORE {uid} +FLAGS.SILENT (\\Deleted)")).await?;
                s.pending.push_back(ImapCmd::Expunge);
                0
            }
            ImapCmd::Expunge => {
                s.client.command("EXPUNGE").await?;
                0
            }
            ImapCmd::Append => {
                let msg = env.messages.pick(r);
                let from = env.users.get(s.user).0;
                let header = format!("From: {from}\r\nMessage-ID: <{}>\r\n", env.next_message_id());
                if let Some(uid) = s.client.append("INBOX", "\\Seen", &[header.as_bytes(), msg]).await? {
                    s.uids.push(uid);
                }
                (header.len() + msg.len()) as u64
            }
            ImapCmd::Noop => {
                s.client.noop().await?;
                0
            }
            ImapCmd::Login | ImapCmd::Logout => {
                return Err(ClientError::Protocol(format!("{} inside a session", cmd.name())));
            }
        };
        Ok(bytes)
    }
}
