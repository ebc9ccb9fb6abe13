//! Revocation: `lua/revoke.lua` (every lease in a user's own pool revoked, new streams banned)
//! and `lua/revoked.lua` (the ids of a tag's leases revoked lately).

use super::scripts::{self, Invocation};

/// revoke.lua's call: the user's own pool and its tag's holders, the ban and how long the
/// revoked ids are remembered, in ms. Replies with how many leases were revoked.
pub fn revoke_invocation(pool_key: &str, holders: &str, ban_ms: u64, remember_ms: u64) -> Invocation {
    let mut invocation = scripts::REVOKE.prepare_invoke();
    invocation.key(pool_key).key(holders).arg(ban_ms).arg(remember_ms);
    invocation
}

/// revoked.lua's call: the tag's holders. Replies with the lease ids.
pub fn revoked_invocation(holders: &str) -> Invocation {
    let mut invocation = scripts::REVOKED.prepare_invoke();
    invocation.key(holders);
    invocation
}

#[cfg(test)]
mod tests {
    use super::super::layout::read;
    use super::*;

    #[test]
    fn a_revocation_names_the_pool_then_the_holders() {
        let call = revoke_invocation("{u}:user:a", "{u}:holders", 60_000, 3_600_000);
        assert_eq!(read::keys(&call), ["{u}:user:a", "{u}:holders"]);
        assert_eq!(read::args(&call), ["60000", "3600000"]);
        assert_eq!(read::keys(&revoked_invocation("{u}:holders")), ["{u}:holders"]);
    }
}
