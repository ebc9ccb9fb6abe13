//! A circuit breaker in front of Redis: after a failure, calls stop going to a dead server (each
//! would cost the full timeout) until a cool-down passes; then one probe goes through, and its
//! outcome closes the breaker or reopens it for twice as long (up to a bound).

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::errors::CoreResult;

const FIRST_COOL_DOWN: Duration = Duration::from_millis(500);
const MAX_COOL_DOWN: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Closed,
    Open {
        until: Instant,
        cool_down: Duration,
    },
    /// The cool-down passed and one probe is out; its cool-down doubles if it fails. A probe
    /// that never reports (cancelled) lets another go after the same cool-down.
    Probing {
        cool_down: Duration,
        next_probe: Instant,
    },
}

#[derive(Debug)]
pub struct Breaker {
    state: Mutex<State>,
}

/// Whether a call may go to Redis now.
#[derive(Debug, PartialEq)]
pub enum Permit {
    Go,
    /// The breaker is open: don't call; it closes again in this long at the earliest.
    Wait(Duration),
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            state: Mutex::new(State::Closed),
        }
    }
}

impl Breaker {
    pub fn admit(&self) -> Permit {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match *state {
            State::Closed => Permit::Go,
            State::Open {
                until: next_probe,
                cool_down,
            }
            | State::Probing {
                cool_down,
                next_probe,
            } => {
                let now = Instant::now();
                if now >= next_probe {
                    *state = State::Probing {
                        cool_down,
                        next_probe: now + cool_down,
                    };
                    Permit::Go
                } else {
                    Permit::Wait(next_probe - now)
                }
            }
        }
    }

    fn succeeded(&self) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = State::Closed;
    }

    /// Redis was unreachable or too slow: open, for longer each time a probe fails.
    fn failed(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let cool_down = match *state {
            State::Closed => FIRST_COOL_DOWN,
            State::Open { cool_down, .. } => cool_down,
            State::Probing { cool_down, .. } => (cool_down * 2).min(MAX_COOL_DOWN),
        };
        *state = State::Open {
            until: Instant::now() + cool_down,
            cool_down,
        };
    }

    /// Feeds the breaker with the outcome of a call to Redis: any answer, even an error reply,
    /// means the server is there.
    pub fn observe<T>(&self, outcome: &CoreResult<T>) {
        match outcome {
            Err(error) if error.is_unavailable() => self.failed(),
            _ => self.succeeded(),
        }
    }

    pub fn is_open(&self) -> bool {
        !matches!(
            *self.state.lock().unwrap_or_else(PoisonError::into_inner),
            State::Closed
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_on_failure_probes_once_and_backs_off() {
        let breaker = Breaker::default();
        assert_eq!(breaker.admit(), Permit::Go);
        breaker.failed();
        assert!(matches!(breaker.admit(), Permit::Wait(_)));
        // Let the cool-down pass without sleeping.
        *breaker.state.lock().unwrap() = State::Open {
            until: Instant::now(),
            cool_down: FIRST_COOL_DOWN,
        };
        assert_eq!(breaker.admit(), Permit::Go, "one probe");
        assert!(matches!(breaker.admit(), Permit::Wait(_)), "only one");
        breaker.failed();
        let State::Open { cool_down, .. } = *breaker.state.lock().unwrap() else {
            panic!()
        };
        assert_eq!(cool_down, FIRST_COOL_DOWN * 2);
        breaker.succeeded();
        assert_eq!(breaker.admit(), Permit::Go);
        assert!(!breaker.is_open());
    }
}
