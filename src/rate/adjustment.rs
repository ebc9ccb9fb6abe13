//! The changes a token budget makes to its counters (`budget/`): a stream's top-up each round,
//! its answer, and the adjustments, applied at most once, that settle a stream or give back
//! what nobody used.

use super::{Bucket, RatePolicy};

/// One stream's top-up of its token budgets (`budget/`), sent every round while it streams:
/// first, what `give_back[i]` lists is given back to `policies[i]` (`keys[i]` counts it): the
/// reservation of the tokens streamed since the last round, and a roll's; then `moved[i]` units
/// (of the tokens streamed since the last round) are taken in the current bucket whatever the
/// room, so each token counts in the window of the time it streamed; then `want` more answer
/// tokens, as many as every policy has room for at `prices[i]` units per million tokens (a
/// million for a token budget, see `budget/price.rs`), or all of them if `forced`.
pub struct TopUp {
    pub keys: Vec<String>,
    pub policies: Vec<RatePolicy>,
    pub give_back: Vec<Vec<(Bucket, u64)>>,
    pub moved: Vec<u64>,
    pub prices: Vec<u64>,
    pub want: u64,
    pub forced: bool,
}

/// What a top-up got: `granted` tokens (beyond the `moved` ones), the `room` its budgets have
/// left after it (the least of them, in answer tokens), and per policy (in order; None when nothing was taken)
/// the bucket its share went to and for how many more ms, on the server's clock, that bucket
/// counts in the window.
#[derive(Debug, Clone, PartialEq)]
pub struct ToppedUp {
    pub granted: u64,
    pub room: u64,
    pub buckets: Vec<Option<(Bucket, u64)>>,
}

/// One change to a budget's counter: a charge now, or a refund to the bucket the tokens went to.
#[derive(Debug, Clone)]
pub struct Adjustment {
    pub key: String,
    pub policy: RatePolicy,
    pub tokens: u64,
    /// None: charge `tokens` now; else give back up to `tokens` from this bucket, while it
    /// still counts.
    pub refund_from: Option<Bucket>,
}

/// Adjustments applied at most once: a stream's settlement, or the give-back of a grant nobody
/// took or of a top-up answered after the settlement. A call whose answer was lost is sent
/// again, and the store recognises `id` (see `settle.lua`), so its answer's size, if it has
/// one, is counted once too.
#[derive(Debug, Clone)]
pub struct Settlement {
    pub id: String,
    pub adjustments: Vec<Adjustment>,
    pub answer: Option<AnswerSample>,
}

/// Where a stream's answer sizes are learned, in the tag of its first budget's counter: its
/// model's histogram (one count per identity, see `answer_sizes`) and its identity's own
/// histogram of that model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnswerKeys {
    pub model: String,
    pub own: String,
}

/// The size of a settled stream's answer, counted in its identity's histogram (`keys.own`) in
/// `bucket` (`answer_sizes::bucket_of`), and so in its model's (`keys.model`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnswerSample {
    pub keys: AnswerKeys,
    pub bucket: usize,
}

impl Settlement {
    /// The refunds of a grant nobody took (`lease_id`'s), applied at most once like a
    /// settlement, under an id of their own: the lease's own settlement gives back its budgets'
    /// reservation, these its request-rate units or, for a grant never answered to its caller,
    /// everything.
    pub fn untaken(lease_id: &str, refunds: Vec<Adjustment>) -> Self {
        Settlement {
            id: format!("{lease_id}:untaken"),
            adjustments: refunds,
            answer: None,
        }
    }
}
