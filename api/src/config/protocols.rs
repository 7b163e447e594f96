//! The protocol sections: `[smtp]`, `[imap]`, `[pop3]` and `[auth]`.

use serde::{Deserialize, Serialize};

/// `[smtp]` section of the server configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SmtpConfig {
    /// Longest command line accepted (octets including CRLF); RFC 5321 §4.5.3.1.4
    /// asks for at least 512, extensions (AUTH initial responses) need more.
    pub max_line_length: usize,
    /// Largest message accepted (octets as sent by the client), advertised in SIZE.
    pub max_message_size: usize,
    /// After a message went over the limit, how many more octets are read and
    /// thrown away (so the client can get its 552) before the connection is closed.
    pub max_discard_size: usize,
    /// RCPT commands accepted per message; more get 452 4.5.3 (RFC 5321 §4.5.3.1.8).
    pub max_recipients: usize,
    /// Failed commands before the session is closed with 421.
    pub max_errors: u32,
    /// NOOP/RSET/VRFY/EXPN/HELP allowed per session before each counts as an error.
    pub max_junk_commands: u32,
    /// Waiting for a command (RFC 5321 §4.5.3.2.7: at least 5 minutes).
    pub command_timeout_secs: u64,
    /// Waiting for the next piece of DATA/BDAT content (§4.5.3.2.5: 3 minutes).
    pub data_timeout_secs: u64,
    /// The whole of a message's content, from DATA (or a transaction's first
    /// BDAT) to its end: a client that keeps trickling bytes in under
    /// `data_timeout_secs` is cut with `421 4.4.2` after this long. Five
    /// minutes lets the largest message arrive at 1 Mbit/s.
    pub data_deadline_secs: u64,
    /// Submission listeners: how long a connection may stay without a
    /// successful AUTH, however busy it keeps itself (`421 4.7.0` then).
    pub preauth_timeout_secs: u64,
    /// Simultaneous sessions per client IP on one listener (0 = unlimited).
    pub max_connections_per_ip: usize,
    /// AUTH only on TLS connections (unless `tls.allow_plaintext_auth` is set).
    pub require_tls_for_auth: bool,
    /// On submission, MAIL FROM and every `From:`, `Sender:`, `Resent-From:` and
    /// `Resent-Sender:` address must be the account's own, one of its aliases',
    /// a subaddress of those, or one its allowed senders list (`mailcluster user
    /// senders`); the null sender is refused. Off: any sender is accepted.
    pub sender_must_match_auth: bool,
    /// Messages one account may submit per hour, counted at MAIL across the
    /// cluster (through the cache); past it `450 4.7.1`. 0: no limit.
    pub submission_messages_per_hour: u64,
    /// Recipients one account may submit to per hour (local and remote alike),
    /// counted at RCPT; past it `450 4.7.1`. 0: no limit.
    pub submission_recipients_per_hour: u64,
    /// Group commit: most deliveries per store transaction.
    pub group_commit_max_batch: usize,
    /// Group commit: how long a non-full batch may wait for more while other commits
    /// are in flight (0 = never wait; batches still form under load). A message
    /// arriving at an idle server is committed at once either way.
    pub group_commit_max_wait_ms: u64,
    /// Group commit: store transactions in flight at once.
    pub group_commit_max_concurrent: usize,
    /// Group commit across pods: `host:port` of the pod that commits this pod's
    /// deliveries in its own batches (fewer, larger transactions than every pod
    /// batching its share alone). The host may name every delivering pod (a
    /// headless Service): the lowest address leads, and that pod commits its own
    /// mail. Empty: commit here. Deliveries that cannot be sent are committed here.
    pub group_commit_leader: String,
    /// Group commit across pods: the port on which this pod accepts other pods'
    /// deliveries (0 = it does not).
    pub group_commit_port: u16,
    /// The key the leader and its followers prove to each other (HMAC of both
    /// sides' challenges); at least 16 characters. The operator generates one
    /// per cluster. Unset: this pod neither leads nor follows (it says so).
    /// Never shown (`--print-config`, logs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_commit_secret: Option<super::Secret>,
    /// How long a recipient lookup (exists / does not exist) is cached.
    pub recipient_cache_ttl_secs: u64,
    /// Outbound queue: give up (and bounce) after this long.
    pub queue_expiry_secs: u64,
    /// Where mail to the bare `<postmaster>` goes, and to `postmaster@` a local
    /// domain that has no such account (RFC 5321 §4.5.1 requires both to work).
    /// Empty: `postmaster@` the server's hostname.
    pub postmaster: String,
    /// Subaddressing (RFC 5233): the characters that end a local part's user
    /// and start its detail, so that mail to `alice+lists@example.com` reaches
    /// `alice@example.com` when no account has the full address (as Postfix's
    /// `recipient_delimiter`). Empty: off.
    pub recipient_delimiter: String,
}

