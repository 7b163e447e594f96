//! The Redis cache: what makes pods interchangeable in a cluster.
//!
//! Connections:
//! - Commands go over one [`ConnectionManager`]: a multiplexed connection (many
//!   in-flight requests pipelined on one socket, so no pool is needed) that
//!   reconnects by itself after Redis restarts. A semaphore bounds the requests in
//!   flight; its use is what [`RedisCache::pool_stats`] reports.
//! - Notifications use ONE shared pub/sub connection per process, whose reader task
//!   fans events out to local subscribers through a `tokio::sync::broadcast`
//!   channel per account. A connection per IDLE session would cost Redis one client
//!   (and a file descriptor on both sides) per idle user — tens of thousands in a
//!   cluster — while a shared one costs one client per pod and one SUBSCRIBE per
//!   account with at least one local listener; a channel per account (rather than a
//!   pattern subscription) means a pod only receives the events its sessions want.
//!
//! Key layout (all under the configured prefix `P`, so several clusters or test
//! runs share one Redis):
//! `P cred:<hex>` → account id, `P credidx:<account>` → set of that account's
//! credential keys, `P cnt:<key>`, `P val:<key>`, `P lock:<key>`,
//! `P secret:<name>` → hash {current, previous, generation, rotated_at},
//! `P lease:<key>` → sorted set of members scored by their expiry (Redis time, in
//! milliseconds), and the channel `P mbx:<account>`.
//!
//! Leases are members of a sorted set rather than keys of their own so that
//! counting the live ones is one `ZREMRANGEBYSCORE` + `ZCARD` inside the acquire
//! script, whatever the number of pods; expiry is by score because Redis cannot
//! expire single members of a set.
//!
//! Credential purge keeps a per-account index set rather than a per-account
//! generation number stamped into each entry: a purge then really deletes the
//! entries (nothing stale survives to be trusted by mistake), a lookup stays one
//! GET with no second key to consult, and the index needs no key that lives for
//! ever — a generation counter would, since its expiry would reset it and revive
//! old entries. The set holds only verified credentials (normally one or two per
//! account) and expires with the longest of them.
//!
//! Every multi-step change is one Lua script, so it is atomic against other pods.
//! Scripts touch keys derived from their arguments (the credential purge deletes
//! the keys listed in the account's index), which standalone and Sentinel Redis
//! allow; Redis Cluster is not supported.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig, PubSubSink};
use ::redis::caching::{CacheConfig, CacheMode};
use ::redis::{
    AsyncConnectionConfig, Client, CommandCacheConfig, ProtocolVersion, RedisError, Script, ScriptInvocation,
};
use async_trait::async_trait;
use futures::stream::{BoxStream, Stream, StreamExt};
use tokio::sync::{Semaphore, SemaphorePermit, broadcast, oneshot};

use super::{Cache, CacheError, CacheResult, LockToken, MailboxEvent, RotatingSecret, hex};
use mailcluster_model::PoolStats;

/// Requests allowed in flight on the command connection at once. Beyond it callers
/// wait (backpressure) instead of growing Redis' and our buffers without bound.
const MAX_IN_FLIGHT: u32 = 512;
/// A single command taking longer than this means Redis is in trouble; the caller
/// gets `Unavailable` rather than hanging a session.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest a client-side copy is kept even if Redis never reports a change: a
/// bound on what a lost invalidation could cost (every value kept so also has
/// a shorter server-side expiry, which caps it first).
const CLIENT_COPY_TTL: Duration = Duration::from_secs(300);
/// Events buffered per account for slow local subscribers.
const EVENTS_PER_ACCOUNT: usize = 256;
/// How often the shared pub/sub connection proves it is alive.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// Sets the counter's expiry when it has none: on the first increment of a window,
/// and also should a key ever exist without one (which would otherwise count for
/// ever and lock the user out).
const COUNTER_INCR: &str = r"
local v = redis.call('INCR', KEYS[1])
if v == 1 or redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return v
";

/// Takes one back from a live counter, leaving its expiry as it is.
const COUNTER_DECR: &str = r"
local v = tonumber(redis.call('GET', KEYS[1]) or '0')
if v and v > 0 then
  redis.call('DECR', KEYS[1])
