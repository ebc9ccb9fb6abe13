//! Redis, standalone or cluster, behind one connection type so every script runs the same way.
//! The connection opens lazily (the manager is built at import time, outside any event loop) and
//! every call, the connect included, is bounded by `redis_timeout`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;

use futures_util::{stream, StreamExt};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, Script, ScriptInvocation, TlsCertificates, Value};
use tokio::sync::Mutex;

use super::{batches, AcquireOutcome, InLine, LeasesOf, Line, RenewRound, Renewed};
use crate::errors::{CoreError, CoreResult, Rejection};
use crate::keys;
use crate::lease::LeaseRecord;
use crate::scripts;

enum Endpoint {
    Standalone(Box<redis::Client>),
    Cluster(Box<ClusterClient>),
    /// The sentinels and the name of the master they watch.
    Sentinel(Box<Mutex<SentinelClient>>),
}

/// A cheap, clonable, multiplexed handle to either kind of deployment.
#[derive(Clone)]
enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Standalone(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Standalone(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

/// Hash tags kept alive per keep-alive call (standalone; a cluster takes one per call).
const TAGS_PER_KEEPALIVE: usize = 1000;

/// Script calls of one renewal round in flight at once, so acquires are not queued behind it.
const RENEW_CALLS_IN_FLIGHT: usize = 2;

/// Holder ids stay below 2^48: exact as Redis scores, and printed the same by Lua and Rust.
const HOLDER_IDS: u64 = 1 << 48;

fn lock<T>(mutex: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

pub struct RedisBackend {
    endpoint: Endpoint,
    /// This manager's holder id: it scores its leases in every pool and keeps them alive with
    /// one entry per hash tag (see `lua/holders.lua`).
    holder: u64,
    /// Where each tag's keep-alive goes on refreshing the holder's pools (absent: from the start).
    cursors: StdMutex<HashMap<String, String>>,
    /// Opened on first use; behind Sentinel, dropped when the master fails so the next call
    /// asks the sentinels for the new one.
    connection: Mutex<Option<Connection>>,
    /// The URL without its password, for error messages.
    target: String,
    timeout: Duration,
}

impl RedisBackend {
    /// Parses `redis://`, `rediss://`, `unix://`, `redis+unix://` and
    /// `redis[s]+cluster://[user:password@]host:port,host:port`. `ca_pem` replaces the system's
    /// trusted roots for TLS (a private CA). Nothing is connected yet.
    pub fn new(url: &str, timeout: Duration, ca_pem: Option<Vec<u8>>) -> CoreResult<Self> {
        // rustls needs one crypto provider per process; a second install is a harmless no-op.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let target = redact(url);
        let bad_url =
            |e: redis::RedisError| CoreError::InvalidInput(format!("cannot use Redis URL {target:?}: {e}"));
        let certificates = ca_pem.map(|pem| TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        });
        let cluster = url
            .strip_prefix("redis+cluster://")
            .map(|rest| ("redis", rest))
            .or_else(|| url.strip_prefix("rediss+cluster://").map(|rest| ("rediss", rest)));
        let endpoint = if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            Endpoint::Sentinel(Box::new(Mutex::new(sentinel_client(rest, &target)?)))
        } else if let Some((scheme, rest)) = cluster {
            let (userinfo, hosts) = match rest.rsplit_once('@') {
                Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
                None => (String::new(), rest),
            };
            let nodes: Vec<String> = hosts
                .trim_end_matches('/')
                .split(',')
                .filter(|h| !h.is_empty())
                .map(|h| format!("{scheme}://{userinfo}{h}"))
                .collect();
            if nodes.is_empty() {
                return Err(CoreError::InvalidInput(format!(
                    "Redis Cluster URL {target:?} names no node: use redis+cluster://host:port,host:port"
                )));
            }
            let mut builder = ClusterClient::builder(nodes)
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .retries(1);
            if let Some(certificates) = certificates {
                builder = builder.certs(certificates);
            }
            Endpoint::Cluster(Box::new(builder.build().map_err(bad_url)?))
        } else {
            let client = match certificates {
                Some(certificates) => redis::Client::build_with_tls(url, certificates),
                None => redis::Client::open(url),
            };
            Endpoint::Standalone(Box::new(client.map_err(bad_url)?))
        };
        Ok(RedisBackend {
            endpoint,
            holder: 1 + u64::from_le_bytes(uuid::Uuid::new_v4().as_bytes()[..8].try_into().expect("8 bytes"))
                % (HOLDER_IDS - 1),
            cursors: StdMutex::new(HashMap::new()),
            connection: Mutex::new(None),
            target,
            timeout,
        })
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.endpoint, Endpoint::Cluster(_))
    }

    pub fn target(&self) -> &str {
        &self.target
    }

    /// The shared connection, opened on first use (retried on the next call if that failed).
    async fn connection(&self) -> CoreResult<Connection> {
        let mut slot = self.connection.lock().await;
        if let Some(connection) = slot.as_ref() {
            return Ok(connection.clone());
        }
        let opened = match &self.endpoint {
            Endpoint::Standalone(client) => self.manage(client.as_ref().clone()).await,
            Endpoint::Cluster(client) => client.get_async_connection().await.map(Connection::Cluster),
            Endpoint::Sentinel(sentinel) => {
                let master = sentinel.lock().await.async_get_client().await;
                match master {
                    Ok(master) => self.manage(master).await,
                    Err(e) => Err(e),
                }
            }
        }
        .map_err(|e| CoreError::from_redis(&e, &self.target))?;
        *slot = Some(opened.clone());
        Ok(opened)
    }

    /// A multiplexed connection that reconnects by itself, with our timeouts.
    async fn manage(&self, client: redis::Client) -> redis::RedisResult<Connection> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        ConnectionManager::new_with_config(client, config)
            .await
            .map(Connection::Standalone)
    }

    /// Runs one script call (EVALSHA, SCRIPT LOAD on NOSCRIPT), connecting first if needed; the
    /// whole of it is bounded by `redis_timeout`.
    async fn run<T: FromRedisValue>(&self, invocation: &ScriptInvocation<'_>) -> CoreResult<T> {
        let call = async {
            let mut connection = self.connection().await?;
            invocation.invoke_async(&mut connection).await.map_err(|e| {
                // Behind Sentinel a dead or demoted master means asking the sentinels again.
                if e.is_io_error() || e.is_timeout() || e.code() == Some("READONLY") {
                    self.forget_master();
                }
                CoreError::from_redis(&e, &self.target)
            })
        };
        let outcome = tokio::time::timeout(self.timeout, call).await;
        if outcome.is_err() {
            self.forget_master();
        }
        outcome.map_err(|_| CoreError::timeout(&self.target, self.timeout))?
    }

    fn forget_master(&self) {
        if matches!(self.endpoint, Endpoint::Sentinel(_)) {
            if let Ok(mut slot) = self.connection.try_lock() {
                *slot = None;
            }
        }
    }

    pub async fn acquire(
        &self,
        lease: &LeaseRecord,
        ttl_ms: u64,
        in_line: Option<InLine<'_>>,
    ) -> CoreResult<AcquireOutcome> {
        let pools = &lease.pools;
        let mut invocation = scripts::ACQUIRE.prepare_invoke();
        for pool in pools {
            invocation.key(&pool.key);
        }
        invocation.key(&lease.holders);
        let waiter = in_line.and_then(|l| l.waiter);
        invocation
            .arg(&lease.id)
            .arg(ttl_ms)
            .arg(lease.weight)
            .arg(waiter.map_or("", |w| w.id.as_str()))
            .arg(waiter.map_or(0, |w| w.ttl_ms))
            .arg(u8::from(in_line.is_some()))
            .arg(in_line.map_or("", |l| l.line.channel.as_str()))
            .arg(lease.own_pools)
            .arg(self.holder);
        if let Some(in_line) = in_line {
            for key in &in_line.line.keys {
                invocation.key(key);
            }
        }
        for pool in pools {
            invocation.arg(pool.capacity);
        }
        let reply: Vec<u64> = self.run(&invocation).await?;
        match reply.as_slice() {
            [1, used @ ..] if used.len() == pools.len() => Ok(AcquireOutcome::Granted(used.to_vec())),
            [2, ticket] => Ok(AcquireOutcome::Wait(*ticket)),
            [0, index, current, retry_after_ms] => {
                let pool = pools
                    .get((*index as usize).wrapping_sub(1))
                    .ok_or_else(|| bad_reply(&reply))?;
                Ok(AcquireOutcome::Rejected(Rejection {
                    limit: pool.name.clone(),
                    capacity: pool.capacity,
                    current: *current,
                    retry_after_ms: *retry_after_ms,
                }))
            }
            _ => Err(bad_reply(&reply)),
        }
    }

    pub async fn leave(&self, line: &Line, waiter_id: &str) -> CoreResult<()> {
        let mut invocation = scripts::LEAVE.prepare_invoke();
        invocation
            .key(&line.keys[0])
            .key(&line.keys[1])
            .arg(waiter_id)
            .arg(self.holder);
        self.run::<u64>(&invocation).await.map(drop)
    }

    /// One write keeps all of this process's waiters in line; `waiter_ids` (every waiter it
    /// has) lets the script take out any it no longer has.
    pub async fn heartbeat(&self, line: &Line, waiter_ids: &[String], ttl_ms: u64) -> CoreResult<()> {
        let mut invocation = scripts::HEARTBEAT.prepare_invoke();
        invocation
            .key(&line.keys[1])
            .key(&line.keys[0])
            .arg(ttl_ms)
            .arg(self.holder)
            .arg(waiter_ids);
        self.run::<u64>(&invocation).await.map(drop)
    }

    /// One renewal round: a keep-alive per hash tag (many tags per call). The leases of tags
    /// where the holder's entry had expired or vanished, or where grants it knows of are missing,
    /// are then checked one by one and taken back where capacity allows; once all of a tag's
    /// leases are checked, its count of granted members is brought up to date.
    pub async fn renew(
        &self,
        groups: &[(String, u64)],
        leases_of: LeasesOf<'_>,
        ttl_ms: u64,
        period_ms: u64,
    ) -> RenewRound {
        // Scans of tags no longer held are over.
        let tags: HashSet<&str> = groups.iter().map(|(holders, _)| holders.as_str()).collect();
        lock(&self.cursors).retain(|tag, _| tags.contains(tag.as_str()));
        let mut round = RenewRound::default();
        let mut unchecked = Vec::new();
        for (group, alive) in self
            .keepalive_all(groups, false, ttl_ms, period_ms, &mut round)
            .await
        {
            if alive {
                round.renewed.push(group.0.clone());
            } else {
                unchecked.push(group);
            }
        }
        if unchecked.is_empty() {
            return round;
        }
        let check: Vec<Arc<LeaseRecord>> = unchecked
            .iter()
            .flat_map(|(holders, _)| leases_of(holders))
            .filter(|lease| !lease.is_released())
            .collect();
        // Built group by group, so already in runs of one tag each (one slot per batch).
        let checks: Vec<_> = batches(&check, self.is_cluster())
            .into_iter()
            .map(|batch| async move {
                let reclaim = Batch::Reclaim {
                    holder: self.holder,
                    ttl_ms,
                };
                let invocation = batch_invocation(&scripts::RECLAIM, batch, reclaim);
                (batch, self.run::<(Vec<usize>, Vec<usize>)>(&invocation).await)
            })
            .collect();
        let checks: Vec<_> = stream::iter(checks)
            .buffer_unordered(RENEW_CALLS_IN_FLIGHT)
            .collect()
            .await;
        let mut failed = HashSet::new();
        for (batch, outcome) in checks {
            match outcome {
                Ok((lost, reclaimed)) => round.record(batch, &Renewed { lost, reclaimed }),
                Err(e) => {
                    round.failures.push(e);
                    failed.extend(batch.iter().map(|lease| lease.holders.as_str()));
                }
            }
        }
        // Leases taken back were granted again (the manager counts them after this round).
        let mut taken_back: HashMap<&str, u64> = HashMap::new();
        for lease in &round.reclaimed {
            *taken_back.entry(lease.holders.as_str()).or_default() += lease.units();
        }
        // A tag left unchecked keeps its shortfall, so the next round checks it again.
        let checked: Vec<(String, u64)> = unchecked
            .into_iter()
            .filter(|(holders, _)| !failed.contains(holders.as_str()))
            .map(|(holders, granted)| {
                let again = taken_back.get(holders.as_str()).copied().unwrap_or(0);
                (holders.clone(), granted + again)
            })
            .collect();
        for (group, alive) in self
            .keepalive_all(&checked, true, ttl_ms, period_ms, &mut round)
            .await
        {
            if alive {
                round.renewed.push(group.0.clone());
            }
        }
        round
    }

    /// Keep-alive calls for many groups, a few in flight at once; failures go to the round.
    async fn keepalive_all<'g>(
        &self,
        groups: &'g [(String, u64)],
        resync: bool,
        ttl_ms: u64,
        period_ms: u64,
        round: &mut RenewRound,
    ) -> Vec<(&'g (String, u64), bool)> {
        let per_call = if self.is_cluster() { 1 } else { TAGS_PER_KEEPALIVE };
        // Futures built first, then streamed: a closure inside the stream would not be `Send`.
        let calls: Vec<_> = groups
            .chunks(per_call)
            .map(|chunk| async move { (chunk, self.keepalive(chunk, resync, ttl_ms, period_ms).await) })
            .collect();
        let outcomes: Vec<_> = stream::iter(calls)
            .buffer_unordered(RENEW_CALLS_IN_FLIGHT)
            .collect()
            .await;
        let mut alive = Vec::with_capacity(groups.len());
        for (chunk, outcome) in outcomes {
            match outcome {
                Ok(flags) => {
                    round.answered = true;
                    alive.extend(chunk.iter().zip(flags));
                }
                Err(e) => round.failures.push(e),
            }
        }
        alive
    }

    /// Extends this holder's entry in each group's tag; false for a tag where it had expired or
    /// vanished, or where grants it knows of are missing. With `resync`, first raises each tag's
    /// count of granted members to what this process knows (its leases were just checked).
    async fn keepalive(
        &self,
        groups: &[(String, u64)],
        resync: bool,
        ttl_ms: u64,
        period_ms: u64,
    ) -> CoreResult<Vec<bool>> {
        let mut invocation = scripts::KEEPALIVE.prepare_invoke();
        invocation
            .arg(self.holder)
            .arg(ttl_ms)
            .arg(period_ms)
            .arg(u8::from(resync));
        {
            let cursors = lock(&self.cursors);
            for (tag, granted) in groups {
                invocation.key(tag);
                invocation
                    .arg(cursors.get(tag).map_or("0", String::as_str))
                    .arg(*granted);
            }
        }
        let reply: Vec<String> = self.run(&invocation).await?;
        if reply.len() != 2 * groups.len() {
            return Err(CoreError::Backend(format!(
                "unexpected reply of {} items from the keep-alive script for {} tags; is another version of fastapi_stream_lease using the same key_prefix?",
                reply.len(),
                groups.len()
            )));
        }
        let mut cursors = lock(&self.cursors);
        Ok(groups
            .iter()
            .zip(reply.chunks(2))
            .map(|((tag, _), pair)| {
                if pair[1] == "0" {
                    cursors.remove(tag);
                } else {
                    cursors.insert(tag.clone(), pair[1].clone());
                }
                pair[0] == "1"
            })
            .collect())
    }

    pub async fn release(&self, leases: &[Arc<LeaseRecord>], line: Option<&Line>) -> CoreResult<u64> {
        self.run(&batch_invocation(
            &scripts::RELEASE,
            leases,
            Batch::Release {
                holder: self.holder,
                line,
            },
        ))
        .await
    }

    /// Calls `woken` for every wake-up published on the line's channel, until the subscription
    /// breaks (the caller subscribes again). A cluster has no single node to subscribe to, so
    /// its waiters rely on their periodic check.
    pub async fn listen(&self, line: &Line, woken: impl Fn()) -> CoreResult<()> {
        let client = match &self.endpoint {
            Endpoint::Standalone(client) => client.as_ref().clone(),
            Endpoint::Sentinel(sentinel) => sentinel
                .lock()
                .await
                .async_get_client()
                .await
                .map_err(|e| CoreError::from_redis(&e, &self.target))?,
            Endpoint::Cluster(_) => return std::future::pending().await,
        };
        let subscribe = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&line.channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        let mut pubsub = tokio::time::timeout(self.timeout, subscribe)
            .await
            .map_err(|_| CoreError::timeout(&self.target, self.timeout))?
            .map_err(|e| CoreError::from_redis(&e, &self.target))?;
        let mut messages = pubsub.on_message();
        while messages.next().await.is_some() {
            woken();
        }
        Ok(())
    }

    pub async fn count(&self, pool_key: &str) -> CoreResult<u64> {
        let mut invocation = scripts::COUNT.prepare_invoke();
        invocation.key(pool_key).key(keys::holders_key(pool_key));
        self.run(&invocation).await
    }
}

