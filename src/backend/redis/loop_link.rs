//! A link's calls from an event loop's own thread (`crate::loop_io`, behind the switch): on
//! that loop's connection to a Redis over plain TCP or a Unix socket, opened with the URL's
//! handshake (its protocol, user and password, database). Every other URL (TLS, Sentinel,
//! Cluster), and every call made on tokio (keep-alives, top-ups, waiting, revocations, reaping),
//! goes on the link's tokio connection. Deadlines and errors are those of the tokio path.

use std::sync::atomic::{AtomicBool, Ordering};

use redis::{Cmd, ConnectionAddr, FromRedisValue, RedisConnectionInfo};

use super::link_errors::{is_missing_function, is_without_functions, unsent, LinkErrors};
use super::scripts::{Invocation, LIBRARY};
use crate::deadline::Deadlines;
use crate::errors::{CoreError, CoreResult};
use crate::loop_io::{self, Address, Endpoint, LoopTasks, Reply};

/// Where a link's calls go from an event loop's thread: its Redis, what a new connection sends
/// first, and the key of its connection there (one per link and loop).
pub struct LoopTarget {
    pub endpoint: Endpoint,
}

impl LoopTarget {
    /// The target of `client` when the switch is on and its URL is plain TCP or a Unix socket;
    /// None otherwise (the link stays on tokio).
    pub fn of(client: &redis::Client) -> Option<Self> {
        if !loop_io::switched_on() {
            return None;
        }
        let info = client.get_connection_info();
        let address = match info.addr() {
            ConnectionAddr::Tcp(host, port) => Address::Tcp(format!(
                "{}:{port}",
                host.trim_start_matches('[').trim_end_matches(']')
            )),
            ConnectionAddr::Unix(path) => Address::Unix(path.clone()),
            _ => return None,
        };
        Some(LoopTarget {
            endpoint: Endpoint {
                owner: loop_io::owner_id(),
                address,
                handshake: handshake(info.redis_settings()),
            },
        })
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
            let connection = tasks
                .connection(&self.endpoint, deadlines.limit())
                .await
                // Nothing was sent on a connection that did not open.
                .map_err(|e| unsent(errors.error(&e.into())))?;
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
                Err(e) => Err(errors.error(&e)),
                Ok(value) => T::from_redis_value(value)
                    .map(Some)
                    .map_err(|e| errors.error(&e.into())),
            }
        };
        deadlines.within(call).await.unwrap_or_else(|| {
            let timed_out = errors.timed_out();
            Err(if sending.load(Ordering::Relaxed) {
                timed_out
            } else {
                unsent(timed_out)
            })
        })
    }
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