end
return 0
";

/// Extends the lock only while it still carries our token.
const LOCK_REFRESH: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// Deletes the lock only while it still carries our token: after an expiry
/// somebody else may hold it.
const LOCK_RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Caches a credential and records it in the account's index; the index lives at
/// least as long as the longest-lived credential it lists.
const CREDENTIAL_PUT: &str = r"
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SADD', KEYS[2], KEYS[1])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 1
";

/// Extends a credential and its account's index, only if the credential still
/// names that account: after a purge there is nothing to extend.
const CREDENTIAL_TOUCH: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 1
";

/// Deletes every credential listed in the account's index, then the index.
/// `unpack` is limited by the Lua stack, hence the chunks.
const CREDENTIAL_PURGE: &str = r"
local keys = redis.call('SMEMBERS', KEYS[1])
for i = 1, #keys, 500 do
  redis.call('DEL', unpack(keys, i, math.min(i + 499, #keys)))
end
redis.call('DEL', KEYS[1])
return #keys
";

/// Creates or rotates a shared secret atomically. ARGV[1] is a fresh random value
/// proposed by the caller (Lua has no good randomness); it is used only when the
/// secret is created or due. Time comes from Redis, not from the pods, so clock
/// skew between pods cannot make them disagree on "due". Two pods racing both run
/// this script one after the other: the second sees the first's rotation as fresh
/// and returns it, so one rotation yields one generation everywhere.
const SECRET_GET: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', KEYS[1], 'current', 'previous', 'generation', 'rotated_at')
if not h[1] then
  redis.call('HSET', KEYS[1], 'current', ARGV[1], 'generation', 1, 'rotated_at', now)
  return {ARGV[1], '', 1, 0}
end
local generation = tonumber(h[3]) or 1
local rotated_at = tonumber(h[4]) or 0
if now - rotated_at >= tonumber(ARGV[2]) then
  generation = generation + 1
  redis.call('HSET', KEYS[1], 'current', ARGV[1], 'previous', h[1], 'generation', generation, 'rotated_at', now)
  return {ARGV[1], h[1], generation, 1}
end
if h[2] then
  return {h[1], h[2], generation, 1}
end
return {h[1], '', generation, 0}
";

/// Drops lapsed leases, then takes one unless the set is full. Time comes from
/// Redis, like `SECRET_GET`, so pods with skewed clocks agree on what lapsed. The
/// key itself expires with its longest lease, so an abandoned set goes away.
const LEASE_ACQUIRE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 1
";

/// KEYS[i] / ARGV[i + 1] are one lease each; ARGV[1] is the TTL.
const LEASE_RENEW: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], now + ttl, ARGV[i + 1])
  if redis.call('PTTL', KEYS[i]) < ttl then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return #KEYS
";

const LEASE_COUNT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
";

/// Leases renewed per script call: bounds the script's run time (Redis runs
/// scripts one at a time) and its argument list.
const RENEW_BATCH: usize = 256;

struct Scripts {
    counter_incr: Script,
    counter_decr: Script,
    lock_refresh: Script,
    lock_release: Script,
    credential_put: Script,
    credential_touch: Script,
    credential_purge: Script,
    secret_get: Script,
    lease_acquire: Script,
    lease_renew: Script,
    lease_count: Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            counter_incr: Script::new(COUNTER_INCR),
            counter_decr: Script::new(COUNTER_DECR),
            lock_refresh: Script::new(LOCK_REFRESH),
            lock_release: Script::new(LOCK_RELEASE),
            credential_put: Script::new(CREDENTIAL_PUT),
            credential_touch: Script::new(CREDENTIAL_TOUCH),
            credential_purge: Script::new(CREDENTIAL_PURGE),
            secret_get: Script::new(SECRET_GET),
            lease_acquire: Script::new(LEASE_ACQUIRE),
            lease_renew: Script::new(LEASE_RENEW),
            lease_count: Script::new(LEASE_COUNT),
        }
    }
}

