//! The answer sizes this process learned per model (`rate::answer_sizes`), as `reserve="auto"`
//! uses them without `max_tokens`: each model's estimate read from its histogram in Redis and
//! kept here, read again in the background at most every `READ_EVERY`, so no stream waits for
//! a read. At most `MAX_MODELS` are kept, the one used least recently forgotten first. The
//! embedded store's histograms live in this process: they are read at every use, not kept.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Manager;
use crate::budget::{BudgetRequest, AUTO_ANSWER};
use crate::errors::{CoreError, CoreResult};
use crate::keys::check_identity;
use crate::lease::Store;
use crate::rate::answer_sizes;
use crate::runtime;
use crate::sync::lock;

/// A model's estimate is read again once this old, at its next use.
pub const READ_EVERY: Duration = Duration::from_secs(10);

/// Models whose estimate a manager keeps at most.
pub const MAX_MODELS: usize = 1_024;

#[derive(Default)]
pub struct AnswerEstimates(Mutex<Kept>);

#[derive(Default)]
struct Kept {
    by_key: HashMap<String, Estimate>,
    /// Uses so far: each estimate keeps the number of its last use.
    uses: u64,
}

struct Estimate {
    /// None: fewer than `answer_sizes::MIN_SAMPLES` answers, or not read yet.
    tokens: Option<u64>,
    /// When the last read was sent (answered or not); None before the first.
    read_at: Option<Instant>,
    reading: bool,
    used: u64,
}

impl AnswerEstimates {
    /// The estimate kept for the histogram `key`, and whether it is due a read (none under way,
    /// and none yet or the last one `READ_EVERY` ago): then the caller reads it, and `read` is
    /// marked under way.
    fn use_of(&self, key: &str, now: Instant) -> (Option<u64>, bool) {
        let mut kept = lock(&self.0);
        kept.uses += 1;
        let used = kept.uses;
        if !kept.by_key.contains_key(key) {
            // A model not kept: the least recently used makes room (a scan, on a miss only).
            if kept.by_key.len() >= MAX_MODELS {
                let oldest = kept.by_key.iter().min_by_key(|(_, estimate)| estimate.used);
                if let Some(oldest) = oldest.map(|(key, _)| key.clone()) {
                    kept.by_key.remove(&oldest);
                }
            }
            let unread = Estimate {
                tokens: None,
                read_at: None,
                reading: false,
                used,
            };
            kept.by_key.insert(key.to_owned(), unread);
        }
        let estimate = kept.by_key.get_mut(key).expect("kept above");
        estimate.used = used;
        let due = !estimate.reading
            && estimate
                .read_at
                .is_none_or(|at| now.duration_since(at) >= READ_EVERY);
        if due {
            estimate.reading = true;
            estimate.read_at = Some(now);
        }
        (estimate.tokens, due)
    }

    /// A read's answer (None if it failed: the estimate kept stays, until the next read).
    fn read(&self, key: &str, counts: Option<&[u64]>) {
        let mut kept = lock(&self.0);
        if let Some(estimate) = kept.by_key.get_mut(key) {
            estimate.reading = false;
            if let Some(counts) = counts {
                estimate.tokens = answer_sizes::estimate(counts);
            }
        }
    }
}

impl Manager {
    /// `reserve="auto"` without `max_tokens`: the answer's reservation becomes the model's
    /// learned size (else `AUTO_ANSWER`), within what the budgets hold after the prompt; and
    /// every budget naming a model gets the histogram its settlement counts in, in the tag of
    /// its first budget's counter (`first_counter`). Returns whether a read of it is due, to
    /// send once the acquire is under way (`read_answer_sizes`).
    pub(super) fn size_by_answers(&self, budget: &mut BudgetRequest, first_counter: &str) -> bool {
        let Some(model) = &budget.model else {
            return false;
        };
        let key = self.keys.answers_key(first_counter, model);
        let mut due = false;
        if let Some(within) = budget.learned_within {
            let learned = match self.is_embedded() {
                true => self.answer_sizes_here(&key),
                false => {
                    let (tokens, read) = self.answer_estimates.use_of(&key, Instant::now());
                    due = read;
                    tokens
                }
            };
            budget.output = learned.unwrap_or(AUTO_ANSWER).min(within);
        }
        budget.answers_key = Some(key);
        due
    }

