//! Money budgets (`unit="cost"`): a model's prices and the arithmetic that turns a stream's
//! tokens into the budget's unit. Pure: no I/O.
//!
//! A stream's charge is the ceiling of its whole cost, never a ceiling per chunk (which would
//! overcharge a stream of many small chunks): the answer's tokens are priced at their place in
//! the stream, after the prompt, so the units of the tokens up to any point add up to the
//! ceiling of the cost up to there (`answer_units`). A top-up grants a whole number of tokens;
//! what it reserves for them is rounded up (`units_for`), a unit at most above their cost, and
//! given back at settlement like any reservation not used.

use super::{Unit, MAX_LIMIT};

/// Prices are per this many tokens.
pub const PER_TOKENS: u64 = 1_000_000;

/// Largest price per million tokens: a charge of `MAX_LIMIT` units then stays within what a
/// Lua number holds exactly (`lua/topup.lua` prices the tokens a top-up grants).
pub const MAX_PRICE: u64 = 1_000_000_000;

/// A model's prices, in the budget's unit (cents, microdollars: an integer the app chooses)
/// per million tokens: the prompt's, the answer's, and the prompt's tokens read from the
/// provider's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Price {
    pub input: u64,
    pub output: u64,
    pub cached_input: u64,
}

/// A stream's tokens: the prompt's (`cached_input` of them read from the cache, OpenAI's
/// `prompt_tokens_details.cached_tokens`) and the answer's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub cached_input: u64,
    pub output: u64,
}

impl Price {
    /// Checks each price is within `0..=MAX_PRICE`.
    pub fn new(input: u64, output: u64, cached_input: u64) -> Result<Self, String> {
        for (name, price) in [
            ("input", input),
            ("output", output),
            ("cached_input", cached_input),
        ] {
            if price > MAX_PRICE {
                return Err(format!(
                    "{name} price {price} per million tokens is out of range: use 0 to {MAX_PRICE} (choose a larger unit)"
                ));
            }
        }
        Ok(Price {
            input,
            output,
            cached_input,
        })
    }

    /// The prompt's cost in millionths of a unit.
    fn prompt_millionths(&self, input: u64, cached_input: u64) -> u128 {
        let cached = cached_input.min(input);
        u128::from(input - cached) * u128::from(self.input)
            + u128::from(cached) * u128::from(self.cached_input)
    }

    /// Units of the whole stream: the ceiling of its cost.
    pub fn cost(&self, usage: Usage) -> u64 {
        let millionths = self.prompt_millionths(usage.input, usage.cached_input)
            + u128::from(usage.output) * u128::from(self.output);
        ceil_units(millionths)
    }

    /// Units of the answer's tokens from `from` to `to` (counted from the answer's start), after
    /// a prompt of `input` tokens: the ceiling of the cost up to `to` less that up to `from`.
    pub fn answer_units(&self, input: u64, from: u64, to: u64) -> u64 {
        let prompt = self.prompt_millionths(input, 0);
        let upto = |tokens: u64| ceil_units(prompt + u128::from(tokens) * u128::from(self.output));
        upto(to.max(from)) - upto(from)
    }
}

/// What a budget of `unit` counts of `usage`: its tokens, or for a cost budget their price.
pub fn units_of(unit: Unit, price: Option<&Price>, usage: Usage) -> u64 {
    match (unit, price) {
        (Unit::Cost, Some(price)) => price.cost(usage),
        _ => unit.of(usage.input, usage.output),
    }
}

/// Units per million answer tokens of a budget of `unit` (a million for a token budget).
pub fn answer_price(unit: Unit, price: Option<&Price>) -> u64 {
    match (unit, price) {
        (Unit::Cost, Some(price)) => price.output,
        _ => PER_TOKENS,
    }
}

/// Units reserved for `tokens` answer tokens at `per_million` units per million, rounded up
/// (as `lua/topup.lua`'s `units_for`).
pub fn units_for(tokens: u64, per_million: u64) -> u64 {
    if per_million == PER_TOKENS {
        return tokens;
    }
    ceil_units(u128::from(tokens) * u128::from(per_million))
}

/// The most answer tokens `units` pay for at `per_million` units per million (`MAX_LIMIT` when
/// they are free), as `lua/topup.lua`'s `tokens_within`.
pub fn tokens_within(units: u64, per_million: u64) -> u64 {
    match per_million {
        PER_TOKENS => units,
        0 => MAX_LIMIT,
        price => {
            let tokens = u128::from(units) * u128::from(PER_TOKENS) / u128::from(price);
            tokens.min(u128::from(MAX_LIMIT)) as u64
        }
    }
}

