//! Where leases live: identity hashing and the Redis key layout.
//!
//! The pools of one acquire share a hash tag, so they sit in one Redis Cluster slot and no script
//! ever raises CROSSSLOT. With a global pool every key of a manager shares `{<key_prefix>}` (one
//! shard serves them all); without one, or with its slots leased to processes in slabs, each
//! user's pool has a tag of its own (`{<key_prefix>:<digest>}`) and users spread across shards.
//! Identities are stored only as keyed digests, so `KEYS *` shows no user id.

use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::config::Config;
use crate::rate::RatePolicy;

/// The name of every user's own pool, reserved: no resource may take it.
pub const PER_USER: &str = "per_user";

/// Identities longer than this are rejected: they are bugs (a request body used as a user id).
pub const MAX_IDENTITY_BYTES: usize = 1024;

/// What a pool is to the caller taking a slot in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolRole {
    /// The caller's own quota (`per_user`): a full one refuses at once (429), never makes it wait.
    Own,
    /// Capacity shared by everyone (`global`, a resource): a full one makes waiters wait (503).
    Shared,
}

/// One capacity-limited pool: a sorted set of lease ids scored by their holder
/// (`lua/prelude/holders.lua`).
#[derive(Debug, Clone, PartialEq)]
pub struct Pool {
    /// Name shown to users when this pool refuses: `"per_user"`, `"global"` or a resource's.
    pub name: Arc<str>,
    pub key: Arc<str>,
    /// The holders key of the pool's hash tag (`holders_key`): one string for every pool and
    /// lease of a shared tag, held leases being many.
    pub holders: Arc<str>,
    /// 0 means unlimited (the pool still counts).
    pub capacity: u64,
    pub role: PoolRole,
}

impl Pool {
    /// A pool with a holders key of its own; `KeySpace` builds the pools of a shared tag with
    /// one between them.
    pub fn new(name: &str, key: String, capacity: u64, role: PoolRole) -> Self {
        Pool {
            name: name.into(),
            holders: holders_key(&key).into(),
            key: key.into(),
            capacity,
            role,
        }
    }
}

/// The first-come-first-served line of a manager's shared pools (see `docs/design.md`).
#[derive(Debug, Clone)]
pub struct LineKeys {
    /// Sorted set: waiter id by ticket.
    pub line: String,
    /// Sorted set: the processes with waiters by expiry; `<alive>:<holder id>` is the set of
    /// that process's waiters.
    pub alive: String,
    /// The ticket counter.
    pub tickets: String,
    /// Where a release publishes a wake-up for the waiters of every process.
    pub channel: String,
}

#[derive(Debug, Clone)]
pub struct KeySpace {
    prefix: String,
    /// HMAC-SHA256 keyed with `identity_secret`, the key's two blocks hashed once: each digest
    /// clones it and hashes the identity (two compressions, not four).
    keyed: Hmac<Sha256>,
    max_per_user: u64,
    /// Built once and shared (by reference count) by every acquire's pools and held lease.
    per_user_name: Arc<str>,
    shared_holders: Arc<str>,
    global: Option<Pool>,
    /// Each user's keys have a hash tag of their own: no global pool, or its slots leased.
    users_tagged: bool,
}

impl KeySpace {
    pub fn new(config: &Config) -> Self {
        KeySpace::with(
            &config.key_prefix,
            &config.identity_secret,
            config.max_per_user,
            config.global_pool.then_some(config.max_global),
        )
    }

    /// The layout of a manager that leases the global pool's slots in slabs: each user's keys
    /// in a tag of their own, the global pool out of a stream's pools.
    pub fn with_global_slots_leased(self) -> Self {
        KeySpace {
            users_tagged: true,
            ..self
        }
    }

    /// Whether each user's keys have a hash tag of their own (no global pool there).
    pub fn users_tagged(&self) -> bool {
        self.users_tagged
    }

    /// `max_global`: the global pool's capacity, None for no global pool.
    fn with(prefix: &str, secret: &[u8], max_per_user: u64, max_global: Option<u64>) -> Self {
        let tag = format!("{{{prefix}}}");
        let shared_holders: Arc<str> = holders_key(&tag).into();
        let global = max_global.map(|capacity| Pool {
            name: "global".into(),
            key: format!("{tag}:global").into(),
            holders: Arc::clone(&shared_holders),
            capacity,
            role: PoolRole::Shared,
        });
        KeySpace {
            prefix: prefix.to_owned(),
            keyed: Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length"),
            max_per_user,
            per_user_name: PER_USER.into(),
            shared_holders,
            users_tagged: global.is_none(),
            global,
        }
    }