/// `[user:password@]host:port,host:port/service[/db]` -> a client of the master `service`.
fn sentinel_client(rest: &str, target: &str) -> CoreResult<SentinelClient> {
    let bad = |why: String| {
        CoreError::InvalidInput(format!(
            "cannot use Sentinel URL {target:?}: {why}; use redis+sentinel://[user:password@]host:port,host:port/master_name[/db]"
        ))
    };
    let (userinfo, rest) = rest.rsplit_once('@').map_or((None, rest), |(u, r)| (Some(u), r));
    let mut parts = rest.split('/');
    let hosts = parts.next().unwrap_or_default();
    let service = parts
        .next()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad("no master name".into()))?;
    let db: i64 = match parts.next().filter(|s| !s.is_empty()) {
        Some(db) => db.parse().map_err(|_| bad(format!("bad db {db:?}")))?,
        None => 0,
    };
    let sentinels: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("redis://{h}"))
        .collect();
    if sentinels.is_empty() {
        return Err(bad("no sentinel address".into()));
    }
    let mut master = redis::RedisConnectionInfo::default().set_db(db);
    if let Some(userinfo) = userinfo {
        let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
        if !user.is_empty() {
            master = master.set_username(user);
        }
        if !password.is_empty() {
            master = master.set_password(password);
        }
    }
    let node = SentinelNodeConnectionInfo::default().set_redis_connection_info(master);
    SentinelClient::build(sentinels, service, Some(node), SentinelServerType::Master)
        .map_err(|e| bad(e.to_string()))
}

