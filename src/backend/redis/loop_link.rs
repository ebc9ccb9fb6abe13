//! A link's calls from an event loop's own thread (`crate::loop_io`, behind the switch): on
//! that loop's connection to a Redis over plain TCP or a Unix socket, opened with the URL's
//! handshake (its protocol, user and password, database); behind Sentinel, to the master the
//! sentinels name, asked for on the core's runtime and kept until a call finds it gone or
//! demoted. Every other URL (TLS, Cluster), and every call made on tokio (keep-alives, top-ups,
//! waiting, revocations, reaping), goes on the link's tokio connection. Deadlines and errors are
//! those of the tokio path.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::sentinel::SentinelClient;
use redis::{Cmd, ConnectionAddr, ConnectionInfo, FromRedisValue, RedisConnectionInfo, RedisError};

use super::link_errors::{is_missing_function, is_without_functions, unsent, LinkErrors};
use super::scripts::{Invocation, LIBRARY};
use crate::deadline::Deadlines;
use crate::errors::{CoreError, CoreResult};
use crate::loop_io::{self, Address, Endpoint, LoopTasks, Reply};
use crate::runtime;
use crate::sync::lock;

/// Where a link's calls go from an event loop's thread (one connection per link and loop).
pub enum LoopTarget {
    /// The URL's own server.
    Server(Arc<Endpoint>),
    /// The master that the sentinels name.
    Master {
        sentinels: Arc<tokio::sync::Mutex<SentinelClient>>,
        owner: u64,
        /// The master last named, until a call finds it gone or demoted.
        known: Arc<std::sync::Mutex<Option<Arc<Endpoint>>>>,
    },
}

impl LoopTarget {
    /// The target of `client` when the switch is on and its URL is plain TCP or a Unix socket;
    /// None otherwise (the link stays on tokio).
    pub fn of(client: &redis::Client) -> Option<Self> {
        if !loop_io::switched_on() {
            return None;
        }
        let endpoint = endpoint(loop_io::owner_id(), client.get_connection_info())?;
        Some(LoopTarget::Server(Arc::new(endpoint)))
    }

    /// The target of the master that `sentinels` name, when the switch is on.
    pub fn behind(sentinels: &Arc<tokio::sync::Mutex<SentinelClient>>) -> Option<Self> {
        loop_io::switched_on().then(|| LoopTarget::Master {
            sentinels: Arc::clone(sentinels),
            owner: loop_io::owner_id(),
            known: Arc::default(),
        })
    }

    /// The key of the link's connection, and of its batches, on each loop.
    pub fn owner(&self) -> u64 {
        match self {
            LoopTarget::Server(endpoint) => endpoint.owner,
            LoopTarget::Master { owner, .. } => *owner,
        }
    }

    /// Where the calls go now: behind Sentinel, the master last named, or the one the sentinels
    /// name now, asked on the core's runtime within `limit` (calls that find none meanwhile wait
    /// for that question and take its answer). True: not a master named before (the URL's own
    /// server, or one named just now).
    async fn endpoint(&self, limit: Duration) -> Result<(Arc<Endpoint>, bool), RedisError> {
        let (sentinels, owner, known) = match self {
            LoopTarget::Server(endpoint) => return Ok((Arc::clone(endpoint), true)),
            LoopTarget::Master {
                sentinels,
                owner,
                known,
            } => (sentinels, *owner, known),
        };
        if let Some(master) = lock(known).as_ref() {
            return Ok((Arc::clone(master), false));
        }
        let asked = ask_sentinels(Arc::clone(sentinels), Arc::clone(known), owner, limit);
        let master = runtime::handle().spawn(asked).await.unwrap_or_else(|e| {
            Err((
                redis::ErrorKind::Client,
                "asking the sentinels failed",
                e.to_string(),
            )
                .into())
        })?;
        Ok((master, true))
    }

    /// Behind Sentinel, the master is asked for again by the next call.
    pub fn forget_master(&self) {
        if let LoopTarget::Master { known, .. } = self {
            *lock(known) = None;
        }
    }

