//! Threshold alerts: the fractions of a policy's limit at which an identity's use of it is
//! told, each once per window across every worker (`lua/prelude/rates.lua`'s `told_first`; one
//! process: `backend/memory/rate.rs`).

use std::sync::Arc;

/// Most thresholds one manager alerts at: each is a bit of a policy's flags in a script's reply.
pub const MAX_THRESHOLDS: usize = 16;
/// A threshold is kept in millionths of a limit, so a policy compares and hashes as a value.
const PARTS: u64 = 1_000_000;

/// The thresholds a policy's use is told at (`alert_at`), in millionths of its limit,
/// ascending; empty when nobody listens.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Thresholds(Arc<[u64]>);

impl Thresholds {
    /// From fractions of a limit (each above 0, at most `MAX_THRESHOLDS`), to a millionth.
    pub fn new(fractions: &[f64]) -> Result<Self, String> {
        if fractions.len() > MAX_THRESHOLDS {
            return Err(format!(
                "alert_at holds at most {MAX_THRESHOLDS} fractions, got {}",
                fractions.len()
            ));
        }
        let mut parts = Vec::with_capacity(fractions.len());
        for fraction in fractions {
            if !(fraction.is_finite() && *fraction > 0.0 && *fraction <= MAX_FRACTION) {
                return Err(format!(
                    "alert_at fractions must be above 0 and at most {MAX_FRACTION} (1.0 is the limit), got {fraction}"
                ));
            }
            parts.push(((fraction * PARTS as f64).round() as u64).max(1));
        }
        parts.sort_unstable();
        parts.dedup();
        Ok(Thresholds(parts.into()))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The units of use of `limit` at which each threshold is reached, rounded up (0.8 of 9
    /// units is reached at 8), in order.
    pub fn marks(&self, limit: u64) -> impl Iterator<Item = u64> + '_ {
        self.0
            .iter()
            .map(move |parts| ((*parts as u128 * limit as u128).div_ceil(PARTS as u128)) as u64)
    }

    /// The thresholds as fractions of a limit, ascending.
    pub fn fractions(&self) -> Vec<f64> {
        self.of_bits(u64::MAX)
    }

    /// The thresholds whose bits are set in `told` (bit 0: the first), as fractions.
    pub fn of_bits(&self, told: u64) -> Vec<f64> {
        self.0
            .iter()
            .enumerate()
            .filter(|(i, _)| told >> i & 1 == 1)
            .map(|(_, parts)| *parts as f64 / PARTS as f64)
            .collect()
    }
}

/// Largest threshold: a hundred times the limit (a dry run counts past its limit).
const MAX_FRACTION: f64 = 100.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_round_up_to_whole_units_and_come_in_order() {
        let thresholds = Thresholds::new(&[1.0, 0.8, 0.8, 0.7]).expect("thresholds");
        assert_eq!(thresholds.marks(10).collect::<Vec<_>>(), [7, 8, 10]);
        assert_eq!(thresholds.marks(9).collect::<Vec<_>>(), [7, 8, 9]);
        assert_eq!(thresholds.marks(1).collect::<Vec<_>>(), [1, 1, 1]);
        assert_eq!(thresholds.of_bits(0b101), [0.7, 1.0]);
        assert_eq!(thresholds.fractions(), [0.7, 0.8, 1.0]);
        let fine = Thresholds::new(&[0.123_456_7]).expect("a threshold");
        assert_eq!(fine.of_bits(1), [0.123_457], "kept to a millionth");
    }

    #[test]
    fn thresholds_out_of_range_or_too_many_are_refused() {
        for bad in [
            &[0.0][..],
            &[-1.0],
            &[f64::NAN],
            &[f64::INFINITY],
            &[101.0],
            &[0.5; 17],
        ] {
            assert!(Thresholds::new(bad).is_err(), "{bad:?}");
        }
    }
}