impl Default for SmtpConfig {
    fn default() -> Self {
        SmtpConfig {
            max_line_length: 4096,
            max_message_size: 25 * 1024 * 1024,
            max_discard_size: 64 * 1024 * 1024,
            max_recipients: 100,
            max_errors: 20,
            max_junk_commands: 100,
            command_timeout_secs: 300,
            data_timeout_secs: 180,
            data_deadline_secs: 300,
            preauth_timeout_secs: 180,
            max_connections_per_ip: 256,
            require_tls_for_auth: true,
            sender_must_match_auth: true,
            // About 5,000 messages and 24,000 recipients a day: the order of a
            // hosted mailbox's sending limits, far above a person's mail.
            submission_messages_per_hour: 200,
            submission_recipients_per_hour: 1000,
            group_commit_max_batch: 256,
            group_commit_max_wait_ms: 1,
            group_commit_max_concurrent: 4,
            group_commit_leader: String::new(),
            group_commit_port: 0,
            group_commit_secret: None,
            recipient_cache_ttl_secs: 30,
            queue_expiry_secs: 5 * 24 * 3600,
            postmaster: String::new(),
            recipient_delimiter: "+".into(),
        }
    }
}

/// `[imap]` section of the server configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImapConfig {
    /// Longest command line (literal data excluded).
    pub max_line_bytes: usize,
    /// Largest literal (APPEND message, long string). Over it, a synchronising
    /// literal is refused before the client sends it; a LITERAL+ one closes the
    /// connection.
    pub max_literal_bytes: usize,
    /// Before login: the longest command line and the largest literal (a
    /// larger one gets `BAD` and no continuation). A password or a SASL token
    /// fits; what an unauthenticated client may make the server hold does not
    /// grow with `max_literal_bytes`.
    pub preauth_max_command_bytes: usize,
    /// Idle time after which an authenticated session is logged out (RFC 3501
    /// §5.4 asks for at least 30 minutes).
    pub autologout_secs: u64,
    /// Time from connecting to logging in, however busy the client keeps the
    /// connection (a deadline, not an idle timer). Three minutes, as Dovecot's
    /// login timeout: clients that open connections ahead of need (and pools that
    /// hold them) log in within it.
    pub preauth_timeout_secs: u64,
    /// Simultaneous connections per client IP on each IMAP listener of a pod
    /// (0 = unlimited). Generous for offices behind one NAT address (50 people
    /// with five connections each), small next to a pod's `net.max_connections`.
    pub max_connections_per_ip: usize,
    /// IDLE is ended by the server after this long (clients re-IDLE; 29 minutes
    /// keeps NAT boxes and the autologout timer happy, RFC 2177).
    pub idle_timeout_secs: u64,
    /// Concurrent sessions per account, counted across all pods through the
    /// cache (0 = unlimited). See the server's `imap::limit`.
    pub max_connections_per_user: usize,
    /// How long a session still counts against the limit after its pod stopped
    /// renewing it (crashed without logging out). Pods renew every third of it.
    pub connection_lease_secs: u64,
    /// Commands a session may issue per second; more are delayed, not refused.
    pub max_commands_per_second: u32,
    /// While IDLE without a working notification stream, poll the store this often.
    pub idle_poll_secs: u64,
    /// Messages (UID, flags and modseq, about 16 bytes each) a process keeps of recently
    /// selected mailboxes, so that SELECT of a large mailbox reads only what
    /// changed since (0 = off). See the server's `view::index_cache`.
    pub select_cache_messages: usize,
    /// Mailboxes of at least this many messages also keep their SELECT index in
    /// the shared cache (Redis; about 16 bytes a message), so that a SELECT on a
    /// pod whose own cache does not hold it reads one value and what changed
    /// since, not a row per message (0 = off; the embedded cache never does).
    pub shared_index_min_messages: usize,
    /// How long a shared SELECT index is kept after it was last written.
    pub shared_index_ttl_secs: u64,
    /// Bytes of message bodies a process keeps for IMAP FETCH and POP3 RETR/TOP
    /// (bodies never change once stored, so any pod may cache them; 0 = off). See
    /// the server's `view::bodies`.
    pub body_cache_bytes: usize,
    /// Bytes of message metadata (ENVELOPE, BODYSTRUCTURE, sizes; about 1.5 KB a
    /// message) a process keeps for FETCH (never changes once stored; 0 = off).
    /// See the server's `view::meta_cache`.
    pub meta_cache_bytes: usize,
    /// Messages whose SORT/THREAD keys a process keeps (about 250 bytes each; keys
    /// never change once a message is stored; 0 = off). See the server's
    /// `view::sort_cache`.
    pub sort_cache_messages: usize,
    /// Days an expunged message's tombstone is kept (0 = for ever). Sessions (and
    /// the SELECT cache) that last looked at a mailbox before that learn what was
    /// expunged from its full UID list instead.
    pub tombstone_retention_days: u64,
    /// How often one pod of the cluster prunes tombstones past their retention.
    pub tombstone_prune_interval_secs: u64,
}

