//! One multiplexed connection to Redis (standalone, cluster or behind Sentinel), opened lazily
//! (the manager is built at import time, outside any event loop). Every call, the connect
//! included, is bounded by `redis_timeout`, and its errors are said for the user
//! (`link_errors.rs`).

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::SentinelClient;
use redis::{Cmd, FromRedisValue, Pipeline, PushKind, RedisFuture, RedisResult, Value};
use tokio::sync::Mutex;

use super::link_errors::{is_missing_function, is_without_functions, unsent, LinkErrors};
use super::scripts::{Invocation, LIBRARY};
use super::subscription::{Sharding, Subscription};
use crate::backend::CallStats;
use crate::deadline::Deadlines;
use crate::errors::CoreResult;

pub enum Endpoint {
    Standalone(Box<redis::Client>),
    Cluster(Box<ClusterEndpoint>),
    /// The sentinels and the name of the master they watch.
    Sentinel(Box<Mutex<SentinelClient>>),
}

/// A Redis Cluster: the client of the scripts, and a RESP3 client for sharded subscriptions,
/// whose messages arrive on `pushes`.
pub struct ClusterEndpoint {
    pub client: ClusterClient,
    pub subscriber: ClusterClient,
    pub pushes: tokio::sync::broadcast::Sender<redis::PushInfo>,
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

pub struct Link {
    endpoint: Endpoint,
    /// Opened on first use; behind Sentinel, dropped when the master fails so the next call
    /// asks the sentinels for the new one.
    connection: Mutex<Option<Connection>>,
    /// What its failures say, naming its Redis by the URL without the password.
    pub errors: LinkErrors,
    /// Bounds every call, the connect included, by `redis_timeout`.
    deadlines: Deadlines,
    /// Set once the server turned out to have no functions (Redis 6) or to refuse them to this
    /// user: the scripts then go as scripts of their own (EVALSHA).
    scripts_only: AtomicBool,
    /// Script calls made, those that failed, and the time they took.
    calls: AtomicU64,
    failed: AtomicU64,
    micros: AtomicU64,
}

impl Link {
    pub fn new(endpoint: Endpoint, target: String, timeout: Duration) -> Self {
        Link {
            endpoint,
            connection: Mutex::new(None),
            errors: LinkErrors::new(target, timeout),
            deadlines: Deadlines::new(timeout),
            scripts_only: AtomicBool::new(false),
            calls: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            micros: AtomicU64::new(0),
        }
    }

    /// The script calls made so far: how many, how many failed, and the time they took.
    pub fn call_stats(&self) -> CallStats {
        CallStats {
            calls: self.calls.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            micros: self.micros.load(Ordering::Relaxed),
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.endpoint, Endpoint::Cluster(_))
    }

    /// The shared connection, opened on first use (retried on the next call if that failed).
    async fn connection(&self) -> CoreResult<Connection> {
        let mut slot = self.connection.lock().await;
        if let Some(connection) = slot.as_ref() {
            return Ok(connection.clone());
        }
        let opened = match &self.endpoint {
            Endpoint::Standalone(client) => self.manage(client.as_ref().clone()).await,
            Endpoint::Cluster(cluster) => cluster
                .client
                .get_async_connection()
                .await
                .map(Connection::Cluster),
            Endpoint::Sentinel(sentinel) => {
                let master = sentinel.lock().await.async_get_client().await;
                match master {
                    Ok(master) => self.manage(master).await,
                    Err(e) => Err(e),
                }
            }
        }
        // Nothing was sent on a connection that did not open.
        .map_err(|e| unsent(self.errors.error(&e)))?;
        *slot = Some(opened.clone());
        Ok(opened)
    }

