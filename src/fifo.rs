//! First come, first served: the order of the embedded store's line and of this process's
//! waiters in the shared line (lower places are earlier).

use std::collections::BTreeMap;

/// Values in order of their place `P` (a ticket, or a ticket and a tie-breaker).
pub struct Fifo<P, V> {
    by_place: BTreeMap<P, V>,
}

impl<P, V> Default for Fifo<P, V> {
    fn default() -> Self {
        Fifo {
            by_place: BTreeMap::new(),
        }
    }
}

impl<P: Ord + Copy, V> Fifo<P, V> {
    pub fn insert(&mut self, place: P, value: V) {
        self.by_place.insert(place, value);
    }

    pub fn remove(&mut self, place: P) -> Option<V> {
        self.by_place.remove(&place)
    }

    pub fn first(&self) -> Option<(P, &V)> {
        self.by_place
            .first_key_value()
            .map(|(place, value)| (*place, value))
    }

    /// How many wait before `place`.
    pub fn ahead_of(&self, place: P) -> usize {
        self.by_place.range(..place).count()
    }

    pub fn len(&self) -> usize {
        self.by_place.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_keep_arrival_order() {
        let mut line = Fifo::default();
        line.insert((7, 1), "b");
        line.insert((3, 2), "a");
        line.insert((7, 3), "same ticket, later arrival");
        assert_eq!(
            (line.first(), line.ahead_of((7, 3)), line.len()),
            (Some(((3, 2), &"a")), 2, 3)
        );
        assert_eq!(line.remove((3, 2)), Some("a"));
        assert_eq!(line.first(), Some(((7, 1), &"b")));
    }
}
