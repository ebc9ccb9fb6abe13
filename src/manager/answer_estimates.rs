//! The answer sizes this process learned per identity and model (`rate::answer_sizes`), as
//! `reserve="auto"` uses them without `max_tokens`: each identity's figure (its own estimate,
//! else its model's) read from the two histograms in Redis and kept here, read again in the
//! background at most every `READ_EVERY`, so no stream waits for a read; each model's figure is
//! kept too, from every read of one of its identities, for an identity not read yet. At most
//! `MAX_KEPT` are kept, the one used least recently forgotten first. The embedded store's
//! histograms live in this process: they are read at every use, not kept.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Manager;
use crate::budget::{BudgetRequest, AUTO_ANSWER};
use crate::errors::{CoreError, CoreResult};
use crate::keys::check_identity;
use crate::lease::Store;
use crate::rate::{answer_sizes, AnswerKeys};
use crate::runtime;
use crate::sync::lock;

/// A model's estimate is read again once this old, at its next use.
pub const READ_EVERY: Duration = Duration::from_secs(10);

/// Figures (identities' and models') a manager keeps at most.
pub const MAX_KEPT: usize = 4_096;

#[derive(Default)]
pub struct AnswerEstimates(Mutex<Kept>);

#[derive(Default)]
struct Kept {
    by_key: HashMap<String, Estimate>,
    /// Uses so far: each estimate keeps the number of its last use.
    uses: u64,
}

impl Kept {
    /// The estimate of `key`, used now: kept unread if it was not (the least recently used
    /// makes room: a scan, on a miss only).
    fn used(&mut self, key: &str) -> &mut Estimate {
        self.uses += 1;
        let used = self.uses;
        if !self.by_key.contains_key(key) && self.by_key.len() >= MAX_KEPT {
            let oldest = self.by_key.iter().min_by_key(|(_, estimate)| estimate.used);
            if let Some(oldest) = oldest.map(|(key, _)| key.clone()) {
                self.by_key.remove(&oldest);
            }
        }
        let estimate = self.by_key.entry(key.to_owned()).or_insert(Estimate {
            tokens: None,
            read_at: None,
            reading: false,
            used,
        });
        estimate.used = used;
        estimate
    }
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
        let estimate = kept.used(key);
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

    /// The figure kept for `key` without using it (None: none, or not kept).
    fn peek(&self, key: &str) -> Option<u64> {
        lock(&self.0).by_key.get(key).and_then(|estimate| estimate.tokens)
    }

    /// A read's answer (`counts`: the model's histogram, then the identity's when `own` is
    /// given; None if it failed: the figures kept stay, until the next read): the figure of the
    /// key read (`own`, else `model`), and the model's, kept for identities not read yet.
    fn read(&self, model: &str, own: Option<&str>, counts: Option<&[u64]>) {
        let mut kept = lock(&self.0);
        let figures = counts.map(|counts| {
            let (model, own) = split(counts);
            (answer_sizes::learned(own, model), answer_sizes::estimate(model))
        });
        if let Some(estimate) = kept.by_key.get_mut(own.unwrap_or(model)) {
            estimate.reading = false;
            if let Some((read, _)) = figures {
                estimate.tokens = read;
            }
        }
        if let (Some((_, figure)), Some(_)) = (figures, own) {
            kept.used(model).tokens = figure;
        }
    }
}

/// A read's counts: the model's histogram, and the identity's own (empty when not read).
fn split(counts: &[u64]) -> (&[u64], &[u64]) {
    counts.split_at(counts.len().min(answer_sizes::BUCKETS))
}

impl Manager {
    /// `reserve="auto"` without `max_tokens`: the answer's reservation becomes the identity's
    /// learned size (its own, else its model's; else `AUTO_ANSWER`), within what the budgets
    /// hold after the prompt; and every budget naming a model gets the histograms its
    /// settlement counts in, in the tag of its first budget's counter (`first_counter`).
    /// Returns whether a read of them is due, to send once the acquire is under way
    /// (`read_answer_sizes`).
    pub(super) fn size_by_answers(
        &self,
        budget: &mut BudgetRequest,
        first_counter: &str,
        identity: &str,
    ) -> bool {
        let Some(model) = &budget.model else {
            return false;
        };
        let model = self.keys.answers_key(first_counter, model);
        let keys = AnswerKeys {
            own: self.keys.own_answers_key(&model, identity),
            model,
        };
        let mut due = false;
        if let Some(within) = budget.learned_within {
            let learned = match self.is_embedded() {
                true => self.answer_sizes_here(&keys.model, Some(&keys.own)),
                false => {
                    let (tokens, read) = self.answer_estimates.use_of(&keys.own, Instant::now());
                    due = read;
                    // An identity not read yet takes its model's figure, if one is kept.
                    tokens.or_else(|| self.answer_estimates.peek(&keys.model))
                }
            };
            budget.output = learned.unwrap_or(AUTO_ANSWER).min(within);
        }
        budget.answers = Some(keys);
        due
    }