/// The shared pub/sub connection and its local fan-out.
struct Subscriber {
    sink: PubSubSink,
    /// Account id → the broadcast sender local subscribers listen on.
    channels: Mutex<HashMap<i64, broadcast::Sender<MailboxEvent>>>,
    /// Cleared by the reader task when the connection is gone.
    alive: AtomicBool,
    /// Dropped with the subscriber, which stops the reader task and so closes
    /// the connection (the reader owns its stream half).
    _stop: oneshot::Sender<()>,
}

impl Subscriber {
    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<i64, broadcast::Sender<MailboxEvent>>> {
        // Nothing panics while holding this lock; should it ever, the map of
        // senders is still consistent (each operation is a single insert/remove).
        self.channels.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

struct Inner {
    client: Client,
    conn: ConnectionManager,
    /// `value_get_hot` keeps copies (tracking is on for `conn`).
    client_copies: bool,
    prefix: String,
    /// `host:port` for error messages (the URL may hold a password; this never does).
    addr: String,
    connect_timeout: Duration,
    in_flight: Semaphore,
    scripts: Scripts,
    /// The current subscriber, replaced after its connection died. An async mutex:
    /// SUBSCRIBE/UNSUBSCRIBE are awaited while it is held so that a subscribe and a
    /// late unsubscribe of the same account cannot overtake each other.
    subscriber: tokio::sync::Mutex<Option<Arc<Subscriber>>>,
}

/// [`Cache`] over Redis; cheap to share as `Arc<dyn Cache>`.
pub struct RedisCache {
    inner: Arc<Inner>,
}

fn millis(d: Duration) -> u64 {
    // Redis rejects PX 0; anything shorter than a millisecond rounds up to one.
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rand::fill(&mut bytes[..]);
    bytes
}

fn encode_event(e: &MailboxEvent) -> String {
    format!("{} {} {}", e.account_id, e.mailbox_id, e.modseq)
}

/// Parses what [`encode_event`] wrote; anything else (another writer on the same
/// channel) is ignored rather than trusted.
fn decode_event(payload: &[u8]) -> Option<MailboxEvent> {
    let text = std::str::from_utf8(payload).ok()?;
    let mut parts = text.split(' ');
    let event = MailboxEvent {
        account_id: parts.next()?.parse().ok()?,
        mailbox_id: parts.next()?.parse().ok()?,
        modseq: parts.next()?.parse().ok()?,
    };
    parts.next().is_none().then_some(event)
}

impl RedisCache {
    /// Connects (commands and, lazily, pub/sub) to the Redis at `url`.
    /// With `client_cache_keys` above 0, [`Cache::value_get_hot`] keeps up to
    /// that many values in this process: the command connection speaks RESP3
    /// and turns on `CLIENT TRACKING` (opt-in), so Redis pushes an invalidation
    /// when a kept key changes or expires, and a reconnect drops every copy
    /// (invalidations may have been missed meanwhile).
    pub async fn connect(
        url: &str,
        prefix: &str,
        connect_timeout: Duration,
        client_cache_keys: usize,
    ) -> CacheResult<Self> {
        // The parser's messages may quote the URL, password included: do not pass
        // them on.
        let client = Client::open(url).map_err(|_| {
            CacheError::Internal(
                "invalid Redis URL (expected redis[s]://[[user]:password@]host[:port][/db])".into(),
            )
        })?;
        let addr = client.get_connection_info().addr().to_string();
        let too_slow =
            || CacheError::Unavailable(format!("Redis at {addr} did not answer within {connect_timeout:?}"));
        // One plain attempt first: the connection manager retries a refused or
        // rejected connection with back-off until the timeout, which would turn
        // "connection refused" or "wrong password" into a vague timeout.
        tokio::time::timeout(connect_timeout, client.get_multiplexed_async_connection())
            .await
            .map_err(|_| too_slow())?
            .map_err(|e| CacheError::Unavailable(format!("cannot connect to Redis at {addr}: {e}")))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_max_delay(Duration::from_secs(5));
        let attempt = |client: Client, config: ConnectionManagerConfig| {
            tokio::time::timeout(connect_timeout, ConnectionManager::new_with_config(client, config))
        };
        let unavailable =
            |e: RedisError| CacheError::Unavailable(format!("cannot connect to Redis at {addr}: {e}"));
        let plain = || async {
            attempt(client.clone(), config.clone()).await.map_err(|_| too_slow())?.map_err(unavailable)
        };
        let (conn, client_copies) = match NonZeroUsize::new(client_cache_keys) {
            None => (plain().await?, false),
            Some(keys) => {
                let info = client.get_connection_info().clone();
                let resp3 = info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3);
                let tracking = Client::open(info.set_redis_settings(resp3))
                    .map_err(|e| CacheError::Internal(format!("Redis connection settings: {e}")))?;
                let copies = CacheConfig::new()
                    .set_mode(CacheMode::OptIn)
                    .set_size(keys)
                    .set_default_client_ttl(CLIENT_COPY_TTL);
                // One attempt first, as above: the manager would retry a
                // refusal until the timeout.
                let once = AsyncConnectionConfig::new().set_cache_config(copies);
                match tokio::time::timeout(
                    connect_timeout,
                    tracking.get_multiplexed_async_connection_with_config(&once),
                )
                .await
                {
                    Ok(Ok(_)) => (
                        attempt(tracking, config.set_cache_config(copies))
                            .await
                            .map_err(|_| too_slow())?
                            .map_err(unavailable)?,
                        true,
                    ),
                    // It answered RESP2 a moment ago (above), and answered now:
                    // what it refused is RESP3 or tracking (Redis before 6, or a
                    // server that speaks the protocol without them).
                    Ok(Err(e)) if !(e.is_io_error() || e.is_timeout() || e.is_connection_dropped()) => {
                        tracing::warn!(
                            redis = %addr,
                            error = %e,
                            "Redis refused RESP3 or client tracking: every value is read from Redis \
                             (redis.client_cache_keys has no effect)"
                        );
                        (plain().await?, false)
                    }
                    Ok(Err(e)) => return Err(unavailable(e)),
                    Err(_) => return Err(too_slow()),
                }
            }
        };
        let cache = RedisCache {
            inner: Arc::new(Inner {
                client,
                conn,
                client_copies,
                prefix: prefix.to_owned(),
                addr,
                connect_timeout,
                in_flight: Semaphore::new(MAX_IN_FLIGHT as usize),
                scripts: Scripts::new(),
                subscriber: tokio::sync::Mutex::new(None),
            }),
        };
        cache.ping().await?;
        Ok(cache)
    }

    fn key(&self, kind: &str, name: &str) -> String {
        format!("{}{kind}:{name}", self.inner.prefix)
    }

    fn channel(&self, account_id: i64) -> String {
        self.key("mbx", &account_id.to_string())
    }

    fn err(&self, e: RedisError) -> CacheError {
        map_err(&self.inner.addr, e)
    }

    /// A slot on the command connection plus a handle to it.
    async fn conn(&self) -> CacheResult<(SemaphorePermit<'_>, ConnectionManager)> {
        let permit = self
            .inner
            .in_flight
            .acquire()
            .await
            .map_err(|_| CacheError::Internal("Redis request limiter closed".into()))?;
        Ok((permit, self.inner.conn.clone()))
    }

    async fn query<T: ::redis::FromRedisValue>(&self, cmd: &::redis::Cmd) -> CacheResult<T> {
        let (_permit, mut conn) = self.conn().await?;
        self.bounded(cmd.query_async(&mut conn)).await
    }

    /// Changes a value. With client-side copies, this pod's own copy of it must
    /// be gone when the change returns (a read right after a write sees the
    /// write), but Redis sends the invalidation for a connection's own write
    /// after that write's reply; a PING behind it in the same pipeline is
    /// answered after the invalidation, which the connection has then applied.
    async fn write_value(&self, cmd: ::redis::Cmd) -> CacheResult<()> {
        if !self.inner.client_copies {
            return self.query::<()>(&cmd).await;
        }
        let mut pipe = ::redis::pipe();
        pipe.add_command(cmd).ignore().cmd("PING").ignore();
        let (_permit, mut conn) = self.conn().await?;
        self.bounded(pipe.query_async::<()>(&mut conn)).await
    }

    /// Runs a credential script: KEYS are the credential and its account's index,
    /// ARGV the account id and the lifetime in milliseconds.
    async fn credential_script(
        &self,
        script: &Script,
        key: &[u8; 32],
        account_id: i64,
        ttl: Duration,
    ) -> CacheResult<()> {
        let _: i64 = self
            .invoke(
                script
                    .key(self.key("cred", &hex(key)))
                    .key(self.key("credidx", &account_id.to_string()))
                    .arg(account_id)
                    .arg(millis(ttl)),
            )
            .await?;
        Ok(())
    }

    async fn invoke<T: ::redis::FromRedisValue>(&self, script: &ScriptInvocation<'_>) -> CacheResult<T> {
        let (_permit, mut conn) = self.conn().await?;
        self.bounded(script.invoke_async(&mut conn)).await
    }

    /// Bounds a request, including any wait for the connection manager to
    /// reconnect: while Redis is away, sessions get `Unavailable` promptly instead
    /// of hanging through the reconnect back-off.
    async fn bounded<T>(&self, request: impl Future<Output = ::redis::RedisResult<T>>) -> CacheResult<T> {
        let limit = self.inner.connect_timeout + RESPONSE_TIMEOUT;
        match tokio::time::timeout(limit, request).await {
            Ok(result) => result.map_err(|e| self.err(e)),
            Err(_) => Err(CacheError::Unavailable(format!(
                "Redis at {} did not answer within {limit:?}",
                self.inner.addr
            ))),
        }
    }

    /// The live subscriber, connecting a new one when there is none or the last
    /// one's connection died. Called with the subscriber mutex held.
    async fn subscriber(&self, slot: &mut Option<Arc<Subscriber>>) -> CacheResult<Arc<Subscriber>> {
        if let Some(sub) = slot.as_ref()
            && sub.alive.load(Ordering::Acquire)
        {
            return Ok(sub.clone());
        }
        let addr = &self.inner.addr;
        let timeout = self.inner.connect_timeout;
        let pubsub = tokio::time::timeout(timeout, self.inner.client.get_async_pubsub())
            .await
            .map_err(|_| {
                CacheError::Unavailable(format!("Redis at {addr} did not answer within {timeout:?}"))
            })?
            .map_err(|e| map_err(addr, e))?;
        let (sink, mut stream) = pubsub.split();
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        let sub = Arc::new(Subscriber {
            sink,
            channels: Mutex::new(HashMap::new()),
            alive: AtomicBool::new(true),
            _stop: stop_tx,
        });
        let reader = Arc::downgrade(&sub);
        let (dead_tx, mut dead_rx) = oneshot::channel::<()>();
        tokio::spawn(keepalive(Arc::downgrade(&sub), dead_tx));
        tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    msg = stream.next() => msg,
                    _ = &mut stop_rx => return,
                    _ = &mut dead_rx => break,
                };
                let Some(msg) = msg else { break };
                let Some(sub) = reader.upgrade() else { return };
                let Some(event) = decode_event(msg.get_payload_bytes()) else { continue };
                if let Some(tx) = sub.channels().get(&event.account_id) {
                    // No receiver left: its guard is about to unsubscribe.
                    let _ = tx.send(event);
                }
            }
            // Connection lost: dropping the senders ends every local stream, whose
            // owners fall back to polling; the next subscribe reconnects.
            if let Some(sub) = reader.upgrade() {
                sub.alive.store(false, Ordering::Release);
                sub.channels().clear();
            }
            tracing::warn!("Redis pub/sub connection closed; subscribers fall back to polling");
        });
        *slot = Some(sub.clone());
        Ok(sub)
    }
}

