//! `redis+sentinel://` URLs: read into their parts (what the core connects with, and what the
//! command line connects with too), and the client of the master they name.

use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{ConnectionAddr, IntoConnectionInfo};

use super::credentials::{credentials, decoded, redact};
use crate::errors::{CoreError, CoreResult};

/// A `redis+sentinel://` URL read (its credentials percent-decoded): what the core connects
/// with, and what the command line connects with too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelUrl {
    /// The sentinels' addresses, host and port.
    pub sentinels: Vec<(String, u16)>,
    /// The name of the master the sentinels watch.
    pub master: String,
    pub db: i64,
    /// The master's (and its replicas') user name and password.
    pub user: Option<String>,
    pub password: Option<String>,
    /// The sentinels' own, from `sentinel_username` and `sentinel_password` in the query.
    pub sentinel_user: Option<String>,
    pub sentinel_password: Option<String>,
}

/// Reads `redis+sentinel://[user:password@]host:port,host:port/service[/db][?query]`. The user
/// name and password are percent-decoded, as in `redis://` URLs (`%40` for `@`, `%2F` for `/`,
/// `%3A` for `:`, `%25` for `%`); so are `sentinel_username` and `sentinel_password`, the only
/// query parameters.
pub fn parse_sentinel(url: &str) -> CoreResult<SentinelUrl> {
    let target = redact(url);
    let bad = |why: String| {
        CoreError::InvalidInput(format!(
            "cannot use Sentinel URL {target:?}: {why}; use redis+sentinel://[user:password@]host:port,host:port/master_name[/db][?sentinel_username=u&sentinel_password=p]"
        ))
    };
    let rest = url
        .strip_prefix("redis+sentinel://")
        .ok_or_else(|| bad("it does not start with redis+sentinel://".into()))?;
    let (userinfo, rest) = rest.rsplit_once('@').map_or((None, rest), |(u, r)| (Some(u), r));
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (mut sentinel_user, mut sentinel_password) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = decoded(value).map_err(|_| bad(format!("{key} is not UTF-8 once percent-decoded")))?;
        match key {
            "sentinel_username" => sentinel_user = Some(value),
            "sentinel_password" => sentinel_password = Some(value),
            _ => return Err(bad(format!("unknown parameter {key:?}"))),
        };
    }
    let mut parts = rest.split('/');
    let hosts = parts.next().unwrap_or_default();
    let master = parts
        .next()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad("no master name".into()))?
        .to_owned();
    let db: i64 = match parts.next().filter(|s| !s.is_empty()) {
        Some(db) => db.parse().map_err(|_| bad(format!("bad db {db:?}")))?,
        None => 0,
    };
    let sentinels = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| match format!("redis://{h}").into_connection_info() {
            Ok(info) => match info.addr() {
                ConnectionAddr::Tcp(host, port) => Ok((host.clone(), *port)),
                _ => Err(bad(format!("sentinel address {h:?} is not host:port"))),
            },
            Err(e) => Err(bad(e.to_string())),
        })
        .collect::<CoreResult<Vec<_>>>()?;
    if sentinels.is_empty() {
        return Err(bad("no sentinel address".into()));
    }
    let (user, password) = credentials(userinfo.unwrap_or_default()).map_err(bad)?;
    Ok(SentinelUrl {
        sentinels,
        master,
        db,
        user,
        password,
        sentinel_user,
        sentinel_password,
    })
}

/// A client of the master a sentinel URL names.
pub fn sentinel_client(url: &str) -> CoreResult<SentinelClient> {
    let parsed = parse_sentinel(url)?;
    let mut sentinel_auth = redis::RedisConnectionInfo::default();
    if let Some(user) = parsed.sentinel_user {
        sentinel_auth = sentinel_auth.set_username(user);
    }
    if let Some(password) = parsed.sentinel_password {
        sentinel_auth = sentinel_auth.set_password(password);
    }
    let sentinels = parsed
        .sentinels
        .into_iter()
        .map(|(host, port)| {
            ConnectionAddr::Tcp(host, port)
                .into_connection_info()
                .map(|node| node.set_redis_settings(sentinel_auth.clone()))
        })
        .collect::<Result<Vec<_>, _>>();
    let mut master = redis::RedisConnectionInfo::default().set_db(parsed.db);
    if let Some(user) = parsed.user {
        master = master.set_username(user);
    }
    if let Some(password) = parsed.password {
        master = master.set_password(password);
    }
    let node = SentinelNodeConnectionInfo::default().set_redis_connection_info(master);
    sentinels
        .and_then(|sentinels| {
            SentinelClient::build(sentinels, parsed.master, Some(node), SentinelServerType::Master)
        })
        .map_err(|e| CoreError::InvalidInput(format!("cannot use Sentinel URL {:?}: {e}", redact(url))))
}

#[cfg(test)]
mod tests {
    use super::{parse_sentinel, SentinelUrl};

    #[test]
    fn a_sentinel_url_is_read_into_its_parts() {
        let parsed =
            parse_sentinel("redis+sentinel://app:p%40ss@a:1,b:26379/mymaster/2?sentinel_password=s%2Fp")
                .unwrap();
        assert_eq!(
            parsed,
            SentinelUrl {
                sentinels: vec![("a".into(), 1), ("b".into(), 26379)],
                master: "mymaster".into(),
                db: 2,
                user: Some("app".into()),
                password: Some("p@ss".into()),
                sentinel_user: None,
                sentinel_password: Some("s/p".into()),
            }
        );
        for (url, why) in [
            ("redis+sentinel://a:1", "no master name"),
            ("redis+sentinel://a:1/m/x", "bad db"),
            ("redis+sentinel:///m", "no sentinel address"),
            ("redis+sentinel://a:1/m?password=pw", "unknown parameter"),
            ("rediss+sentinel://a:1/m", "does not start with redis+sentinel://"),
        ] {
            let error = parse_sentinel(url).unwrap_err().to_string();
            assert!(error.contains(why) && !error.contains("=pw"), "{url}: {error}");
        }
    }
}
