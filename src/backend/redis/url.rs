//! Redis URLs: parsed into an endpoint.

use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::TlsCertificates;
use tokio::sync::Mutex;

use super::connection::{ClusterEndpoint, Endpoint, Link};
use super::credentials::{redact, unread_password_parameter};
use super::sentinel_url::sentinel_client;
use crate::errors::{CoreError, CoreResult};

/// Wake-ups a cluster's subscriber keeps for a listener that lags (more are counted as one).
const PUSHES_BUFFERED: usize = 64;

/// Parses `redis://`, `rediss://`, `unix://`, `redis+unix://`,
/// `redis[s]+cluster://[user:password@]host:port,host:port` and
/// `redis+sentinel://[user:password@]host:port,host:port/master_name[/db][?sentinel_username=u&sentinel_password=p]`.
/// `ca_pem` replaces the
/// system's trusted roots for TLS (a private CA). Nothing is connected yet.
pub fn open(url: &str, timeout: Duration, ca_pem: Option<Vec<u8>>) -> CoreResult<Link> {
    // rustls needs one crypto provider per process; a second install is a harmless no-op.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let target = redact(url);
    let bad_url =
        |e: redis::RedisError| CoreError::InvalidInput(format!("cannot use Redis URL {target:?}: {e}"));
    if let Some(name) = unread_password_parameter(url) {
        return Err(CoreError::InvalidInput(format!(
            "cannot use Redis URL {target:?}: its `{name}=` query parameter is not read, so the \
             connection would go without a password. Put the password in the URL, percent-encoded: \
             redis://:PASSWORD@host:port/0 (or redis://USER:PASSWORD@...), or for a Unix socket \
             unix:///path/to/redis.sock?pass=PASSWORD"
        )));
    }
    let certificates = ca_pem.map(|pem| TlsCertificates {
        client_tls: None,
        root_cert: Some(pem),
    });
    let cluster = url
        .strip_prefix("redis+cluster://")
        .map(|rest| ("redis", rest))
        .or_else(|| url.strip_prefix("rediss+cluster://").map(|rest| ("rediss", rest)));
    let endpoint = if url.starts_with("redis+sentinel://") {
        Endpoint::Sentinel(Box::new(Mutex::new(sentinel_client(url)?)))
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
        let builder = || {
            let builder = ClusterClient::builder(nodes.clone())
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .retries(1);
            match certificates.clone() {
                Some(certificates) => builder.certs(certificates),
                None => builder,
            }
        };
        // Sharded subscriptions need RESP3; their messages come through the push sender.
        let (pushes, _) = tokio::sync::broadcast::channel(PUSHES_BUFFERED);
        let subscriber = builder()
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(pushes.clone())
            .build()
            .map_err(bad_url)?;
        Endpoint::Cluster(Box::new(ClusterEndpoint {
            client: builder().build().map_err(bad_url)?,
            subscriber,
            pushes,
        }))
    } else {
        let client = match certificates {
            Some(certificates) => redis::Client::build_with_tls(url, certificates),
            None => redis::Client::open(url),
        };
        Endpoint::Standalone(Box::new(client.map_err(bad_url)?))
    };
    Ok(Link::new(endpoint, target, timeout))
}
