//! The embedded store's histograms of answer sizes, per identity and per model (what
//! `lua/settle.lua` counts and `lua/answers.lua` reads in Redis; `rate::answer_sizes` has the
//! rule): at most `MAX_HISTOGRAMS`, the one counted least recently forgotten first, where Redis
//! lets an unused one expire. An identity's size is its one count in its model's histogram.

use std::collections::HashMap;

use crate::rate::answer_sizes::{percentile_bucket, BUCKETS};
use crate::rate::AnswerSample;

/// Histograms kept at most (identities' and models'; each about 300 bytes).
pub const MAX_HISTOGRAMS: usize = 16_384;

#[derive(Default)]
pub struct AnswerHistograms {
    /// By histogram key: the counts, when it was last counted (a tick of `ticks`), and for an
    /// identity's, the bucket of its one count in its model's.
    kept: HashMap<String, Histogram>,
    ticks: u64,
}

#[derive(Clone, Copy)]
struct Histogram {
    counts: [u64; BUCKETS],
    tick: u64,
    size: Option<usize>,
}

impl AnswerHistograms {
    /// Counts one answer in its identity's histogram, and moves the identity's count in its
    /// model's to the bucket of its size.
    pub fn count(&mut self, answer: &AnswerSample) {
        let bucket = answer.bucket.min(BUCKETS - 1);
        let own = self.counted(&answer.keys.own);
        own.counts[bucket] += 1;
        let (was, size) = (own.size, percentile_bucket(&own.counts));
        own.size = size;
        let model = self.counted(&answer.keys.model);
        if was != size {
            if let Some(was) = was {
                model.counts[was] = model.counts[was].saturating_sub(1);
            }
            if let Some(size) = size {
                model.counts[size] += 1;
            }
        }
    }

    /// The histogram `key`, counted now (made if new, room made first).
    fn counted(&mut self, key: &str) -> &mut Histogram {
        self.ticks += 1;
        if !self.kept.contains_key(key) && self.kept.len() >= MAX_HISTOGRAMS {
            let oldest = self.kept.iter().min_by_key(|(_, histogram)| histogram.tick);
            if let Some(oldest) = oldest.map(|(key, _)| key.clone()) {
                self.kept.remove(&oldest);
            }
        }
        let histogram = self.kept.entry(key.to_owned()).or_insert(Histogram {
            counts: [0; BUCKETS],
            tick: 0,
            size: None,
        });
        histogram.tick = self.ticks;
        histogram
    }

    /// The counts of a histogram, by bucket (all 0 for one never counted).
    pub fn counts(&self, key: &str) -> Vec<u64> {
        self.kept
            .get(key)
            .map_or([0; BUCKETS], |histogram| histogram.counts)
            .to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::AnswerKeys;

    fn sample(model: &str, own: &str, bucket: usize) -> AnswerSample {
        AnswerSample {
            keys: AnswerKeys {
                model: model.into(),
                own: own.into(),
            },
            bucket,
        }
    }

    #[test]
    fn an_identity_is_one_count_in_its_models_histogram_at_its_size() {
        let mut histograms = AnswerHistograms::default();
        for _ in 0..3 {
            histograms.count(&sample("m", "m:a", 9));
        }
        assert_eq!(histograms.counts("m:a")[9], 3);
        assert_eq!(histograms.counts("m")[9], 1, "one count for the identity");
        for _ in 0..40 {
            histograms.count(&sample("m", "m:a", 20));
        }
        let model = histograms.counts("m");
        assert_eq!((model[9], model[20]), (0, 1), "moved to its new size");
        histograms.count(&sample("m", "m:b", 3));
        assert_eq!(histograms.counts("m").iter().sum::<u64>(), 2);
        assert_eq!(histograms.counts("never"), vec![0; BUCKETS]);
    }

    #[test]
    fn the_histogram_counted_least_recently_goes_first() {
        let mut histograms = AnswerHistograms::default();
        histograms.count(&sample("m", "m:0", 9));
        for identity in 1..MAX_HISTOGRAMS - 1 {
            histograms.count(&sample("m", &format!("m:{identity}"), 0));
        }
        histograms.count(&sample("m", "m:0", 9)); // m:0 counted again: m:1 is now the oldest
        histograms.count(&sample("m", "one more", 0));
        assert_eq!(histograms.kept.len(), MAX_HISTOGRAMS);
        assert_eq!(histograms.counts("m:1"), vec![0; BUCKETS], "forgotten");
        assert_eq!(histograms.counts("m:0")[9], 2, "kept");
    }
}
