//! Redis URLs: parsed into an endpoint, and shown without their password.

use std::time::Duration;

use percent_encoding::percent_decode_str;
use redis::cluster::ClusterClient;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{IntoConnectionInfo, TlsCertificates};
use tokio::sync::Mutex;

use super::connection::{ClusterEndpoint, Endpoint, Link};
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

/// `[user:password@]host:port,host:port/service[/db][?query]` -> a client of the master
/// `service`. The user name and password (the master's and its replicas') are percent-decoded,
/// as in `redis://` URLs (`%40` for `@`, `%2F` for `/`, `%3A` for `:`, `%25` for `%`); the
/// sentinels are reached with `sentinel_username` and `sentinel_password` from the query (also
/// percent-decoded), or without credentials.
fn sentinel_client(rest: &str, target: &str) -> CoreResult<SentinelClient> {
    let bad = |why: String| {
        CoreError::InvalidInput(format!(
            "cannot use Sentinel URL {target:?}: {why}; use redis+sentinel://[user:password@]host:port,host:port/master_name[/db][?sentinel_username=u&sentinel_password=p]"
        ))
    };
    let (userinfo, rest) = rest.rsplit_once('@').map_or((None, rest), |(u, r)| (Some(u), r));
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut sentinel_auth = redis::RedisConnectionInfo::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = decoded(value).map_err(|_| bad(format!("{key} is not UTF-8 once percent-decoded")))?;
        sentinel_auth = match key {
            "sentinel_username" => sentinel_auth.set_username(value),
            "sentinel_password" => sentinel_auth.set_password(value),
            _ => return Err(bad(format!("unknown parameter {key:?}"))),
        };
    }
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
    let sentinels = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| {
            let node = format!("redis://{h}").into_connection_info();
            Ok(node
                .map_err(|e| bad(e.to_string()))?
                .set_redis_settings(sentinel_auth.clone()))
        })
        .collect::<CoreResult<Vec<_>>>()?;
    if sentinels.is_empty() {
        return Err(bad("no sentinel address".into()));
    }
    let mut master = redis::RedisConnectionInfo::default().set_db(db);
    let (user, password) = credentials(userinfo.unwrap_or_default()).map_err(bad)?;
    if let Some(user) = user {
        master = master.set_username(user);
    }
    if let Some(password) = password {
        master = master.set_password(password);
    }
    let node = SentinelNodeConnectionInfo::default().set_redis_connection_info(master);
    SentinelClient::build(sentinels, service, Some(node), SentinelServerType::Master)
        .map_err(|e| bad(e.to_string()))
}

/// `user:password` (either may be empty) -> both percent-decoded; the first `:` separates them,
/// so an encoded `%3A` stays in the user name.
fn credentials(userinfo: &str) -> Result<(Option<String>, Option<String>), String> {
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let part = |part: &str, what: &str| match part {
        "" => Ok(None),
        _ => decoded(part)
            .map(Some)
            .map_err(|_| format!("the {what} is not UTF-8 once percent-decoded")),
    };
    Ok((part(user, "user name")?, part(password, "password")?))
}

fn decoded(text: &str) -> Result<String, std::str::Utf8Error> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|text| text.into_owned())
}

/// Hides credentials, for messages and `backend`: everything between `://` and the last `@`
/// becomes `***`, or `user:***` when the user name is plain (it ends at the first `:` and holds
/// none of `/ ? # @ [ ]`). Passwords may hold `/ ? @ :` unencoded (then the URL does not parse,
/// and this is what the error shows), so the authority cannot end at the first `/`: the last
/// `@` ends it. Socket URLs (`unix://`, `redis+unix://`) have no authority: their `pass=` query
/// parameter is hidden instead. Text without `://` loses everything before its last `@`.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return match url.rsplit_once('@') {
            Some((_, host)) => format!("***@{host}"),
            None => url.to_owned(),
        };
    };
    if scheme.ends_with("unix") {
        return format!("{scheme}://{}", hide_pass_parameter(rest));
    }
    let Some((userinfo, after)) = rest.rsplit_once('@') else {
        return format!("{scheme}://{}", hide_pass_parameter(rest));
    };
    let shown = match userinfo.split_once(':') {
        Some((user, _)) if !user.contains(['/', '?', '#', '@', '[', ']']) => format!("{user}:***"),
        _ => "***".to_owned(),
    };
    format!("{scheme}://{shown}@{}", hide_pass_parameter(after))
}

/// `path?a=1&pass=secret` -> `path?a=1&pass=***`: every parameter whose name says it holds a
/// secret (`pass=` and `sentinel_password=`, which are read, and the `password=` or `token=` of
/// other clients' URLs, which are refused but shown in the refusal).
fn hide_pass_parameter(text: &str) -> String {
    let Some((path, query)) = text.split_once('?') else {
        return text.to_owned();
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if holds_a_secret(name) => format!("{name}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{path}?{}", query.join("&"))
}

fn holds_a_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "pwd", "secret", "token", "auth"]
        .iter()
        .any(|word| name.contains(word))
}