/// Pings the pub/sub connection every [`KEEPALIVE`]. A Redis that vanished without
/// closing the socket (node failure, network partition) would otherwise leave
/// every IDLE session of this pod waiting for events that never come; a failed
/// ping tells the reader to drop the connection, which ends the local streams so
/// their owners poll the store until they resubscribe.
async fn keepalive(sub: Weak<Subscriber>, dead: oneshot::Sender<()>) {
    loop {
        tokio::time::sleep(KEEPALIVE).await;
        let Some(mut sink) = sub.upgrade().map(|s| s.sink.clone()) else { return };
        match tokio::time::timeout(RESPONSE_TIMEOUT, sink.ping::<::redis::Value>()).await {
            Ok(Ok(_)) => {}
            _ => {
                let _ = dead.send(());
                return;
            }
        }
    }
}

fn map_err(addr: &str, e: RedisError) -> CacheError {
    // READONLY: this server was a master and is a replica now (a Sentinel failover
    // moved the master); LOADING: it restarted and is reading its dataset. Both
    // mean "this Redis cannot serve us now", not a fault in the request.
    let not_serving = matches!(
        e.kind(),
        ::redis::ErrorKind::Server(
            ::redis::ServerErrorKind::ReadOnly | ::redis::ServerErrorKind::BusyLoading
        )
    );
    if not_serving
        || e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
    {
        CacheError::Unavailable(format!("Redis at {addr}: {e}"))
    } else {
        CacheError::Internal(format!("Redis at {addr}: {e}"))
    }
}