    /// The hash tag shared by every key of a manager with a global pool, `{<key_prefix>}`, as
    /// the keys that hold it write it (no string of its own).
    fn shared_tag(&self) -> SharedTag<'_> {
        SharedTag(&self.prefix)
    }

    /// HMAC-SHA256 of the identity (keyed with `identity_secret`, empty key without one), 128 bits hex.
    pub fn identity_digest(&self, identity: &str) -> String {
        let mut mac = self.keyed.clone();
        mac.update(identity.as_bytes());
        hex::encode(&mac.finalize().into_bytes()[..16])
    }

    pub fn user_pool(&self, identity: &str) -> Pool {
        let digest = self.identity_digest(identity);
        let (key, holders) = if !self.users_tagged {
            let key = format!("{}:user:{digest}", self.shared_tag());
            (key, Arc::clone(&self.shared_holders))
        } else {
            let key = format!("{{{}:{digest}}}:user", self.prefix);
            let holders = holders_key(&key).into();
            (key, holders)
        };
        Pool {
            name: Arc::clone(&self.per_user_name),
            key: key.into(),
            holders,
            capacity: self.max_per_user,
            role: PoolRole::Own,
        }
    }

    /// The counter of one rate policy for one identity, in the hash tag of the identity's own
    /// pool (so a hit's policies and the stream's pools share a slot). The policy's name,
    /// window and algorithm are in the key: two scopes never share a counter.
    pub fn rate_key(&self, identity: &str, policy: &RatePolicy) -> String {
        self.rate_key_of_digest(&self.identity_digest(identity), policy)
    }

    /// `rate_key` of the identity whose `identity_digest` is `digest` (a hit's policies of one
    /// identity take one digest).
    pub fn rate_key_of_digest(&self, digest: &str, policy: &RatePolicy) -> String {
        // The unit too: a request rate and a budget of one name are two counters.
        let (name, window, algorithm, unit) = (
            &policy.name,
            policy.window_ms,
            policy.algorithm.code(),
            policy.unit.code(),
        );
        if !self.users_tagged {
            let tag = self.shared_tag();
            format!("{tag}:rate:{name}:{window}{algorithm}{unit}:{digest}")
        } else {
            format!(
                "{{{}:{digest}}}:rate:{name}:{window}{algorithm}{unit}",
                self.prefix
            )
        }
    }

    /// The histogram of a model's answer sizes that a stream's settlement counts in, in the tag
    /// of `counter_key` (its first budget's counter): the model by its keyed digest, as an
    /// identity, so no key shows a model name.
    pub fn answers_key(&self, counter_key: &str, model: &str) -> String {
        format!(
            "{{{}}}:answers:{}",
            hash_tag(counter_key),
            self.identity_digest(model)
        )
    }

    /// An identity's own histogram of a model's answer sizes, beside the model's (`answers`):
    /// keyed by the identity's hash, never its name.
    pub fn own_answers_key(&self, answers: &str, identity: &str) -> String {
        format!("{answers}:{}", self.identity_digest(identity))
    }

    /// None when the manager keeps no global pool (`global_pool=False`).
    pub fn global_pool(&self) -> Option<Pool> {
        self.global.clone()
    }

    /// The waiting lines of the shared pools, in their tag `{<key_prefix>}` (the global pool's
    /// and the resources'; without a global pool, only resources-only acquires can wait).
    pub fn line(&self) -> Option<LineKeys> {
        let tag = self.shared_tag();
        Some(LineKeys {
            line: format!("{tag}:line"),
            alive: format!("{tag}:line:alive"),
            tickets: format!("{tag}:line:ticket"),
            channel: format!("{tag}:wake"),
        })
    }

    /// The channel where a revoke tells every process the tag whose leases it revoked (a plain
    /// channel, on a cluster too: revokes are rare, and a revoke in a user's own tag publishes
    /// from that tag's slot).
    pub fn revocations_channel(&self) -> String {
        format!("{}:revocations", self.shared_tag())
    }

    /// A named shared resource (a database, a GPU model) with its capacity.
    pub fn resource_pool(&self, name: &str, capacity: u64) -> Pool {
        Pool {
            name: name.into(),
            key: format!("{}:resource:{name}", self.shared_tag()).into(),
            holders: Arc::clone(&self.shared_holders),
            capacity,
            role: PoolRole::Shared,
        }
    }

    /// The pools one acquire takes atomically, the user's own first: a stream of `identity`
    /// takes its user pool and the global pool (kept even when unlimited, so
    /// `get_active_count()` can always answer; with its slots leased, a slot of its process's
    /// slab instead, `manager/slabs.rs`); `resources` add theirs. Without an identity
    /// (resources only), neither user nor global pool is taken.
    pub fn pools_for(&self, identity: Option<&str>, resources: &[(String, u64)]) -> Vec<Pool> {
        let global = self.global.clone().filter(|_| !self.users_tagged);
        let stream = identity.map(|identity| std::iter::once(self.user_pool(identity)).chain(global));
        stream
            .into_iter()
            .flatten()
            .chain(
                resources
                    .iter()
                    .map(|(name, capacity)| self.resource_pool(name, *capacity)),
            )
            .collect()
    }
}

