//! The credentials in store URLs: read percent-decoded, hidden in what operators see, and
//! refused where a URL would carry them unread.

use percent_encoding::percent_decode_str;

/// `user:password` (either may be empty) -> both percent-decoded; the first `:` separates them,
/// so an encoded `%3A` stays in the user name.
pub fn credentials(userinfo: &str) -> Result<(Option<String>, Option<String>), String> {
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let part = |part: &str, what: &str| match part {
        "" => Ok(None),
        _ => decoded(part)
            .map(Some)
            .map_err(|_| format!("the {what} is not UTF-8 once percent-decoded")),
    };
    Ok((part(user, "user name")?, part(password, "password")?))
}

pub fn decoded(text: &str) -> Result<String, std::str::Utf8Error> {
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
pub fn unread_password_parameter(url: &str) -> Option<&str> {
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
