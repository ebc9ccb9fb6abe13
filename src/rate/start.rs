//! A stream's start against rate policies: which policies it is checked against and what it
//! takes from each, and, while Redis is down under `failure_mode="open"`, this process's share
//! of each. Pure rules; the manager pairs them with keys and stores (`manager/rate.rs`).

use super::price::{units_of, Price, Usage};
use super::{check_costs, Decision, HitOutcome, RatePolicy, Unit};

/// What a budgeted start reserves: its token budgets, its estimate of the prompt's and the
/// answer's tokens, and the model's price for its cost budgets.
#[derive(Debug, Clone, Copy)]
pub struct Reservation<'a> {
    pub budgets: &'a [RatePolicy],
    pub input: u64,
    pub output: u64,
    pub price: Option<Price>,
}

/// A reservation more than a budget's whole limit: no window could ever hold it, so retrying
/// cannot help (unlike a budget with too little left now, which refuses with a retry time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLarge {
    /// The budget that could never hold it.
    pub budget: RatePolicy,
    /// What it would take from that budget, in the budget's unit.
    pub units: u64,
    /// The prompt's and the answer's tokens reserved.
    pub input: u64,
    pub output: u64,
}

/// Why a start's costs could not be set: a call that cannot work as written (`Invalid`: the
/// message says what to change), or a reservation no budget window could ever hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartError {
    Invalid(String),
    TooLarge(TooLarge),
}

impl From<String> for StartError {
    fn from(message: String) -> Self {
        StartError::Invalid(message)
    }
}

/// The policies a start is checked against, in order (its request rates, then its budgets), and
/// what it takes from each: one unit of every request rate, and from every budget its
/// reservation counted in the budget's unit. An error says what was passed where, and where it
/// belongs, or which budget the reservation is larger than.
pub fn start_costs(
    rate_limits: Vec<RatePolicy>,
    reservation: Option<Reservation<'_>>,
) -> Result<(Vec<RatePolicy>, Vec<u64>), StartError> {
    if let Some(policy) = rate_limits.iter().find(|p| p.unit != Unit::Requests) {
        return Err(StartError::Invalid(format!(
            "rate limit {:?} counts {}: pass it in budgets=, where a stream reserves and is charged its tokens",
            &*policy.name,
            policy.unit.name()
        )));
    }
    let budgets = reservation.map_or(&[][..], |r| r.budgets);
    if let Some(policy) = budgets.iter().find(|p| p.unit == Unit::Requests) {
        return Err(StartError::Invalid(format!(
            "budget {:?} counts requests: a budget counts tokens, RateLimit({:?}, {}, per=..., unit=\"tokens\") (or \"input_tokens\", \"output_tokens\"); pass request rates in rate_limits=",
            &*policy.name, &*policy.name, policy.limit
        )));
    }
    if reservation.is_some_and(|r| r.budgets.is_empty()) {
        return Err(StartError::Invalid(
            "reserve= and on_budget= need budgets=[RateLimit(..., unit=\"tokens\"), ...]".into(),
        ));
    }
    if let Some(policy) = budgets.iter().find(|p| p.unit == Unit::Cost) {
        if reservation.is_some_and(|r| r.price.is_none()) {
            return Err(StartError::Invalid(format!(
                "budget {:?} counts cost: name the model and its prices, acquire(..., model=\"gpt-x\", prices=Prices({{\"gpt-x\": (input, output, cached_input)}})) (or StreamLeaseManager(..., prices=...))",
                &*policy.name
            )));
        }
    }
    let mut costs = vec![1; rate_limits.len()];
    if let Some(r) = reservation {
        let usage = Usage {
            input: r.input,
            cached_input: 0,
            output: r.output,
        };
        costs.extend(
            r.budgets
                .iter()
                .map(|p| units_of(p.unit, r.price.as_ref(), usage)),
        );
        let mut reserved = r.budgets.iter().zip(&costs[rate_limits.len()..]);
        if let Some((policy, units)) = reserved.find(|(p, units)| **units > p.limit) {
            return Err(StartError::TooLarge(TooLarge {
                budget: policy.clone(),
                units: *units,
                input: r.input,
                output: r.output,
            }));
        }
    }
    let policies: Vec<RatePolicy> = rate_limits.into_iter().chain(budgets.iter().cloned()).collect();
    if !policies.is_empty() {
        check_costs(&policies, &costs, "reserve")?;
    }
    Ok((policies, costs))
}