/// What a batched script call does, and the arguments that go before the leases.
enum Batch<'a> {
    /// ARGV starts with the holder id and the lease duration; each pool index is followed by
    /// its capacity.
    Reclaim { holder: u64, ttl_ms: u64 },
    /// ARGV starts with the wake-up channel ('' without a line) and the holder id; the line is
    /// the last key.
    Release { holder: u64, line: Option<&'a Line> },
}

/// KEYS: each distinct pool and holders key once (then the line, for a release); ARGV: the
/// batch's lead arguments, then per lease: id, weight, the KEYS index of its holders, pool count
/// k, and k KEYS indexes (with capacities, for a reclaim).
fn batch_invocation<'a>(
    script: &'a Script,
    leases: &[Arc<LeaseRecord>],
    batch: Batch<'_>,
) -> ScriptInvocation<'a> {
    let mut invocation = script.prepare_invoke();
    let mut key_index: HashMap<&str, usize> = HashMap::new();
    let keys = leases
        .iter()
        .flat_map(|l| l.pools.iter().map(|p| p.key.as_str()).chain([l.holders.as_str()]));
    for key in keys {
        if !key_index.contains_key(key) {
            key_index.insert(key, key_index.len() + 1);
            invocation.key(key);
        }
    }
    let with_capacity = match batch {
        Batch::Reclaim { holder, ttl_ms } => {
            invocation.arg(holder).arg(ttl_ms);
            true
        }
        Batch::Release { holder, line } => {
            match line {
                Some(line) => invocation.key(&line.keys[0]).arg(&line.channel),
                None => invocation.arg(""),
            };
            invocation.arg(holder);
            false
        }
    };
    for lease in leases {
        invocation
            .arg(&lease.id)
            .arg(lease.weight)
            .arg(key_index[lease.holders.as_str()])
            .arg(lease.pools.len());
        for pool in &lease.pools {
            invocation.arg(key_index[pool.key.as_str()]);
            if with_capacity {
                invocation.arg(pool.capacity);
            }
        }
    }
    invocation
}

fn bad_reply(reply: &[u64]) -> CoreError {
    CoreError::Backend(format!(
        "unexpected reply {reply:?} from the acquire script; is another version of fastapi_stream_lease using the same key_prefix?"
    ))
}

/// Hides passwords: `scheme://user:password@host` -> `scheme://user:***@host`, and the `pass=`
/// query parameter of socket URLs.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or("", |(u, _)| u);
            format!("{user}:***@{host}")
        }
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| {
                    if pair.starts_with("pass=") {
                        "pass=***".to_owned()
                    } else {
                        pair.to_owned()
                    }
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(redact("redis://:pw@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(redact("redis://u:pw@h:1"), "redis://u:***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(
            redact("unix:///tmp/r.sock?db=2&pass=pw"),
            "unix:///tmp/r.sock?db=2&pass=***"
        );
        assert_eq!(
            redact("redis+cluster://:pw@a:1,b:2"),
            "redis+cluster://:***@a:1,b:2"
        );
    }
}