impl Default for ImapConfig {
    fn default() -> Self {
        ImapConfig {
            max_line_bytes: 64 * 1024,
            max_literal_bytes: 50 * 1024 * 1024,
            preauth_max_command_bytes: 8 * 1024,
            autologout_secs: 30 * 60,
            preauth_timeout_secs: 180,
            max_connections_per_ip: 256,
            idle_timeout_secs: 29 * 60,
            max_connections_per_user: 50,
            connection_lease_secs: 300,
            max_commands_per_second: 200,
            idle_poll_secs: 3,
            select_cache_messages: 2_000_000,
            shared_index_min_messages: 1_000,
            shared_index_ttl_secs: 3_600,
            body_cache_bytes: 64 * 1024 * 1024,
            meta_cache_bytes: 32 * 1024 * 1024,
            sort_cache_messages: 200_000,
            tombstone_retention_days: 30,
            tombstone_prune_interval_secs: 3600,
        }
    }
}

/// RFC 1939 §3: an inactivity autologout timer, if any, must be at least 10 minutes.
pub const MIN_AUTOLOGOUT_SECS: u64 = 600;

/// Shortest `smtp.group_commit_secret` accepted.
pub const MIN_GROUP_COMMIT_SECRET: usize = 16;

/// `[pop3]` section of the server configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Pop3Config {
    /// Longest command line. RFC 2449 allows 255 octets for commands; SASL
    /// responses can be longer.
    pub max_line_bytes: usize,
    /// Inactivity after which the session is closed without entering the UPDATE
    /// state (no deletion applied). At least 600 (RFC 1939 §3).
    pub autologout_secs: u64,
    /// Time from connecting to logging in, however busy the client keeps the
    /// connection (as IMAP's `preauth_timeout_secs`).
    pub preauth_timeout_secs: u64,
    /// Simultaneous connections per client IP on each POP3 listener of a pod
    /// (0 = unlimited), as IMAP's.
    pub max_connections_per_ip: usize,
    /// Erroneous commands (unknown, malformed, wrong state, failed logins) before
    /// the connection is closed.
    pub max_errors: u32,
    /// Lifetime of the maildrop lock; the session renews it at a third of this, so
    /// a crashed holder blocks the maildrop for at most this long.
    pub lock_ttl_secs: u64,
    /// Mark messages retrieved with RETR as \Seen (applied at QUIT, with the
    /// deletions), so IMAP clients of the same account see them as read.
    pub mark_seen_on_retr: bool,
    /// Messages (about 32 bytes each) of recently opened maildrops a process
    /// keeps, so that a login reads only what changed since the last one instead
    /// of a row per message (0 = off).
    pub maildrop_cache_messages: usize,
    /// Maildrops of at least this many messages also keep their listing in the
    /// shared cache (Redis; 24 bytes a message), so that a login on a pod whose
    /// own cache does not hold it reads one value and only what changed since,
    /// rather than a row per message (0 = off; the embedded cache never keeps one).
    pub shared_listing_min_messages: usize,
    /// How long a shared listing stays in the cache after its last use.
    pub shared_listing_ttl_secs: u64,
}

impl Default for Pop3Config {
    fn default() -> Self {
        Pop3Config {
            max_line_bytes: 4096,
            autologout_secs: MIN_AUTOLOGOUT_SECS,
            preauth_timeout_secs: 180,
            max_connections_per_ip: 256,
            max_errors: 10,
            lock_ttl_secs: 60,
            mark_seen_on_retr: true,
            maildrop_cache_messages: 1_000_000,
            shared_listing_min_messages: 1_000,
            shared_listing_ttl_secs: 3_600,
        }
    }
}

/// `[auth]` in the configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Failed logins allowed per user name in one window; further attempts are
    /// refused (`RateLimited`) without checking the password until it ends.
    /// 0 disables this limit (likewise `max_failures_per_ip`).
    pub max_failures_per_user: u64,
    pub user_window_secs: u64,
    /// Failed logins allowed per client address (IPv6: per /64, what one host
    /// usually controls) in one window. Higher than per user: NAT puts many users
    /// behind one address.
    pub max_failures_per_ip: u64,
    pub ip_window_secs: u64,
    /// How long a verified credential is served from the cache after its last use
    /// (each login it serves starts the time again; a password change or account
    /// deletion purges it at once).
    pub credential_cache_secs: u64,
    /// How long the domain list (for bare local-part logins) is kept in memory.
    pub domain_cache_secs: u64,
    /// argon2 runs at once on this pod (each holds 19 MiB); 0 = half the CPUs, at
    /// least one, so a burst of first logins leaves cores to the open sessions.
    pub max_concurrent_hashes: usize,
    /// A failed login is answered after this delay, doubled for each earlier
    /// failure of the user from that client or of the client (as Dovecot's
    /// auth penalty), up to `max_failure_delay_ms`. 0 answers at once.
    pub failure_delay_ms: u64,
    pub max_failure_delay_ms: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            max_failures_per_user: 10,
            user_window_secs: 300,
            max_failures_per_ip: 30,
            ip_window_secs: 300,
            credential_cache_secs: 300,
            domain_cache_secs: 10,
            max_concurrent_hashes: 0,
            failure_delay_ms: 2_000,
            max_failure_delay_ms: 15_000,
        }
    }
}
