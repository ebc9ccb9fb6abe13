//! Redis URLs: parsed into an endpoint, and shown without their password.

use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::TlsCertificates;
use tokio::sync::Mutex;

use super::connection::{Endpoint, Link};
use crate::errors::{CoreError, CoreResult};

/// Parses `redis://`, `rediss://`, `unix://`, `redis+unix://`,
/// `redis[s]+cluster://[user:password@]host:port,host:port` and
/// `redis+sentinel://[user:password@]host:port,host:port/master_name[/db]`. `ca_pem` replaces the
/// system's trusted roots for TLS (a private CA). Nothing is connected yet.
pub fn open(url: &str, timeout: Duration, ca_pem: Option<Vec<u8>>) -> CoreResult<Link> {
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
    Ok(Link::new(endpoint, target, timeout))
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
