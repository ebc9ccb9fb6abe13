//! Answer sizes learned from settled streams, per identity and model, so that one identity's
//! answers never size another's reservations. Each identity has a histogram of its own answers'
//! tokens in `BUCKETS` log-spaced buckets (a small hash in Redis, `lua/settle.lua`; a map in the
//! embedded store); its **size** is the bucket that holds its `PERCENTILE`th answer. The model's
//! histogram holds **one count per identity**, at that identity's size: the prior. A stream's
//! reservation is the upper bound of its identity's size once the identity has `MIN_SAMPLES`
//! answers; before that, the bound of the prior's `PERCENTILE`th identity once `MIN_SAMPLES`
//! identities have answered; before that, the default. So an identity moves the prior by at
//! most one rank among the others' sizes, whatever its answers. Pure: the bucket of a size is
//! computed here only, and passed to the scripts as a number.

/// Buckets per model: a fixed count, so a model's histogram never grows past them.
pub const BUCKETS: usize = 32;

/// The percentile of answer sizes a learned reservation covers.
pub const PERCENTILE: u64 = 95;

/// Answers an identity needs before its own estimate is used, and identities the model's prior
/// needs before it replaces the default.
pub const MIN_SAMPLES: u64 = 20;

/// Each bucket's upper bound in answer tokens (inclusive): 16, then each 1.43 times the last,
/// rounded up, to 1,096,331 (the last takes every larger answer too).
pub const BOUNDS: [u64; BUCKETS] = {
    let mut bounds = [16u64; BUCKETS];
    let mut i = 1;
    while i < BUCKETS {
        bounds[i] = (bounds[i - 1] * 143).div_ceil(100);
        i += 1;
    }
    bounds
};

/// The bucket of an answer of `tokens` tokens: the first whose bound holds it.
pub fn bucket_of(tokens: u64) -> usize {
    BOUNDS.partition_point(|&bound| bound < tokens).min(BUCKETS - 1)
}

/// The learned answer size of a histogram (`counts[i]`: the answers in bucket `i`): the bound
/// of the bucket that holds the `PERCENTILE`th answer, or None below `MIN_SAMPLES` answers.
pub fn estimate(counts: &[u64]) -> Option<u64> {
    let total: u64 = counts.iter().sum();
    if total < MIN_SAMPLES {
        return None;
    }
    percentile_bucket(counts).map(|bucket| BOUNDS[bucket])
}

/// The bucket that holds the `PERCENTILE`th answer of a histogram (nearest rank), None for an
/// empty one: an identity's size, its one count in its model's histogram (`lua/settle.lua`
/// finds it the same way).
pub fn percentile_bucket(counts: &[u64]) -> Option<usize> {
    let total: u128 = counts.iter().map(|&count| u128::from(count)).sum();
    if total == 0 {
        return None;
    }
    // The rank of the percentile's answer, counted from 1 (nearest rank).
    let rank = (total * u128::from(PERCENTILE)).div_ceil(100);
    let mut seen = 0u128;
    for (bucket, &count) in counts.iter().enumerate().take(BUCKETS) {
        seen += u128::from(count);
        if seen >= rank {
            return Some(bucket);
        }
    }
    Some(BUCKETS - 1)
}

/// The answer size a stream of an identity reserves, from its own histogram and its model's:
/// its own estimate, else the model's, else None (the default).
pub fn learned(own: &[u64], model: &[u64]) -> Option<u64> {
    estimate(own).or_else(|| estimate(model))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buckets_grow_by_1_43_from_16_to_about_a_million() {
        assert_eq!(BOUNDS[..10], [16, 23, 33, 48, 69, 99, 142, 204, 292, 418]);
        assert_eq!(BOUNDS[BUCKETS - 1], 1_096_331);
        assert!(BOUNDS.windows(2).all(|pair| pair[1] * 100 >= pair[0] * 143));
    }

    #[test]
    fn an_answer_falls_in_the_first_bucket_whose_bound_holds_it() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(16), 0);
        assert_eq!(bucket_of(17), 1);
        assert_eq!(bucket_of(300), 9, "292 < 300 <= 418");
        assert_eq!(bucket_of(418), 9);
        assert_eq!(bucket_of(419), 10);
        assert_eq!(
            bucket_of(u64::MAX),
            BUCKETS - 1,
            "the last bucket takes every larger answer"
        );
    }

    #[test]
    fn below_the_minimum_of_samples_there_is_no_estimate() {
        let mut counts = [0; BUCKETS];
        counts[bucket_of(300)] = MIN_SAMPLES - 1;
        assert_eq!(estimate(&counts), None);
        counts[bucket_of(300)] += 1;
        assert_eq!(estimate(&counts), Some(418));
        assert_eq!(estimate(&[]), None);
    }

    #[test]
    fn an_identity_is_sized_by_its_own_answers_once_it_has_20_else_by_the_models() {
        let mut own = [0; BUCKETS];
        let mut model = [0; BUCKETS];
        assert_eq!(learned(&own, &model), None, "the default");
        model[bucket_of(300)] = MIN_SAMPLES;
        assert_eq!(learned(&own, &model), Some(418));
        own[bucket_of(8_000)] = MIN_SAMPLES - 1;
        assert_eq!(
            learned(&own, &model),
            Some(418),
            "19 answers of its own are too few"
        );
        own[bucket_of(8_000)] += 1;
        assert_eq!(learned(&own, &model), Some(BOUNDS[bucket_of(8_000)]));
        assert_eq!(percentile_bucket(&[0; BUCKETS]), None);
        assert_eq!(percentile_bucket(&own), Some(bucket_of(8_000)));
    }

    #[test]
    fn the_estimate_is_the_bound_of_the_bucket_of_the_95th_percentile() {
        let mut counts = [0; BUCKETS];
        // 95 short answers and 5 long ones: the 95th of 100 is still short.
        counts[bucket_of(100)] = 95;
        counts[bucket_of(5_000)] = 5;
        assert_eq!(estimate(&counts), Some(142));
        // One more long answer puts the 96th-ranked (ceil of 95 % of 101) among the long ones.
        counts[bucket_of(5_000)] = 6;
        assert_eq!(estimate(&counts), Some(BOUNDS[bucket_of(5_000)]));
        let mut huge = [0; BUCKETS];
        huge[BUCKETS - 1] = u64::MAX;
        assert_eq!(estimate(&huge), Some(BOUNDS[BUCKETS - 1]), "no overflow");
    }
}