    /// A multiplexed connection that reconnects by itself. Calls are bounded by `deadlines`,
    /// not by a response timeout of redis-rs (that would add a timer per call, and end a call
    /// the way ours does, without a reconnect).
    async fn manage(&self, client: redis::Client) -> redis::RedisResult<Connection> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.deadlines.limit()))
            .set_response_timeout(None)
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        ConnectionManager::new_with_config(client, config)
            .await
            .map(Connection::Standalone)
    }

    /// Runs one script call, connecting first if needed; the whole of it is bounded by
    /// `redis_timeout`.
    pub async fn run<T: FromRedisValue>(&self, invocation: &Invocation) -> CoreResult<T> {
        let started = Instant::now();
        let outcome = self.run_bounded(invocation).await;
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.failed
            .fetch_add(u64::from(outcome.is_err()), Ordering::Relaxed);
        self.micros
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        outcome
    }

    async fn run_bounded<T: FromRedisValue>(&self, invocation: &Invocation) -> CoreResult<T> {
        // Whether the call may have reached Redis (it may then have run there).
        let sending = AtomicBool::new(false);
        let call = async {
            let mut connection = self.connection().await?;
            sending.store(true, Ordering::Relaxed);
            let mut outcome = self.invoke(&mut connection, invocation).await;
            // A managed connection answers with the outcome of its last reconnect, which may
            // have been tried while the server was still down; that refusal starts a fresh
            // reconnect and nothing was sent, so the call goes once more, on the fresh one.
            // Without this, the first probe after a restart fails and the breaker stays open
            // for another, doubled, cool-down.
            if matches!(&outcome, Err(e) if e.is_connection_refusal()) {
                outcome = self.invoke(&mut connection, invocation).await;
            }
            outcome.map_err(|e| {
                // Behind Sentinel a dead or demoted master means asking the sentinels again.
                if e.is_io_error() || e.is_timeout() || e.code() == Some("READONLY") {
                    self.forget_master();
                }
                self.errors.error(&e)
            })
        };
        let outcome = self.deadlines.within(call).await;
        if outcome.is_none() {
            self.forget_master();
        }
        outcome.ok_or_else(|| {
            let timed_out = self.errors.timed_out();
            if sending.load(Ordering::Relaxed) {
                timed_out
            } else {
                unsent(timed_out)
            }
        })?
    }

    /// FCALL of the script's function, loading the library first when the server does not have
    /// it (a new server, FUNCTION FLUSH, a restart without persistence); EVALSHA where the server
    /// has no functions or will not let this user load them.
    async fn invoke<T: FromRedisValue>(
        &self,
        connection: &mut Connection,
        invocation: &Invocation,
    ) -> RedisResult<T> {
        if !self.scripts_only.load(Ordering::Relaxed) {
            match invocation.fcall().query_async(connection).await {
                Err(e) if is_missing_function(&e) => {
                    let loaded = redis::cmd("FUNCTION")
                        .arg("LOAD")
                        .arg("REPLACE")
                        .arg(&LIBRARY.code)
                        .query_async::<Value>(connection)
                        .await;
                    match loaded {
                        Ok(_) => return invocation.fcall().query_async(connection).await,
                        Err(e) if !is_without_functions(&e) => return Err(e),
                        Err(_) => self.scripts_only.store(true, Ordering::Relaxed),
                    }
                }
                Err(e) if is_without_functions(&e) => self.scripts_only.store(true, Ordering::Relaxed),
                done => return done,
            }
        }
        invocation.script().invoke_async(connection).await
    }

    fn forget_master(&self) {
        if matches!(self.endpoint, Endpoint::Sentinel(_)) {
            if let Ok(mut slot) = self.connection.try_lock() {
                *slot = None;
            }
        }
    }

    /// A connection of its own for a subscription (it blocks), bounded by `redis_timeout`: a
    /// plain one, or on a cluster a sharded one (SSUBSCRIBE, on the node of the channel's slot)
    /// unless the channel is `Sharding::Plain`.
    pub async fn subscribe(&self, channel: &str, sharding: Sharding) -> CoreResult<Subscription> {
        let client = match &self.endpoint {
            Endpoint::Standalone(client) => client.as_ref().clone(),
            Endpoint::Sentinel(sentinel) => sentinel
                .lock()
                .await
                .async_get_client()
                .await
                .map_err(|e| self.errors.error(&e))?,
            Endpoint::Cluster(cluster) => {
                let pushes = cluster.pushes.subscribe();
                let subscribe = async {
                    let mut connection = cluster.subscriber.get_async_connection().await?;
                    let kind = match sharding {
                        Sharding::OnCluster => {
                            connection.ssubscribe(channel).await?;
                            PushKind::SMessage
                        }
                        Sharding::Plain => {
                            connection.subscribe(channel).await?;
                            PushKind::Message
                        }
                    };
                    Ok::<_, redis::RedisError>(Subscription::Cluster {
                        _connection: connection,
                        pushes,
                        channel: channel.to_owned(),
                        kind,
                    })
                };
                return self.bounded(subscribe).await;
            }
        };
        let subscribe = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(channel).await?;
            Ok::<_, redis::RedisError>(Subscription::Standalone(pubsub))
        };
        self.bounded(subscribe).await
    }

    /// `call` within `redis_timeout`, its errors said for the user.
    async fn bounded<T>(&self, call: impl Future<Output = redis::RedisResult<T>>) -> CoreResult<T> {
        self.deadlines
            .within(call)
            .await
            .ok_or_else(|| self.errors.timed_out())?
            .map_err(|e| self.errors.error(&e))
    }
}
