//! The embedded store's histograms of answer sizes, per model (what `lua/settle.lua` counts and
//! `lua/answers.lua` reads in Redis): at most `MAX_MODELS`, the one counted least recently
//! forgotten first, where Redis lets an unused one expire.

use std::collections::HashMap;

use crate::rate::answer_sizes::BUCKETS;
use crate::rate::AnswerSample;

/// Histograms kept at most.
pub const MAX_MODELS: usize = 1_024;

#[derive(Default)]
pub struct AnswerHistograms {
    /// By histogram key: the counts, and when it was last counted (a tick of `ticks`).
    kept: HashMap<String, ([u64; BUCKETS], u64)>,
    ticks: u64,
}

impl AnswerHistograms {
    /// Counts one answer.
    pub fn count(&mut self, answer: &AnswerSample) {
        self.ticks += 1;
        if !self.kept.contains_key(&answer.key) && self.kept.len() >= MAX_MODELS {
            let oldest = self.kept.iter().min_by_key(|(_, (_, tick))| *tick);
            if let Some(oldest) = oldest.map(|(key, _)| key.clone()) {
                self.kept.remove(&oldest);
            }
        }
        let (counts, tick) = self.kept.entry(answer.key.clone()).or_insert(([0; BUCKETS], 0));
        counts[answer.bucket.min(BUCKETS - 1)] += 1;
        *tick = self.ticks;
    }

    /// The counts of a histogram, by bucket (all 0 for one never counted).
    pub fn counts(&self, key: &str) -> Vec<u64> {
        self.kept
            .get(key)
            .map_or([0; BUCKETS], |(counts, _)| *counts)
            .to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(key: &str, bucket: usize) -> AnswerSample {
        AnswerSample {
            key: key.into(),
            bucket,
        }
    }

    #[test]
    fn answers_are_counted_by_bucket_and_the_least_recently_counted_model_goes_first() {
        let mut histograms = AnswerHistograms::default();
        histograms.count(&sample("m0", 9));
        histograms.count(&sample("m0", 9));
        assert_eq!(histograms.counts("m0")[9], 2);
        assert_eq!(histograms.counts("never"), vec![0; BUCKETS]);
        for model in 1..MAX_MODELS {
            histograms.count(&sample(&format!("m{model}"), 0));
        }
        histograms.count(&sample("m0", 1)); // m0 counted again: m1 is now the oldest
        histograms.count(&sample("one more", 0));
        assert_eq!(histograms.kept.len(), MAX_MODELS);
        assert_eq!(histograms.counts("m1"), vec![0; BUCKETS], "forgotten");
        assert_eq!(histograms.counts("m0")[9], 2, "kept");
    }
}
