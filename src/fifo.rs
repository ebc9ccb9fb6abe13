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

    pub fn get(&self, place: P) -> Option<&V> {
        self.by_place.get(&place)
    }

    /// The values before `place`, in order (all of them for None).
    pub fn before(&self, place: Option<P>) -> impl Iterator<Item = &V> {
        let upto = place.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        self.by_place
            .range((std::ops::Bound::Unbounded, upto))
            .map(|(_, value)| value)
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
        assert_eq!((line.before(None).next(), line.len()), (Some(&"a"), 3));
        assert_eq!(line.before(Some((7, 3))).collect::<Vec<_>>(), [&"a", &"b"]);
        assert_eq!(line.before(None).count(), 3);
        assert_eq!(line.remove((3, 2)), Some("a"));
        assert_eq!(line.before(None).next(), Some(&"b"));
    }
}
