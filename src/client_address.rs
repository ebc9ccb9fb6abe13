//! The client's address behind reverse proxies. Only the header the operator's proxies write is
//! read, and only when the peer is one of those proxies: every other header is the client's
//! own text. List headers are walked from the right (the hop nearest to us) past each trusted
//! proxy; the first address that is not one is the client.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// What the operator's proxies write the client's address into.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ProxyHeader {
    /// `X-Forwarded-For: client, proxy1`: each proxy appends its peer (nginx, AWS ALB, HAProxy).
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1`: each proxy appends an element.
    Forwarded,
    /// One address that the proxy sets, replacing the client's copy (`X-Real-IP`,
    /// `CF-Connecting-IP`).
    Single,
}

/// An address or CIDR network such as `10.0.0.0/8` or `fd00::/8`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Network {
    address: IpAddr,
    prefix: u32,
}

impl Network {
    fn parse(text: &str) -> Option<Network> {
        let (address, prefix) = text.split_once('/').map_or((text, None), |(a, p)| (a, Some(p)));
        let address: IpAddr = address.parse().ok()?;
        let bits = if address.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => p.parse().ok()?,
            Some(_) => return None,
        };
        (prefix <= bits).then_some(Network { address, prefix })
    }

    /// The IPv4 form of a network of IPv4-mapped IPv6 addresses (`::ffff:10.0.0.0/104` is
    /// `10.0.0.0/8`): such a network never matches, since peers and forwarded addresses are
    /// compared in their IPv4 form.
    fn ipv4_form(&self) -> Option<String> {
        let IpAddr::V6(address) = self.address else {
            return None;
        };
        let ipv4 = address.to_ipv4_mapped().filter(|_| self.prefix >= 96)?;
        Some(match self.prefix {
            128 => ipv4.to_string(),
            prefix => format!("{ipv4}/{}", prefix - 96),
        })
    }

    fn contains(&self, address: IpAddr) -> bool {
        match (self.address, address) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - self.prefix).unwrap_or(0);
                u32::from(net) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - self.prefix).unwrap_or(0);
                u128::from(net) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// A setting that cannot be used, with how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyRuleError {
    /// A trusted proxy that is not an address or a CIDR network.
    Network(String),
    /// A trusted proxy written as IPv4-mapped IPv6 (the entry, its IPv4 form): it would never
    /// match.
    Mapped(String, String),
    /// A header name that is empty or not an HTTP token.
    Header(String),
}

impl fmt::Display for ProxyRuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProxyRuleError::Network(entry) => write!(
                f,
                "trusted proxy '{}' is not a network: use an address or CIDR such as '10.0.0.0/8', '192.168.1.7' or 'fd00::/8'",
                entry.escape_debug()
            ),
            ProxyRuleError::Mapped(entry, ipv4) => write!(
                f,
                "trusted proxy '{}' is written as IPv4-mapped IPv6 and would never match: client and proxy addresses are compared in their IPv4 form; write it as '{ipv4}'",
                entry.escape_debug()
            ),
            ProxyRuleError::Header(name) => write!(
                f,
                "proxy_header '{}' is not a header name: name the header your trusted proxies write the client's address into, such as 'X-Forwarded-For' (the default), 'Forwarded', 'X-Real-IP' or 'CF-Connecting-IP'",
                name.escape_debug()
            ),
        }
    }
}

/// Which peers are proxies and which header they write: how a connection's client is found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyRule {
    proxies: Vec<String>,
    networks: Vec<Network>,
    header_name: String,
    header: ProxyHeader,
}

pub const DEFAULT_PROXY_HEADER: &str = "X-Forwarded-For";

impl Default for ProxyRule {
    /// No trusted proxies: the peer is the client.
    fn default() -> Self {
        ProxyRule::new(Vec::new(), DEFAULT_PROXY_HEADER).expect("the default header is valid")
    }
}

impl ProxyRule {
    pub fn new(proxies: Vec<String>, header_name: &str) -> Result<Self, ProxyRuleError> {
        let networks = proxies
            .iter()
            .map(|entry| match Network::parse(entry) {
                None => Err(ProxyRuleError::Network(entry.clone())),
                Some(network) => match network.ipv4_form() {
                    Some(ipv4) => Err(ProxyRuleError::Mapped(entry.clone(), ipv4)),
                    None => Ok(network),
                },
            })
            .collect::<Result<_, _>>()?;
        if !is_token(header_name) {
            return Err(ProxyRuleError::Header(header_name.to_owned()));
        }
        let header = match header_name.to_ascii_lowercase().as_str() {
            "x-forwarded-for" => ProxyHeader::XForwardedFor,
            "forwarded" => ProxyHeader::Forwarded,
            _ => ProxyHeader::Single,
        };
        Ok(ProxyRule {
            proxies,
            networks,
            header_name: header_name.to_owned(),
            header,
        })
    }

    /// The trusted proxies, as given.
    pub fn proxies(&self) -> &[String] {
        &self.proxies
    }

    /// The header's name, as given.
    pub fn header_name(&self) -> &str {
        &self.header_name
    }

    /// The address of the client of a connection from `peer` (None: no peer, as in a test
    /// client) that carries `lines`, the lines of the proxy header in the order received.
    /// Headers from a peer that is not a trusted proxy are not read; without the header, the
    /// peer is the client; a malformed entry stops the walk at the last address before it.
    pub fn client(&self, peer: Option<&str>, lines: &[&str]) -> String {
        let Some(peer) = peer else {
            return "unknown".into();
        };
        let Some(mut address) = ip(peer) else {
            return peer.to_owned(); // not an IP address (a Unix socket's peer, say): no proxies
        };
        if !self.trusts(address) {
            return address.to_string();
        }
        match self.header {
            // The nearest proxy's line is the last (a second line is a client's copy that the
            // proxy added to rather than replaced); a list is not one address.
            ProxyHeader::Single => {
                if let Some(client) = lines.last().and_then(|line| node(line.trim())) {
                    address = client;
                }
            }
            ProxyHeader::XForwardedFor | ProxyHeader::Forwarded => {
                // Split at every comma, quoted or not: an unbalanced quote that a client wrote
                // on the left must not swallow the hops the proxies appended on its right (no
                // address has a comma, so a quoted one only makes a malformed hop).
                let joined = lines.join(",");
                let mut hops = joined.split(',').map(str::trim).filter(|hop| !hop.is_empty());
                while self.trusts(address) {
                    let Some(hop) = hops.next_back() else { break };
                    let next = match self.header {
                        ProxyHeader::Forwarded => forwarded_for(hop),
                        _ => node(hop),
                    };
                    match next {
                        Some(next) => address = next,
                        None => break,
                    }
                }
            }
        }
        address.to_string()
    }

    fn trusts(&self, address: IpAddr) -> bool {
        self.networks.iter().any(|network| network.contains(address))
    }
}

/// RFC 9110's token: the characters a header name may have.
fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// An address, IPv4-mapped IPv6 (`::ffff:192.0.2.1`) as the IPv4 address it is.
fn ip(text: &str) -> Option<IpAddr> {
    text.parse::<IpAddr>().ok().map(|a| a.to_canonical())
}

/// A node: an address, with or without a port (`192.0.2.43:47011`, `[2001:db8::1]:4711`,
/// `[2001:db8::1]`); obfuscated or `unknown` nodes are not addresses.
fn node(text: &str) -> Option<IpAddr> {
    if let Some(address) = ip(text) {
        return Some(address);
    }
    if let Some(bracketed) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        return bracketed
            .parse::<std::net::Ipv6Addr>()
            .ok()
            .map(|a| IpAddr::V6(a).to_canonical());
    }
    text.parse::<SocketAddr>().ok().map(|a| a.ip().to_canonical())
}

/// The `for` node of one RFC 7239 element (`for=192.0.2.60;proto=http`,
/// `for="[2001:db8:cafe::17]:4711"`); an element without exactly one names no address.
fn forwarded_for(element: &str) -> Option<IpAddr> {
    let mut nodes = pairs(element).into_iter().filter_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        name.trim().eq_ignore_ascii_case("for").then_some(value.trim())
    });
    let (Some(value), None) = (nodes.next(), nodes.next()) else {
        return None;
    };
    match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(quoted) => node(&unescape(quoted)),
        None => node(value),
    }
}

/// An element's `name=value` pairs: split at each `;` outside a quoted string (a quoted value,
/// such as a `host` the proxy copied from the request, may hold one).
fn pairs(element: &str) -> Vec<&str> {
    let (mut parts, mut start, mut quoted, mut escaped) = (Vec::new(), 0, false, false);
    for (at, c) in element.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ';' if !quoted => {
                parts.push(&element[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    parts.push(&element[start..]);
    parts
}

/// A quoted string's content, its `\x` escapes resolved.
fn unescape(quoted: &str) -> String {
    let mut text = String::with_capacity(quoted.len());
    let mut escaped = false;
    for c in quoted.chars() {
        if c == '\\' && !escaped {
            escaped = true;
        } else {
            text.push(c);
            escaped = false;
        }
    }
    text
}

#[cfg(test)]
#[path = "client_address_tests.rs"]
mod tests;
