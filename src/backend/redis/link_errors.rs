//! What a link's failures say: redis-rs errors mapped to what the user can act on, naming the
//! link's Redis and its `redis_timeout`; and the answers of a server that has not got the
//! library's function, or no functions at all, which send a script call another way
//! (`connection.rs`).

use std::time::Duration;

use redis::RedisError;

use crate::errors::CoreError;

pub struct LinkErrors {
    /// The URL without its password.
    target: String,
    /// How long a call may take (`redis_timeout`).
    limit: Duration,
}

impl LinkErrors {
    pub(super) fn new(target: String, limit: Duration) -> Self {
        LinkErrors { target, limit }
    }

    /// The Redis the errors name: its URL without the password.
    pub(super) fn target(&self) -> &str {
        &self.target
    }

    /// A call that got no answer within `redis_timeout`.
    pub(super) fn timed_out(&self) -> CoreError {
        CoreError::Unavailable(format!(
            "Redis at {} did not answer within {:.3} s; check that it is running and reachable, or raise LeaseConfig(redis_timeout=...)",
            self.target,
            self.limit.as_secs_f64()
        ))
    }

    /// An error a script caught and answered as text (one request's of a batch), mapped as if
    /// Redis had answered it for a call of its own.
    pub fn error_text(&self, message: &str) -> CoreError {
        match redis::parse_redis_value(format!("-{message}\r\n").as_bytes()) {
            Ok(redis::Value::ServerError(error)) => self.error(&error.into()),
            _ => CoreError::Backend(format!("Redis answered with an error: {message}")),
        }
    }

    /// Maps a redis-rs error to what the user can act on.
    pub fn error(&self, err: &RedisError) -> CoreError {
        let target = &self.target;
        if err.is_timeout() {
            return CoreError::Unavailable(format!(
                "Redis at {target} did not answer in time ({err}); check that it is running and not overloaded, or raise LeaseConfig(redis_timeout=...)"
            ));
        }
        if matches!(
            err.kind(),
            redis::ErrorKind::MasterNameNotFoundBySentinel | redis::ErrorKind::NoValidReplicasFoundBySentinel
        ) {
            return CoreError::Unavailable(format!(
                "the sentinels of {target} name no reachable master ({err}); a failover may be under way"
            ));
        }
        // A cluster whose shard is down (MOVED back to it once redirects run out, CLUSTERDOWN),
        // a master loading its data or cut from its own: answers, but about availability.
        if err.is_cluster_error()
            || matches!(
                err.kind(),
                redis::ErrorKind::ClusterConnectionNotFound
                    | redis::ErrorKind::Server(
                        redis::ServerErrorKind::MasterDown | redis::ServerErrorKind::BusyLoading
                    )
            )
        {
            return CoreError::Unavailable(format!(
                "Redis at {target} cannot serve the call now ({err}); a node may be down, loading its data or failing over"
            ));
        }
        if err.is_io_error() || err.is_connection_refusal() || err.is_connection_dropped() {
            let message = format!(
                "cannot reach Redis at {target} ({err}); check the URL and that the server is running"
            );
            return if err.is_connection_refusal() {
                CoreError::Unreached(message)
            } else {
                CoreError::Unavailable(message)
            };
        }
        // A failed AUTH during the handshake has a kind but no server code.
        let code = match err.kind() {
            redis::ErrorKind::AuthenticationFailed => Some("NOAUTH"),
            _ => err.code(),
        };
        let hint = match code {
            Some("NOAUTH") | Some("WRONGPASS") => {
                "; put the right user and password in the URL (redis://user:password@host:port)"
            }
            Some("WRONGTYPE") => {
                "; another program uses keys under this key_prefix: choose another LeaseConfig(key_prefix=...)"
            }
            Some("READONLY") => "; the URL points at a replica: point it at the master",
            Some("CROSSSLOT") => "; this is a bug in fastapi_stream_lease's key layout, please report it",
            _ => "",
        };
        CoreError::Backend(format!("Redis at {target} answered with an error: {err}{hint}"))
    }
}

/// The error of a call that sent nothing (its connection did not open, or its time ran out
/// before it was sent): it did not run, so Redis unavailable is Redis unreached.
pub(super) fn unsent(error: CoreError) -> CoreError {
    match error {
        CoreError::Unavailable(message) => CoreError::Unreached(message),
        error => error,
    }
}

/// The server has not got the library's function (it never had, or lost it).
pub(super) fn is_missing_function(e: &RedisError) -> bool {
    e.detail()
        .is_some_and(|detail| detail.contains("Function not found"))
}

/// The server has no functions (Redis 6: unknown command) or this user may not use them.
pub(super) fn is_without_functions(e: &RedisError) -> bool {
    e.code() == Some("NOPERM")
        || e.detail()
            .is_some_and(|d| d.contains("unknown command") || d.contains("unknown subcommand"))
}
