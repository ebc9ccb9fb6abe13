//! What an acquire asks a store, and what the store answers.

use crate::config::LineOrder;
use crate::errors::Rejection;
use crate::keys::LineKeys;
use crate::rate::{Decision, HitOutcome};

/// The highest priority an acquire may ask for.
pub const MAX_PRIORITY: u8 = 9;

#[derive(Debug, PartialEq)]
pub enum AcquireOutcome {
    Granted {
        /// Slots in use in each pool after the grant, in pool order.
        used: Vec<u64>,
        /// The ms the holder's entry had left after the call, when it was live as the lease was
        /// added: its other leases in the tag lived on, and this one lives at least that long
        /// from the call's sending. None: the entry had expired or vanished (the others may have
        /// been reaped), and was written anew for a lease duration.
        entry_life_ms: Option<u64>,
        /// The grant's fencing token, when its terms ask for one: above every token given before
        /// in the lease's tag (so in any pool it shares with another lease).
        fencing_token: Option<u64>,
        /// Each rate policy's decision, the start counted.
        rates: Vec<Decision>,
        /// When the call left this process (monotonic ms): the store decided later, so the
        /// lease lives at least the entry's life (or a lease duration) from then.
        sent_at_ms: u64,
    },
    Rejected(Rejection),
    /// A rate policy refused the start (nothing was taken anywhere).
    RateLimited(HitOutcome),
    /// The caller is in line: try again when woken.
    Wait(Placed),
    /// A pool's line is full (`max_waiting`): `capacity` is the limit, `current` the waiters;
    /// `displaced`: the waiter's place there went to another user's first waiter.
    LineFull {
        full: Rejection,
        displaced: bool,
    },
    /// An operator banned the user's streams for this many ms more (`revoke`).
    Banned(u64),
}

/// One caller waiting in line; it must call again within `ttl_ms` or be dropped from the line.
#[derive(Debug)]
pub struct Waiter {
    pub id: String,
    pub ttl_ms: u64,
}

/// How an acquire stands to the line: a waiter in it, or a newcomer who must not take room an
/// earlier waiter needs.
#[derive(Debug, Clone, Copy)]
pub struct InLine<'a> {
    pub line: &'a LineKeys,
    pub waiter: Option<&'a Waiter>,
    /// 0 to `MAX_PRIORITY`, higher first.
    pub priority: u8,
    pub order: LineOrder,
    /// Waiters each pool's line holds at most, in pool order (0: no limit).
    pub max_waiting: &'a [u64],
    /// A full own pool makes a waiter wait (in its own line) instead of refusing it.
    pub own_waits: bool,
}

/// Where a waiter stands: its ticket, its place in the line of each of its pools (0 for a
/// pool without a line; lower places are earlier), and the pool that had no room for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub ticket: u64,
    pub places: Vec<u64>,
    /// The first pool without room for the waiter (its index among the lease's pools) and its
    /// slots in use and kept by earlier waiters, at most its capacity: what a refusal says
    /// when the wait runs out.
    pub full: (usize, u64),
}
