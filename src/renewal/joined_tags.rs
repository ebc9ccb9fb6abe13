//! The hash tags this manager's holder joined: the holders keys of the tags where it was granted
//! a lease in Redis, each with whether a renewal round found it idle (nothing held nor in flight
//! there) with no grant there since. The holder stays in a tag between leases and leaves it at
//! the next round that finds it idle again, so this process keeps state for the tags it uses,
//! not for every user it ever served, and leaves the rest on close (`depart`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::Leases;
use crate::keys;
use crate::lease::Store;
use crate::sync::lock;

#[derive(Default)]
pub(super) struct JoinedTags(Mutex<HashMap<Arc<str>, bool>>);

impl JoinedTags {
    /// A lease was granted in the tag of `holders`: joined, and not idle.
    pub fn join(&self, holders: &Arc<str>) {
        let mut joined = lock(&self.0);
        match joined.get_mut(&**holders) {
            Some(idle) => *idle = false,
            None => drop(joined.insert(Arc::clone(holders), false)),
        }
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
    /// acquire after it registers the holder again (and joins the tag again here).
    pub(super) async fn leave_idle_tags(&self) {
        let idle = {
            let held = lock(&self.held);
            let mut joined = lock(&self.joined.0);
            let mut idle = Vec::new();
            joined.retain(|holders, was_idle| {
                if !held.is_idle(Store::Main, holders) {
                    *was_idle = false;
                    return true;
                }
                if *was_idle {
                    idle.push(Arc::clone(holders));
                    return false;
                }
                *was_idle = true;
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