/// A password given as a query parameter that redis-rs does not read (`password=`, as other
/// clients' URLs have it): the connection would go without it, and fail as unauthenticated.
fn unread_password_parameter(url: &str) -> Option<&str> {
    let after_credentials = url.rsplit_once('@').map_or(url, |(_, after)| after);
    let (_, query) = after_credentials.split_once('?')?;
    query
        .split('&')
        .filter_map(|pair| pair.split_once('=').map(|(name, _)| name))
        .find(|name| holds_a_secret(name) && !["pass", "sentinel_password"].contains(name))
}

#[cfg(test)]
mod tests {
    use super::{credentials, redact, unread_password_parameter};

    #[test]
    fn sentinel_credentials_are_percent_decoded() {
        let pair = |user: &str, password: &str| Ok((Some(user.to_owned()), Some(password.to_owned())));
        assert_eq!(credentials("app:p%40ss%3Aw%2Frd%25"), pair("app", "p@ss:w/rd%"));
        assert_eq!(credentials("a%3Ab:pw"), pair("a:b", "pw"));
        assert_eq!(
            credentials("app:p:w"),
            pair("app", "p:w"),
            "only the first : separates"
        );
        assert_eq!(credentials(":pw"), Ok((None, Some("pw".to_owned()))));
        assert_eq!(credentials("app"), Ok((Some("app".to_owned()), None)));
        assert_eq!(credentials(""), Ok((None, None)));
        assert!(credentials(":%FF").unwrap_err().contains("password is not UTF-8"));
    }

    #[test]
    fn a_password_in_a_query_parameter_that_is_not_read_is_refused_and_hidden() {
        for url in [
            "redis://h:1/0?password=pw",
            "unix:///tmp/r.sock?db=2&password=pw",
            "redis+unix:///tmp/r.sock?passwd=pw",
            "rediss://u:p?w@h:1/0?token=pw",
        ] {
            assert!(unread_password_parameter(url).is_some(), "{url}");
            assert!(!redact(url).contains("=pw"), "{url}: {}", redact(url));
        }
        for url in [
            "unix:///tmp/r.sock?db=2&pass=pw",
            "redis+sentinel://a:1/m?sentinel_username=s&sentinel_password=pw",
            "redis://u:pa?ssword=x@h:1/0",
            "redis://h:1/0?protocol=resp3",
        ] {
            assert_eq!(unread_password_parameter(url), None, "{url}");
        }
    }

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
        assert_eq!(
            redact("redis+sentinel://a:1/m?sentinel_username=s&sentinel_password=pw"),
            "redis+sentinel://a:1/m?sentinel_username=s&sentinel_password=***"
        );
    }

    #[test]
    fn passwords_with_url_delimiters_are_hidden_up_to_the_last_at() {
        for (url, shown) in [
            ("redis://:pa/ss@h:1/0", "redis://:***@h:1/0"),
            ("redis://u:pa?ss@h:1/0", "redis://u:***@h:1/0"),
            ("redis://u:p@ss:w/o?r#d@h:1", "redis://u:***@h:1"),
            ("rediss://u:a//b@h:1/2", "rediss://u:***@h:1/2"),
            (
                "redis+sentinel://u:p/w@a:1,b:2/master/0",
                "redis+sentinel://u:***@a:1,b:2/master/0",
            ),
            ("rediss+cluster://:p?w@a:1,b:2", "rediss+cluster://:***@a:1,b:2"),
            ("http://u:p?w@h", "http://u:***@h"),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
    }

    #[test]
    fn ambiguous_user_names_are_hidden_too() {
        // No `:`: the one word may be a password (`redis://password@host` is a common slip).
        assert_eq!(redact("redis://secret@h:1"), "redis://***@h:1");
        // A user name cannot hold these unencoded: the split is a guess, so show nothing.
        assert_eq!(redact("redis://u/x:pw@h"), "redis://***@h");
        assert_eq!(redact("redis://u@x:pw@h"), "redis://***@h");
        // Percent-encoded names are shown as written.
        assert_eq!(redact("redis://app%40eu:p%2Fw@h"), "redis://app%40eu:***@h");
    }

    #[test]
    fn socket_urls_and_bare_addresses_keep_no_password() {
        assert_eq!(
            redact("redis+unix:///tmp/r@x.sock?pass=a?b&db=1"),
            "redis+unix:///tmp/r@x.sock?pass=***&db=1"
        );
        assert_eq!(redact("u:pw@localhost:6379"), "***@localhost:6379");
        assert_eq!(redact("localhost:6379"), "localhost:6379");
    }
}
