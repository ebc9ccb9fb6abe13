//! `lua/count.lua`: the slots in use in pools of one hash tag.

use super::layout::unexpected_reply;
use super::scripts::{self, Invocation};
use crate::errors::CoreResult;
use crate::keys;

/// count.lua's call: the pools (at least one, all of one tag), then their tag's holders; the
/// lease duration sizes the clock-step guard.
pub fn count_invocation(pool_keys: &[String], ttl_ms: u64) -> Invocation {
    let mut invocation = scripts::COUNT.prepare_invoke();
    invocation
        .key(pool_keys)
        .key(keys::holders_key(&pool_keys[0]))
        .arg(ttl_ms);
    invocation
}

/// count.lua's reply: one count per pool.
pub fn decode_count(counts: Vec<u64>, pools: usize) -> CoreResult<Vec<u64>> {
    if counts.len() != pools {
        return Err(unexpected_reply("count", &counts));
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::super::layout::read;
    use super::*;

    #[test]
    fn a_count_names_the_pools_then_their_holders_and_answers_each() {
        let pools = ["{t}:user:a".to_owned(), "{t}:global".to_owned()];
        let call = count_invocation(&pools, 30_000);
        assert_eq!(read::keys(&call), ["{t}:user:a", "{t}:global", "{t}:holders"]);
        assert_eq!(read::args(&call), ["30000"]);
        assert_eq!(decode_count(vec![1, 4], 2).ok(), Some(vec![1, 4]));
        assert!(decode_count(vec![1], 2).is_err());
    }
}