/// The most answer tokens a budget of `unit` and `limit` holds after a prompt of `input`
/// tokens (none when the prompt alone is more than the limit; `MAX_LIMIT` when it does not
/// count answer tokens).
pub fn answer_room(unit: Unit, limit: u64, price: Option<&Price>, input: u64) -> u64 {
    if unit.of(0, 1) == 0 && unit != Unit::Cost {
        return MAX_LIMIT;
    }
    let prompt = units_of(
        unit,
        price,
        Usage {
            input,
            ..Usage::default()
        },
    );
    tokens_within(limit.saturating_sub(prompt), answer_price(unit, price))
}

fn ceil_units(millionths: u128) -> u64 {
    let units = millionths.div_ceil(u128::from(PER_TOKENS));
    u64::try_from(units).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 3 units per prompt token, 15 per answer token, 0.3 per cached prompt token.
    const PRICE: Price = Price {
        input: 3_000_000,
        output: 15_000_000,
        cached_input: 300_000,
    };

    #[test]
    fn a_stream_costs_the_ceiling_of_its_whole_cost() {
        let usage = |input, cached_input, output| Usage {
            input,
            cached_input,
            output,
        };
        assert_eq!(PRICE.cost(usage(1_000_000, 0, 0)), 3_000_000);
        assert_eq!(PRICE.cost(usage(1, 0, 0)), 3, "3 units a token");
        let cheap = Price::new(150_000, 600_000, 75_000).unwrap();
        assert_eq!(cheap.cost(usage(1, 0, 0)), 1, "0.15 units rounds up to 1");
        assert_eq!(cheap.cost(usage(10, 0, 10)), 8, "1.5 + 6 = 7.5 rounds up once");
        assert_eq!(
            cheap.cost(usage(1_000_000, 1_000_000, 0)),
            75_000,
            "cached prompt tokens at the cached price"
        );
        assert_eq!(
            cheap.cost(usage(100, 400, 0)),
            8,
            "no more cached tokens than the prompt's"
        );
    }

    #[test]
    fn the_answer_priced_piece_by_piece_adds_up_to_the_ceiling_of_its_cost() {
        let cheap = Price::new(150_000, 600_000, 0).unwrap();
        let whole = cheap.cost(Usage {
            input: 10,
            cached_input: 0,
            output: 1_000,
        });
        let prompt = cheap.cost(Usage {
            input: 10,
            ..Usage::default()
        });
        let pieces: u64 = (0..1_000).map(|t| cheap.answer_units(10, t, t + 1)).sum();
        // 10 * 0.15 + 1,000 * 0.6 = 601.5 units: 602, where a ceiling per token would be 1,002.
        assert_eq!((prompt, pieces, whole), (2, 600, 602));
        assert_eq!(prompt + pieces, whole);
    }

    #[test]
    fn a_top_up_reserves_whole_units_and_units_buy_whole_tokens() {
        assert_eq!(units_for(256, PER_TOKENS), 256, "a token budget counts tokens");
        assert_eq!(units_for(256, 600_000), 154, "153.6 units rounds up");
        assert_eq!(units_for(1, 600_000), 1, "0.6 units rounds up");
        assert_eq!(units_for(0, 600_000), 0);
        assert_eq!(tokens_within(1, 600_000), 1, "0.6 units a token");
        assert_eq!(tokens_within(1, 600), 1_666);
        assert_eq!(units_for(tokens_within(7, 600_000), 600_000), 7);
        assert_eq!(tokens_within(5, 0), MAX_LIMIT, "free tokens never run out");
        assert_eq!(tokens_within(5, PER_TOKENS), 5);
    }

    #[test]
    fn the_answers_room_is_what_the_limit_holds_after_the_prompt() {
        assert_eq!(answer_room(Unit::Tokens, 600, None, 100), 500);
        assert_eq!(
            answer_room(Unit::InputTokens, 600, None, 100),
            MAX_LIMIT,
            "answers are free"
        );
        assert_eq!(answer_room(Unit::OutputTokens, 600, None, 100), 600);
        assert_eq!(answer_room(Unit::Tokens, 600, None, 700), 0);
        let cheap = Price::new(150_000, 600_000, 0).unwrap();
        // 10 prompt tokens cost 1.5 units, 2 rounded up; 98 units buy 163 answer tokens.
        assert_eq!(answer_room(Unit::Cost, 100, Some(&cheap), 10), 163);
    }

    #[test]
    fn a_price_above_the_bound_is_refused_saying_which() {
        let refused = Price::new(0, MAX_PRICE + 1, 0).unwrap_err();
        assert!(refused.contains("output price"), "{refused}");
    }
}