    /// Reads an identity's histograms (`keys`) in the background, for the streams after this
    /// one.
    pub(super) fn read_answer_sizes(self: &Arc<Self>, keys: AnswerKeys) {
        let manager = Arc::clone(self);
        runtime::handle().spawn(async move {
            let _ = manager.read_estimate(&keys.model, Some(&keys.own)).await;
        });
    }

    /// Reads a model's histogram, and an identity's own when `own` is given, from Redis and
    /// keeps the figures (a failed read keeps those it had); returns the identity's (the
    /// model's without `own`).
    async fn read_estimate(&self, model: &str, own: Option<&str>) -> CoreResult<Option<u64>> {
        let counts = self
            .stores
            .call(Store::Main, |main| main.answer_sizes(model, own))
            .await;
        self.answer_estimates.read(model, own, counts.as_deref().ok());
        let counts = counts?;
        let (model, own) = split(&counts);
        Ok(answer_sizes::learned(own, model))
    }

    /// The embedded store's figure for a model's histogram and, when given, an identity's own:
    /// read now (it never waits).
    fn answer_sizes_here(&self, model: &str, own: Option<&str>) -> Option<u64> {
        let read = self.stores.main().answer_sizes(model, own);
        let counts = futures_util::FutureExt::now_or_never(read).and_then(Result::ok)?;
        let (model, own) = split(&counts);
        answer_sizes::learned(own, model)
    }

    /// The answer tokens `reserve="auto"` reserves for `model` without `max_tokens`, before the
    /// budgets' cap: `identity`'s learned size (its own, else the model's), or the model's
    /// without `identity`, or `AUTO_ANSWER` (`answer_sizes` has the rule); kept as the streams
    /// use it, and read first if never read here. Without a global pool each user's tag learns
    /// its own: `identity` is needed.
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
        if let Some(identity) = identity {
            check_identity(identity).map_err(CoreError::InvalidInput)?;
        }
        let shared = self.keys.global_pool().filter(|_| !self.keys.users_tagged());
        let counter = match (identity, shared) {
            (_, Some(global)) => global.key.to_string(),
            (Some(identity), None) => self.keys.user_pool(identity).key.to_string(),
            (None, None) => {
                return Err(CoreError::InvalidInput(
                    "each user learns its own answer sizes where users' keys have hash tags of their own (global_pool=False, lease_global_slots=True): pass the user_id".into(),
                ))
            }
        };
        let model = self.keys.answers_key(&counter, model);
        let own = identity.map(|identity| self.keys.own_answers_key(&model, identity));
        self.start_here()?;
        let manager = Arc::clone(self);
        Ok(async move {
            let own = own.as_deref();
            if manager.is_embedded() {
                return Ok(manager.answer_sizes_here(&model, own).unwrap_or(AUTO_ANSWER));
            }
            let estimates = &manager.answer_estimates;
            let (tokens, due) = estimates.use_of(own.unwrap_or(&model), Instant::now());
            if !due {
                let models = || own.and_then(|_| estimates.peek(&model));
                return Ok(tokens.or_else(models).unwrap_or(AUTO_ANSWER));
            }
            Ok(manager.read_estimate(&model, own).await?.unwrap_or(AUTO_ANSWER))
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
        estimates.read("m", None, Some(&counts));
        let soon = start + READ_EVERY - Duration::from_millis(1);
        assert_eq!(estimates.use_of("m", soon), (Some(418), false));
        assert_eq!(estimates.use_of("m", start + READ_EVERY), (Some(418), true));
        estimates.read("m", None, None);
        assert_eq!(
            estimates.use_of("m", start + READ_EVERY),
            (Some(418), false),
            "a failed read keeps the estimate, and is tried again after ten seconds"
        );
    }

    #[test]
    fn an_identitys_read_keeps_its_own_figure_and_its_models() {
        let estimates = AnswerEstimates::default();
        let now = Instant::now();
        estimates.use_of("m", now);
        estimates.use_of("m:a", now);
        let mut counts = vec![0; 2 * answer_sizes::BUCKETS];
        counts[answer_sizes::bucket_of(300)] = answer_sizes::MIN_SAMPLES;
        counts[answer_sizes::BUCKETS + answer_sizes::bucket_of(8_000)] = answer_sizes::MIN_SAMPLES;
        estimates.read("m", Some("m:a"), Some(&counts));
        assert_eq!(
            estimates.peek("m"),
            Some(418),
            "the model's, for identities not read yet"
        );
        assert_eq!(estimates.peek("m:a"), Some(10_484), "its own");
    }

    #[test]
    fn the_model_used_least_recently_is_forgotten_first() {
        let estimates = AnswerEstimates::default();
        let now = Instant::now();
        for model in 0..MAX_KEPT {
            estimates.use_of(&format!("m{model}"), now);
        }
        estimates.use_of("m0", now); // m1 is now the least recently used
        estimates.use_of("one more", now);
        let kept = lock(&estimates.0);
        assert_eq!(kept.by_key.len(), MAX_KEPT);
        assert!(kept.by_key.contains_key("m0") && !kept.by_key.contains_key("m1"));
    }
}
