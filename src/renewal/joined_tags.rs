//! The hash tags this manager's holder joined: the holders keys of the tags where it was granted
//! a lease in Redis, each with whether a renewal round found it idle (nothing held nor in flight
//! there) with no grant there since, and how long the holder's entry there lives as far as this
//! process knows. The holder stays in a tag between leases and leaves it at the next round that
//! finds it idle again, so this process keeps state for the tags it uses, not for every user it
//! ever served, and leaves the rest on close (`depart`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::Leases;
use crate::keys;
use crate::lease::{monotonic_ms, Store};
use crate::sync::lock;

#[derive(Default)]
struct Joined {
    idle: bool,
    /// `monotonic_ms` until which the holder's entry in the tag lives at least: the latest
    /// grant's deadline or keep-alive's `sent_at + lease`, since the answer that found the
    /// entry gone (0: not known).
    entry_until_ms: u64,
}

#[derive(Default)]
pub(super) struct JoinedTags(Mutex<HashMap<Arc<str>, Joined>>);

impl JoinedTags {
    /// A lease was granted in the tag of `holders`, whose entry lives until `entry_until_ms`:
    /// joined, and not idle.
    pub fn join(&self, holders: &Arc<str>, entry_until_ms: u64) {
        let mut joined = lock(&self.0);
        let tag = match joined.get_mut(&**holders) {
            Some(tag) => tag,
            None => joined.entry(Arc::clone(holders)).or_default(),
        };
        tag.idle = false;
        tag.entry_until_ms = tag.entry_until_ms.max(entry_until_ms);
    }

    /// A keep-alive found the entry live in the tag of `holders` (it lives until `until_ms`), or
    /// gone (`None`: what was known of it is forgotten).
    pub fn entry_renewed(&self, holders: &str, until_ms: Option<u64>) {
        if let Some(tag) = lock(&self.0).get_mut(holders) {
            tag.entry_until_ms = until_ms.map_or(0, |until| tag.entry_until_ms.max(until));
        }
    }

    /// Until when the holder's entry in the tag of `holders` lives, if that is `at_least_ms`
    /// from now or later.
    pub fn entry_known_until(&self, holders: &str, at_least_ms: u64) -> Option<u64> {
        let until = lock(&self.0).get(holders)?.entry_until_ms;
        (until >= monotonic_ms().saturating_add(at_least_ms)).then_some(until)
    }

    pub fn len(&self) -> usize {
        lock(&self.0).len()
    }
}

impl Leases {
    /// Leaves every tag this manager joined where it holds nothing now.
    pub(super) async fn depart(&self) {
        let joined = lock(&self.joined.0).drain().map(|(holders, _)| holders).collect();
        self.depart_from(joined).await;
    }

    /// At a renewal round: leaves the tags found idle (nothing held nor in flight there) at the
    /// last round too, with no grant there since, and marks those idle now. A lease that comes
    /// meanwhile is safe: `depart.lua` leaves no tag where the holder has members, and an
    /// acquire after it (whose flight began after the tag left this map, so it trusts no entry
    /// known here) registers the holder again and joins the tag again here.
    pub(super) async fn leave_idle_tags(&self) {
        let idle = {
            let held = lock(&self.held);
            let mut joined = lock(&self.joined.0);
            let mut idle = Vec::new();
            joined.retain(|holders, tag| {
                if !held.is_idle(Store::Main, holders) {
                    tag.idle = false;
                    return true;
                }
                if tag.idle {
                    idle.push(Arc::clone(holders));
                    return false;
                }
                tag.idle = true;
                true
            });
            idle
        };
        if !idle.is_empty() {
            self.depart_from(idle).await;
        }
    }

    /// Leaves the tags of `holders_keys` where the holder holds nothing now (a failure leaves
    /// its entry to expire and the reaper). Not from a forked child: the tags are its parent's.
    async fn depart_from(&self, holders_keys: Vec<Arc<str>>) {
        if self.in_forked_child() {
            return;
        }
        let mut joined: Vec<String> = holders_keys.iter().map(|holders| holders.to_string()).collect();
        let one_slot = self.stores.get(Store::Main).is_cluster();
        joined.sort_unstable_by(|a, b| keys::hash_tag(a).cmp(keys::hash_tag(b)));
        let groups: Vec<&[String]> = if one_slot {
            joined
                .chunk_by(|a, b| keys::hash_tag(a) == keys::hash_tag(b))
                .collect()
        } else {
            joined.chunks(1000).collect()
        };
        for group in groups {
            let _ = self.stores.call(Store::Main, |main| main.depart(group)).await;
        }
    }
}