/// This process's share of each policy while Redis is down: its limit divided among `workers`,
/// rounded down (as every share of the local floor), so the shares add up to at most the limit.
/// A share too small for its cost (`costs[i]` of `policies[i]`; a share of 0 allows nothing)
/// refuses the whole start, with a retry after `retry_ms`, unless its policy is a dry run.
pub fn local_shares(
    policies: &[RatePolicy],
    costs: &[u64],
    workers: u64,
    retry_ms: u64,
) -> Result<Vec<RatePolicy>, HitOutcome> {
    let shares: Vec<RatePolicy> = policies
        .iter()
        .map(|policy| RatePolicy {
            limit: policy.limit / workers,
            ..policy.clone()
        })
        .collect();
    match shares
        .iter()
        .zip(costs)
        .position(|(share, cost)| share.enforce && share.limit < (*cost).max(1))
    {
        None => Ok(shares),
        Some(empty) => Err(HitOutcome {
            decisions: shares
                .into_iter()
                .map(|policy| Decision::new(policy, 0, 0, None))
                .collect(),
            refused: Some((empty, retry_ms)),
            ahead: Vec::new(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::super::policy::tests::{budget, policy};
    use super::*;

    /// The message of a start refused as invalid.
    fn invalid(result: Result<(Vec<RatePolicy>, Vec<u64>), StartError>) -> String {
        match result {
            Err(StartError::Invalid(message)) => message,
            other => panic!("expected an invalid start, got {other:?}"),
        }
    }

    fn reserving(budgets: &[RatePolicy], input: u64, output: u64) -> Option<Reservation<'_>> {
        Some(Reservation {
            budgets,
            input,
            output,
            price: None,
        })
    }

    #[test]
    fn a_start_takes_one_unit_of_each_rate_and_its_reservation_in_each_budgets_unit() {
        let budgets = [
            budget("all", 10_000, Unit::Tokens),
            budget("prompts", 10_000, Unit::InputTokens),
            budget("answers", 10_000, Unit::OutputTokens),
        ];
        let (policies, costs) =
            start_costs(vec![policy("starts", 5)], reserving(&budgets, 120, 800)).unwrap();
        let names: Vec<&str> = policies.iter().map(|p| &*p.name).collect();
        assert_eq!(names, ["starts", "all", "prompts", "answers"]);
        assert_eq!(costs, [1, 920, 120, 800]);
    }

    #[test]
    fn a_start_without_policies_is_checked_against_none() {
        assert_eq!(start_costs(Vec::new(), None).unwrap(), (Vec::new(), Vec::new()));
    }

    #[test]
    fn a_policy_in_the_wrong_list_is_refused_with_where_it_belongs() {
        let tokens = budget("tpm", 10_000, Unit::Tokens);
        let err = invalid(start_costs(vec![tokens], None));
        assert!(err.contains("counts tokens: pass it in budgets="), "{err}");
        let requests = [policy("rpm", 60)];
        let err = invalid(start_costs(Vec::new(), reserving(&requests, 0, 100)));
        assert!(err.contains("counts requests: a budget counts tokens"), "{err}");
        let err = invalid(start_costs(Vec::new(), reserving(&[], 0, 100)));
        assert!(err.contains("reserve= and on_budget= need budgets="), "{err}");
    }

    #[test]
    fn a_reservation_above_a_budgets_whole_limit_is_too_large_not_invalid() {
        let budgets = [budget("tpm", 1_000, Unit::Tokens)];
        match start_costs(Vec::new(), reserving(&budgets, 1, 1_000)) {
            Err(StartError::TooLarge(t)) => assert_eq!((&*t.budget.name, t.units), ("tpm", 1_001)),
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert!(start_costs(Vec::new(), reserving(&budgets, 0, 1_000)).is_ok());
    }

    #[test]
    fn local_shares_round_down_so_that_all_workers_stay_within_the_limit() {
        let shares = local_shares(&[policy("starts", 10)], &[1], 4, 1_000).unwrap();
        assert_eq!(shares[0].limit, 2);
        assert!(shares[0].limit * 4 <= 10);
    }

    #[test]
    fn a_share_too_small_for_its_cost_refuses_the_whole_start() {
        let policies = [policy("starts", 10), budget("tpm", 1_000, Unit::Tokens)];
        let refused = local_shares(&policies, &[1, 300], 4, 1_000).unwrap_err();
        assert_eq!(refused.refused, Some((1, 1_000)));
        let limits: Vec<u64> = refused.decisions.iter().map(|d| d.policy.limit).collect();
        assert_eq!(limits, [2, 250]);
        let empty = local_shares(&[policy("starts", 3)], &[1], 4, 500).unwrap_err();
        assert_eq!(empty.refused, Some((0, 500)), "a share of 0 allows nothing");
    }

    #[test]
    fn a_dry_runs_share_too_small_for_its_cost_refuses_nothing() {
        let dry = policy("starts", 3).enforcing(false).unwrap();
        let shares = local_shares(&[dry], &[1], 4, 500).expect("a dry run never refuses");
        assert_eq!((shares[0].limit, shares[0].enforce), (0, false));
    }

    #[test]
    fn a_cost_budget_reserves_the_price_of_the_prompt_and_the_answer_and_needs_a_price() {
        let budgets = [
            budget("tokens", 10_000, Unit::Tokens),
            budget("spend", 1_000, Unit::Cost),
        ];
        let err = invalid(start_costs(Vec::new(), reserving(&budgets, 1_000, 800)));
        assert!(
            err.contains("budget \"spend\" counts cost") && err.contains("prices="),
            "{err}"
        );
        let priced = Reservation {
            price: Some(Price::new(150_000, 600_000, 0).unwrap()),
            ..reserving(&budgets, 1_000, 800).unwrap()
        };
        let (_, costs) = start_costs(Vec::new(), Some(priced)).unwrap();
        // 1,000 * 0.15 + 800 * 0.6 units.
        assert_eq!(costs, [1_800, 630]);
        let too_dear = Reservation {
            output: 2_000,
            ..priced
        };
        match start_costs(Vec::new(), Some(too_dear)) {
            Err(StartError::TooLarge(t)) => assert_eq!((&*t.budget.name, t.units), ("spend", 1_350)),
            other => panic!("expected TooLarge, got {other:?}"),
        }
    }
}