/// The stream handed to a local subscriber. When the last local subscriber of an
/// account goes away, its guard unsubscribes the shared connection from the
/// account's channel.
struct Subscription {
    events: BoxStream<'static, MailboxEvent>,
    _guard: UnsubscribeOnDrop,
}

impl Stream for Subscription {
    type Item = MailboxEvent;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<MailboxEvent>> {
        self.get_mut().events.poll_next_unpin(cx)
    }
}

struct UnsubscribeOnDrop {
    inner: Weak<Inner>,
    sub: Weak<Subscriber>,
    account_id: i64,
    channel: String,
}

impl Drop for UnsubscribeOnDrop {
    fn drop(&mut self) {
        let (Some(inner), Some(sub)) = (self.inner.upgrade(), self.sub.upgrade()) else { return };
        // Dropped outside a runtime (process exit): nothing to tidy.
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let account_id = self.account_id;
        let channel = std::mem::take(&mut self.channel);
        rt.spawn(async move {
            // Under the subscriber mutex, so a concurrent subscribe for the same
            // account either runs first (and its receiver keeps the channel) or
            // after (and subscribes again).
            let slot = inner.subscriber.lock().await;
            if !slot.as_ref().is_some_and(|current| Arc::ptr_eq(current, &sub)) {
                return;
            }
            let unused = {
                let mut channels = sub.channels();
                let unused = channels.get(&account_id).is_some_and(|tx| tx.receiver_count() == 0);
                if unused {
                    channels.remove(&account_id);
                }
                unused
            };
            if unused {
                let mut sink = sub.sink.clone();
                if let Err(e) = sink.unsubscribe(&channel).await {
                    tracing::debug!(error = %e, "Redis UNSUBSCRIBE failed");
                }
            }
            drop(slot);
        });
    }
}