    /// Reads a model's histogram (`key`) in the background, for the streams after this one.
    pub(super) fn read_answer_sizes(self: &Arc<Self>, key: String) {
        let manager = Arc::clone(self);
        runtime::handle().spawn(async move {
            let _ = manager.read_estimate(&key).await;
        });
    }

    /// Reads a model's histogram (`key`) from Redis and keeps its estimate (a failed read
    /// keeps the one it had).
    async fn read_estimate(&self, key: &str) -> CoreResult<Option<u64>> {
        let counts = self.stores.call(Store::Main, |main| main.answer_sizes(key)).await;
        self.answer_estimates.read(key, counts.as_deref().ok());
        Ok(answer_sizes::estimate(&counts?))
    }

    /// The embedded store's estimate of a histogram: read now (it never waits).
    fn answer_sizes_here(&self, key: &str) -> Option<u64> {
        let read = self.stores.main().answer_sizes(key);
        let counts = futures_util::FutureExt::now_or_never(read).and_then(Result::ok)?;
        answer_sizes::estimate(&counts)
    }

    /// The answer tokens `reserve="auto"` reserves for `model` without `max_tokens`, before the
    /// budgets' cap: its learned size, or `AUTO_ANSWER` below `answer_sizes::MIN_SAMPLES`
    /// answers; kept as the streams use it, and read first if never read here. Without a global
    /// pool each identity's tag learns its own (the user's, or the identity its first budget
    /// counts): `identity` names it.
    pub fn answer_estimate(
        self: &Arc<Self>,
        identity: Option<&str>,
        model: &str,
    ) -> CoreResult<impl Future<Output = CoreResult<u64>> + Send + 'static> {
        if model.is_empty() {
            return Err(CoreError::InvalidInput(
                "model is empty: pass the model name the requests give as model=".into(),
            ));
        }
        let counter = match (identity, self.keys.global_pool()) {
            (_, Some(global)) => global.key.to_string(),
            (Some(identity), None) => {
                check_identity(identity).map_err(CoreError::InvalidInput)?;
                self.keys.user_pool(identity).key.to_string()
            }
            (None, None) => {
                return Err(CoreError::InvalidInput(
                    "without a global pool (global_pool=False) each user learns its own answer sizes: pass the user_id".into(),
                ))
            }
        };
        let key = self.keys.answers_key(&counter, model);
        self.start_here()?;
        let manager = Arc::clone(self);
        Ok(async move {
            if manager.is_embedded() {
                return Ok(manager.answer_sizes_here(&key).unwrap_or(AUTO_ANSWER));
            }
            let (tokens, due) = manager.answer_estimates.use_of(&key, Instant::now());
            if !due {
                return Ok(tokens.unwrap_or(AUTO_ANSWER));
            }
            Ok(manager.read_estimate(&key).await?.unwrap_or(AUTO_ANSWER))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_estimate_is_read_at_its_first_use_then_at_most_every_ten_seconds() {
        let estimates = AnswerEstimates::default();
        let start = Instant::now();
        assert_eq!(estimates.use_of("m", start), (None, true), "the first use reads");
        assert_eq!(estimates.use_of("m", start), (None, false), "one read at a time");
        let mut counts = [0; answer_sizes::BUCKETS];
        counts[answer_sizes::bucket_of(300)] = answer_sizes::MIN_SAMPLES;
        estimates.read("m", Some(&counts));
        let soon = start + READ_EVERY - Duration::from_millis(1);
        assert_eq!(estimates.use_of("m", soon), (Some(418), false));
        assert_eq!(estimates.use_of("m", start + READ_EVERY), (Some(418), true));
        estimates.read("m", None);
        assert_eq!(
            estimates.use_of("m", start + READ_EVERY),
            (Some(418), false),
            "a failed read keeps the estimate, and is tried again after ten seconds"
        );
    }

    #[test]
    fn the_model_used_least_recently_is_forgotten_first() {
        let estimates = AnswerEstimates::default();
        let now = Instant::now();
        for model in 0..MAX_MODELS {
            estimates.use_of(&format!("m{model}"), now);
        }
        estimates.use_of("m0", now); // m1 is now the least recently used
        estimates.use_of("one more", now);
        let kept = lock(&estimates.0);
        assert_eq!(kept.by_key.len(), MAX_MODELS);
        assert!(kept.by_key.contains_key("m0") && !kept.by_key.contains_key("m1"));
    }
}