    /// One script call on `tasks`' connection to this target (opened if needed), within
    /// `deadlines`, its errors said by `errors` as on the tokio path. A server without the
    /// library's function gets it on this connection; one without functions answers None: the
    /// tokio path makes the call, and sends the scripts as scripts from then on.
    pub(super) async fn call<T: FromRedisValue>(
        &self,
        tasks: &LoopTasks,
        invocation: &Invocation,
        deadlines: &Deadlines,
        errors: &LinkErrors,
    ) -> CoreResult<Option<T>> {
        // Whether the call may have reached Redis (it may then have run there).
        let sending = AtomicBool::new(false);
        let call = async {
            // Nothing is sent on a connection that does not open.
            let limit = deadlines.limit();
            let (endpoint, named_now) = self.endpoint(limit).await.map_err(|e| unsent(errors.error(&e)))?;
            let opened = match tasks.connection(&endpoint, limit).await {
                // A master named before may be gone (a failover): the sentinels are asked again.
                Err(_) if !named_now => {
                    self.forget_master();
                    let (endpoint, _) = self.endpoint(limit).await.map_err(|e| unsent(errors.error(&e)))?;
                    tasks.connection(&endpoint, limit).await
                }
                opened => opened,
            };
            let connection = opened.map_err(|e| {
                self.forget_master();
                unsent(errors.error(&e.into()))
            })?;
            sending.store(true, Ordering::Relaxed);
            let replied = |reply: Result<Reply, _>| {
                reply
                    .unwrap_or_else(|_| Err((redis::ErrorKind::Client, loop_io::LOOP_CLOSED).into()))
                    .and_then(|value| value.extract_error())
            };
            let mut reply = replied(connection.call(&invocation.fcall()).await);
            if matches!(&reply, Err(e) if is_missing_function(e)) {
                // A server that lost the library (a restart without persistence) gets it on
                // this connection, then the call again, both in one write.
                let load = redis::cmd("FUNCTION")
                    .arg("LOAD")
                    .arg("REPLACE")
                    .arg(&LIBRARY.code)
                    .clone();
                let (loaded, again) = (connection.call(&load), connection.call(&invocation.fcall()));
                reply = replied(loaded.await).and(replied(again.await));
            }
            match reply {
                // Redis without functions, or a user not allowed them: the tokio path sends
                // the scripts as scripts.
                Err(e) if is_without_functions(&e) => Ok(None),
                // Not a failure of Redis (it does not open the breaker); the call may have run,
                // so an acquire gives back what it may have taken.
                Err(e) if e.kind() == redis::ErrorKind::Client => {
                    Err(CoreError::Backend(loop_io::LOOP_CLOSED.into()))
                }
                Err(e) => {
                    // Behind Sentinel a dead or demoted master means asking the sentinels again.
                    if e.is_io_error() || e.code() == Some("READONLY") {
                        self.forget_master();
                    }
                    Err(errors.error(&e))
                }
                Ok(value) => T::from_redis_value(value)
                    .map(Some)
                    .map_err(|e| errors.error(&e.into())),
            }
        };
        deadlines.within(call).await.unwrap_or_else(|| {
            self.forget_master();
            let timed_out = errors.timed_out();
            Err(if sending.load(Ordering::Relaxed) {
                timed_out
            } else {
                unsent(timed_out)
            })
        })
    }
}

/// The master that `sentinels` name now, within `limit`, kept in `known` for the calls after;
/// one question at a time: a call that waited for another's finds its answer there.
async fn ask_sentinels(
    sentinels: Arc<tokio::sync::Mutex<SentinelClient>>,
    known: Arc<std::sync::Mutex<Option<Arc<Endpoint>>>>,
    owner: u64,
    limit: Duration,
) -> Result<Arc<Endpoint>, RedisError> {
    let mut sentinels = sentinels.lock().await;
    if let Some(master) = lock(&known).as_ref() {
        return Ok(Arc::clone(master));
    }
    let Ok(client) = tokio::time::timeout(limit, sentinels.async_get_client()).await else {
        let why = format!("the sentinels did not name the master within {limit:?}");
        return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, why).into());
    };
    let master = endpoint(owner, client?.get_connection_info()).ok_or_else(|| {
        RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "the master is reached over TLS",
        ))
    })?;
    let master = Arc::new(master);
    *lock(&known) = Some(Arc::clone(&master));
    Ok(master)
}

/// The loop's endpoint of a server: its address when plain TCP or a Unix socket (None for
/// TLS), and the handshake of its settings.
fn endpoint(owner: u64, info: &ConnectionInfo) -> Option<Endpoint> {
    let address = match info.addr() {
        ConnectionAddr::Tcp(host, port) => Address::Tcp(format!(
            "{}:{port}",
            host.trim_start_matches('[').trim_end_matches(']')
        )),
        ConnectionAddr::Unix(path) => Address::Unix(path.clone()),
        _ => return None,
    };
    Some(Endpoint {
        owner,
        address,
        handshake: handshake(info.redis_settings()),
    })
}

/// What a connection sends before its first call, as redis-rs's own connections do: `HELLO 3`
/// for RESP3 (with the credentials), else `AUTH` when the URL has a password; `SELECT` for a
/// database other than 0.
fn handshake(settings: &RedisConnectionInfo) -> Vec<Cmd> {
    let mut commands = Vec::new();
    let credentials = settings
        .password()
        .map(|password| (settings.username().unwrap_or("default"), password));
    if settings.protocol().supports_resp3() {
        let mut hello = redis::cmd("HELLO");
        hello.arg(3);
        if let Some((user, password)) = credentials {
            hello.arg("AUTH").arg(user).arg(password);
        }
        commands.push(hello);
    } else if let Some((user, password)) = credentials {
        let mut auth = redis::cmd("AUTH");
        if settings.username().is_some() {
            auth.arg(user);
        }
        auth.arg(password);
        commands.push(auth);
    }
    if settings.db() != 0 {
        commands.push(redis::cmd("SELECT").arg(settings.db()).clone());
    }
    commands
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commands(url: &str) -> Vec<String> {
        let client = redis::Client::open(url).expect("a valid URL");
        handshake(client.get_connection_info().redis_settings())
            .iter()
            .map(|cmd| String::from_utf8_lossy(&cmd.get_packed_command()).replace("\r\n", " "))
            .collect()
    }

    #[test]
    fn a_connection_opens_with_the_urls_credentials_protocol_and_database() {
        assert!(commands("redis://127.0.0.1:6379/0").is_empty());
        assert_eq!(
            commands("redis://ann:pw@127.0.0.1:6379/4"),
            ["*3 $4 AUTH $3 ann $2 pw ", "*2 $6 SELECT $1 4 "]
        );
        assert_eq!(commands("redis://:pw@127.0.0.1:6379/0"), ["*2 $4 AUTH $2 pw "]);
        assert_eq!(
            commands("redis://:pw@127.0.0.1:6379/0?protocol=resp3"),
            ["*5 $5 HELLO $1 3 $4 AUTH $7 default $2 pw "]
        );
    }
}
