//! A subscription to one channel (a line's wake-ups, the revocations), on a connection of its
//! own (it blocks).

use redis::cluster_async::ClusterConnection;
use redis::{PushKind, Value};

/// How a channel is published on a cluster: sharded (SPUBLISH / SSUBSCRIBE on its slot's node),
/// or plain (PUBLISH reaches every node). A standalone server has plain channels only.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Sharding {
    OnCluster,
    Plain,
}

/// What a subscription delivers: a standalone server's messages, or a cluster's (kept alive by
/// the connection held here; every subscription of the cluster's subscriber client sees every
/// push, so each keeps those of its own channel).
pub enum Subscription {
    Standalone(redis::aio::PubSub),
    Cluster {
        /// Held so the subscription lives; its messages come through `pushes`.
        _connection: ClusterConnection,
        pushes: tokio::sync::broadcast::Receiver<redis::PushInfo>,
        channel: String,
        kind: PushKind,
    },
}

impl Subscription {
    /// Resolves at the next message with its payload (None: some were missed); None once the
    /// subscription is gone.
    pub async fn next(&mut self) -> Option<Option<String>> {
        use futures_util::StreamExt;
        match self {
            Subscription::Standalone(pubsub) => {
                let message = pubsub.on_message().next().await?;
                Some(message.get_payload::<String>().ok())
            }
            Subscription::Cluster {
                pushes,
                channel,
                kind,
                ..
            } => loop {
                match pushes.recv().await {
                    Ok(push) if push.kind == *kind => match push.data.as_slice() {
                        [Value::BulkString(on), payload, ..] if on.as_slice() == channel.as_bytes() => {
                            return Some(redis::from_redis_value(payload.clone()).ok());
                        }
                        _ => {}
                    },
                    Ok(_) => {}
                    // Missed some: one wake-up stands for all of them.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return Some(None),
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            },
        }
    }
}