#[async_trait]
impl Cache for RedisCache {
    fn backend(&self) -> &'static str {
        "redis"
    }

    fn shared_across_processes(&self) -> bool {
        true
    }

    async fn ping(&self) -> CacheResult<()> {
        let pong: String = self.query(&::redis::cmd("PING")).await?;
        if pong == "PONG" {
            Ok(())
        } else {
            Err(CacheError::Internal(format!("Redis at {} answered PING with {pong:?}", self.inner.addr)))
        }
    }

    /// Request slots on the multiplexed command connection: `max` is the in-flight
    /// limit, `in_use` the requests awaiting an answer. That is the figure that
    /// saturates under load — one multiplexed socket is never "busy" the way a
    /// pooled connection is.
    fn pool_stats(&self) -> PoolStats {
        let idle = u32::try_from(self.inner.in_flight.available_permits()).unwrap_or(MAX_IN_FLIGHT);
        PoolStats { max: MAX_IN_FLIGHT, idle, in_use: MAX_IN_FLIGHT.saturating_sub(idle) }
    }

    fn client_cache_stats(&self) -> Option<super::ClientCacheStats> {
        self.inner.conn.get_cache_statistics().map(|s| super::ClientCacheStats {
            hits: s.hit as u64,
            misses: s.miss as u64,
            invalidations: s.invalidate as u64,
        })
    }

    async fn credential_put(&self, key: &[u8; 32], account_id: i64, ttl: Duration) -> CacheResult<()> {
        self.credential_script(&self.inner.scripts.credential_put, key, account_id, ttl).await
    }

    async fn credential_get(&self, key: &[u8; 32]) -> CacheResult<Option<i64>> {
        self.query(::redis::cmd("GET").arg(self.key("cred", &hex(key)))).await
    }

    async fn credential_touch(&self, key: &[u8; 32], account_id: i64, ttl: Duration) -> CacheResult<()> {
        self.credential_script(&self.inner.scripts.credential_touch, key, account_id, ttl).await
    }

    async fn credential_purge_account(&self, account_id: i64) -> CacheResult<()> {
        let _: i64 = self
            .invoke(&self.inner.scripts.credential_purge.key(self.key("credidx", &account_id.to_string())))
            .await?;
        Ok(())
    }

    async fn counter_incr(&self, key: &str, window: Duration) -> CacheResult<u64> {
        self.invoke(self.inner.scripts.counter_incr.key(self.key("cnt", key)).arg(millis(window))).await
    }

    async fn counter_get(&self, key: &str) -> CacheResult<u64> {
        let value: Option<u64> = self.query(::redis::cmd("GET").arg(self.key("cnt", key))).await?;
        Ok(value.unwrap_or(0))
    }

    async fn counter_decr(&self, key: &str) -> CacheResult<()> {
        let _: i64 = self.invoke(&self.inner.scripts.counter_decr.key(self.key("cnt", key))).await?;
        Ok(())
    }

    async fn value_put(&self, key: &str, value: &[u8], ttl: Duration) -> CacheResult<()> {
        let cmd = ::redis::cmd("SET").arg(self.key("val", key)).arg(value).arg("PX").arg(millis(ttl)).clone();
        self.write_value(cmd).await
    }

    async fn value_get(&self, key: &str) -> CacheResult<Option<Vec<u8>>> {
        self.query(::redis::cmd("GET").arg(self.key("val", key))).await
    }

    async fn value_get_hot(&self, key: &str) -> CacheResult<Option<Vec<u8>>> {
        // Without a cache configured on the connection the opt-in is ignored.
        self.query(::redis::cmd("GET").arg(self.key("val", key)).set_cache_config(CommandCacheConfig::new()))
            .await
    }

    async fn value_del(&self, key: &str) -> CacheResult<()> {
        self.write_value(::redis::cmd("DEL").arg(self.key("val", key)).clone()).await
    }

    async fn publish(&self, event: MailboxEvent) -> CacheResult<()> {
        let cmd =
            ::redis::cmd("PUBLISH").arg(self.channel(event.account_id)).arg(encode_event(&event)).clone();
        self.query::<i64>(&cmd).await.map(|_| ())
    }

    async fn publish_all(&self, events: &[MailboxEvent]) -> CacheResult<()> {
        let mut pipe = ::redis::pipe();
        for event in events {
            pipe.cmd("PUBLISH").arg(self.channel(event.account_id)).arg(encode_event(event)).ignore();
        }
        let (_permit, mut conn) = self.conn().await?;
        self.bounded(pipe.query_async::<()>(&mut conn)).await
    }

    async fn subscribe(&self, account_id: i64) -> CacheResult<BoxStream<'static, MailboxEvent>> {
        let channel = self.channel(account_id);
        let mut slot = self.inner.subscriber.lock().await;
        let sub = self.subscriber(&mut slot).await?;
        let (rx, new) = {
            let mut channels = sub.channels();
            match channels.get(&account_id) {
                Some(tx) => (tx.subscribe(), false),
                None => {
                    // Registered before SUBSCRIBE so that an event arriving right
                    // after the confirmation already finds its receiver.
                    let (tx, rx) = broadcast::channel(EVENTS_PER_ACCOUNT);
                    channels.insert(account_id, tx);
                    (rx, true)
                }
            }
        };
        if new {
            let mut sink = sub.sink.clone();
            // Returns once Redis confirmed: events published after `subscribe`
            // returns are delivered.
            if let Err(e) = sink.subscribe(&channel).await {
                sub.channels().remove(&account_id);
                return Err(self.err(e));
            }
        }
        drop(slot);
        let guard = UnsubscribeOnDrop {
            inner: Arc::downgrade(&self.inner),
            sub: Arc::downgrade(&sub),
            account_id,
            channel,
        };
        Ok(Subscription { events: super::local::broadcast_stream(rx), _guard: guard }.boxed())
    }

    async fn lock_try(&self, key: &str, ttl: Duration) -> CacheResult<Option<LockToken>> {
        let token = hex(&random_bytes(16));
        let cmd = ::redis::cmd("SET")
            .arg(self.key("lock", key))
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(millis(ttl))
            .clone();
        // SET NX answers OK when it took the key and nil when the key exists.
        let taken: Option<String> = self.query(&cmd).await?;
        Ok(taken.map(|_| LockToken { key: key.to_owned(), token }))
    }

    async fn lock_refresh(&self, lock: &LockToken, ttl: Duration) -> CacheResult<bool> {
        let extended: i64 = self
            .invoke(
                self.inner
                    .scripts
                    .lock_refresh
                    .key(self.key("lock", &lock.key))
                    .arg(&lock.token)
                    .arg(millis(ttl)),
            )
            .await?;
        Ok(extended == 1)
    }

    async fn lock_release(&self, lock: &LockToken) -> CacheResult<()> {
        let _: i64 = self
            .invoke(self.inner.scripts.lock_release.key(self.key("lock", &lock.key)).arg(&lock.token))
            .await?;
        Ok(())
    }

    async fn lease_acquire(&self, key: &str, member: &str, limit: u64, ttl: Duration) -> CacheResult<bool> {
        let taken: i64 = self
            .invoke(
                self.inner
                    .scripts
                    .lease_acquire
                    .key(self.key("lease", key))
                    .arg(member)
                    .arg(limit)
                    .arg(millis(ttl)),
            )
            .await?;
        Ok(taken == 1)
    }

    async fn lease_renew(&self, leases: &[(String, String)], ttl: Duration) -> CacheResult<()> {
        for batch in leases.chunks(RENEW_BATCH) {
            let mut invocation = self.inner.scripts.lease_renew.prepare_invoke();
            invocation.arg(millis(ttl));
            for (key, member) in batch {
                invocation.key(self.key("lease", key)).arg(member);
            }
            let _: i64 = self.invoke(&invocation).await?;
        }
        Ok(())
    }

    async fn lease_release(&self, key: &str, member: &str) -> CacheResult<()> {
        self.query::<i64>(::redis::cmd("ZREM").arg(self.key("lease", key)).arg(member)).await.map(|_| ())
    }

    async fn lease_count(&self, key: &str) -> CacheResult<u64> {
        self.invoke(&self.inner.scripts.lease_count.key(self.key("lease", key))).await
    }

    async fn secret_get(
        &self,
        name: &str,
        len: usize,
        rotate_every: Duration,
    ) -> CacheResult<RotatingSecret> {
        let (current, previous, generation, has_previous): (Vec<u8>, Vec<u8>, u64, i64) = self
            .invoke(
                self.inner
                    .scripts
                    .secret_get
                    .key(self.key("secret", name))
                    .arg(random_bytes(len))
                    .arg(millis(rotate_every)),
            )
            .await?;
        Ok(RotatingSecret { current, previous: (has_previous == 1).then_some(previous), generation })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_and_garbage_is_ignored() {
        let e = MailboxEvent { account_id: 7, mailbox_id: -3, modseq: u64::MAX };
        assert_eq!(decode_event(encode_event(&e).as_bytes()), Some(e));
        assert_eq!(decode_event(b"7 3"), None);
        assert_eq!(decode_event(b"7 3 4 5"), None);
        assert_eq!(decode_event(b"a b c"), None);
        assert_eq!(decode_event(&[0xff, 0x20]), None);
    }

    #[test]
    fn durations_become_positive_milliseconds() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(10)), 1);
        assert_eq!(millis(Duration::from_secs(2)), 2000);
    }
}
