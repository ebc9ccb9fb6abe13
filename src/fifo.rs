//! First come, first served by ticket: the order of the embedded store's line and of this
//! process's waiters in the shared line (lower tickets are earlier).

use std::collections::BTreeMap;

pub struct Fifo<V> {
    by_ticket: BTreeMap<u64, V>,
    last_ticket: u64,
}

impl<V> Default for Fifo<V> {
    fn default() -> Self {
        Fifo {
            by_ticket: BTreeMap::new(),
            last_ticket: 0,
        }
    }
}

impl<V> Fifo<V> {
    /// Lines `value` up behind everyone; returns its ticket.
    pub fn push(&mut self, value: V) -> u64 {
        self.last_ticket += 1;
        self.by_ticket.insert(self.last_ticket, value);
        self.last_ticket
    }

    /// Lines `value` up at a ticket given elsewhere (the shared line's).
    pub fn insert(&mut self, ticket: u64, value: V) {
        self.by_ticket.insert(ticket, value);
    }

    pub fn remove(&mut self, ticket: u64) -> Option<V> {
        self.by_ticket.remove(&ticket)
    }

    pub fn first(&self) -> Option<(u64, &V)> {
        self.by_ticket
            .first_key_value()
            .map(|(ticket, value)| (*ticket, value))
    }

    /// How many wait before `ticket`.
    pub fn ahead_of(&self, ticket: u64) -> usize {
        self.by_ticket.range(..ticket).count()
    }

    pub fn len(&self) -> usize {
        self.by_ticket.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_keep_arrival_order() {
        let mut line = Fifo::default();
        let (a, b) = (line.push("a"), line.push("b"));
        line.insert(10, "late");
        assert_eq!(
            (line.first(), line.ahead_of(b), line.len()),
            (Some((a, &"a")), 1, 3)
        );
        assert_eq!(line.remove(a), Some("a"));
        assert_eq!(line.first(), Some((b, &"b")));
        assert_eq!(line.ahead_of(10), 1);
    }
}
