//! A subscription to a line's wake-ups, on a connection of its own (it blocks).

use redis::cluster_async::ClusterConnection;

/// What a subscription delivers: a standalone server's messages, or a cluster's sharded ones
/// (kept alive by the connection held here).
pub enum Subscription {
    Standalone(redis::aio::PubSub),
    Cluster {
        /// Held so the subscription lives; its messages come through `pushes`.
        _connection: ClusterConnection,
        pushes: tokio::sync::broadcast::Receiver<redis::PushInfo>,
    },
}

impl Subscription {
    /// Resolves at the next message; None once the subscription is gone.
    pub async fn next(&mut self) -> Option<()> {
        use futures_util::StreamExt;
        match self {
            Subscription::Standalone(pubsub) => pubsub.on_message().next().await.map(drop),
            Subscription::Cluster { pushes, .. } => loop {
                match pushes.recv().await {
                    Ok(push) if push.kind == redis::PushKind::SMessage => return Some(()),
                    Ok(_) => {}
                    // Missed some: one wake-up stands for all of them.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => return Some(()),
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            },
        }
    }
}
