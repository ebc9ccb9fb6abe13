//! Revocation: `lua/revoke.lua` (every lease in a user's own pool revoked, new streams banned)
//! and `lua/revoked.lua` (the ids of a tag's leases revoked lately).

use super::layout::unexpected_reply;
use super::scripts::{self, Invocation};
use crate::errors::CoreResult;

/// revoke.lua's call: the user's own pool and its tag's holders, the ban and how long the
/// revoked ids are remembered, in ms, and the channel the tag is published on. Replies with how
/// many leases were revoked.
pub fn revoke_invocation(
    pool_key: &str,
    holders: &str,
    ban_ms: u64,
    remember_ms: u64,
    channel: &str,
) -> Invocation {
    let mut invocation = scripts::REVOKE.prepare_invoke();
    invocation
        .key(pool_key)
        .key(holders)
        .arg(ban_ms)
        .arg(remember_ms)
        .arg(channel);
    invocation
}

/// revoked.lua's call: the tag's holders. Replies with each lease id, then the ms its user's
/// new streams are still banned for.
pub fn revoked_invocation(holders: &str) -> Invocation {
    let mut invocation = scripts::REVOKED.prepare_invoke();
    invocation.key(holders);
    invocation
}

/// revoked.lua's reply: (lease id, ms its user is still banned for) pairs.
pub fn decode_revoked(reply: &[String]) -> CoreResult<Vec<(String, u64)>> {
    let pairs = reply.chunks_exact(2);
    if !pairs.remainder().is_empty() {
        return Err(unexpected_reply("revoked", &reply));
    }
    pairs
        .map(|pair| match pair[1].parse() {
            Ok(ban_ms) => Ok((pair[0].clone(), ban_ms)),
            Err(_) => Err(unexpected_reply("revoked", &reply)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::layout::read;
    use super::*;

    #[test]
    fn a_revocation_names_the_pool_then_the_holders_and_the_channel_last() {
        let call = revoke_invocation("{u}:user:a", "{u}:holders", 60_000, 3_600_000, "{u}:revocations");
        assert_eq!(read::keys(&call), ["{u}:user:a", "{u}:holders"]);
        assert_eq!(read::args(&call), ["60000", "3600000", "{u}:revocations"]);
        assert_eq!(read::keys(&revoked_invocation("{u}:holders")), ["{u}:holders"]);
    }

    #[test]
    fn a_listing_pairs_each_revoked_lease_with_its_users_ban() {
        let reply = ["a".to_owned(), "0".to_owned(), "b".to_owned(), "20000".to_owned()];
        assert_eq!(
            decode_revoked(&reply).ok(),
            Some(vec![("a".to_owned(), 0), ("b".to_owned(), 20_000)])
        );
        assert!(decode_revoked(&reply[..3]).is_err());
        assert!(decode_revoked(&["a".to_owned(), "x".to_owned()]).is_err());
    }
}