/// The `{hash tag}` of a key (its Redis Cluster slot): what is inside the first braces.
pub fn hash_tag(key: &str) -> &str {
    key.split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .map_or(key, |(tag, _)| tag)
}

/// The sorted set of the holders (managers) with leases in the pools of `pool_key`'s hash tag;
/// `<holders>:<holder id>` lists the pools where one holder has members.
pub fn holders_key(pool_key: &str) -> String {
    format!("{{{}}}:holders", hash_tag(pool_key))
}

/// The marker of a settlement applied (`lua/settle.lua`), in the tag of the counters it changes.
pub fn settled_key(counter_key: &str, id: &str) -> String {
    format!("{{{}}}:settled:{id}", hash_tag(counter_key))
}

/// Checks an identity: non-empty, at most `MAX_IDENTITY_BYTES`. Returns why it is bad.
pub fn check_identity(identity: &str) -> Result<(), String> {
    if identity.is_empty() {
        return Err("user_id is empty: pass the id of the authenticated user (or the client IP for anonymous traffic)".into());
    }
    check_length("user_id", identity)
}

/// Checks the identity a policy is paired with (a team, an API key), as `check_identity` does
/// the user's; the error names the policy, never the identity.
pub fn check_policy_identity(policy: &RatePolicy, identity: &str) -> Result<(), String> {
    if identity.is_empty() {
        return Err(format!(
            "the identity paired with rate limit {:?} is empty: pass the id it counts (a team, an API key, \"org|model\"), or the RateLimit alone to count the user's",
            &*policy.name
        ));
    }
    check_length(
        &format!("the identity paired with rate limit {:?}", &*policy.name),
        identity,
    )
}

fn check_length(what: &str, identity: &str) -> Result<(), String> {
    if identity.len() > MAX_IDENTITY_BYTES {
        return Err(format!(
            "{what} is {} bytes long, more than the {MAX_IDENTITY_BYTES} allowed: pass a short stable id, not a token or request body",
            identity.len()
        ));
    }
    Ok(())
}

/// Checks a resource: a short name of letters, digits and `_-.:` other than `per_user` (its
/// refusals would read as the user's own quota), a capacity of at least 1.
pub fn check_resource(name: &str, capacity: u64) -> Result<(), String> {
    if name == PER_USER {
        return Err(format!(
            "resource name {name:?} is reserved for each user's own quota: choose another name"
        ));
    }
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c));
    if !valid {
        return Err(format!(
            "resource name {name:?} is not valid: use 1 to 64 letters, digits, '_', '-', '.' or ':'"
        ));
    }
    if capacity == 0 {
        return Err(format!("resource {name:?} has capacity 0: give it at least 1"));
    }
    Ok(())
}

/// `KeySpace::shared_tag`: writes `{<key_prefix>}`.
struct SharedTag<'a>(&'a str);

impl std::fmt::Display for SharedTag<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{{{}}}", self.0)
    }
}

#[cfg(test)]
#[path = "keys_tests.rs"]
mod tests;
