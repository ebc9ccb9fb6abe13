//! The rate notation people already write: `"5/minute"`, `"100 per hour"`, `"10/30 seconds"`,
//! read with the rules of the `limits` package (which slowapi uses) where they overlap: a count,
//! `/` or `per`, an optional multiplier, a unit with an optional plural `s`, any case, spaces
//! around each part. A window of one day, week or month is the calendar's (UTC), as
//! `per="day"` is; a window of several days or weeks is that many seconds.

use super::Period;

/// How long a rate's window is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// A window of this many ms, wherever it starts.
    Ms(u64),
    /// From one UTC calendar boundary to the next.
    Calendar(Period),
}

/// The forms a rate is written in, for the errors.
const RATE_FORMS: &str = "write a count per window, as \"5/minute\", \"100 per hour\" or \"10/30 seconds\" (second, minute, hour, day, week or month)";

/// `"5/minute"`: the count and its window.
pub fn parse_rate(text: &str) -> Result<(u64, Window), String> {
    let unreadable = || format!("cannot read {text:?} as a rate: {RATE_FORMS}");
    let lower = text.trim().to_ascii_lowercase();
    let (count, window) = lower
        .split_once('/')
        .or_else(|| split_per(&lower))
        .ok_or_else(unreadable)?;
    let count = count.trim();
    if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
        return Err(unreadable());
    }
    let count = count.parse().map_err(|_| unreadable())?;
    let window = window_of(window, text)?.ok_or_else(unreadable)?;
    Ok((count, window))
}

/// `"minute"`, `"30 seconds"`, `"day"`: a window (`per=` as text).
pub fn parse_window(text: &str) -> Result<Window, String> {
    window_of(text, text)?.ok_or_else(|| {
        format!(
            "per={text:?} is not a window: use \"second\", \"minute\", \"hour\", \"day\", \"week\" or \"month\" (\"day\", \"week\" and \"month\" are calendar windows, UTC; with a count, \"30 seconds\"), or a number of seconds (per=30 * 86400 for 30 days)"
        )
    })
}

/// The window `text` names (None: not one; an error: one that is not kept), `whole` for errors.
fn window_of(text: &str, whole: &str) -> Result<Option<Window>, String> {
    let lower = text.trim().to_ascii_lowercase();
    let Some(unit_at) = lower.find(|c: char| !c.is_ascii_digit() && !c.is_whitespace()) else {
        return Ok(None);
    };
    let (multiplier, unit) = lower.split_at(unit_at);
    let multiplier = match multiplier.trim() {
        "" => 1,
        digits if digits.bytes().all(|b| b.is_ascii_digit()) => match digits.parse::<u64>() {
            Ok(multiplier) => multiplier,
            Err(_) => return Ok(None),
        },
        _ => return Ok(None),
    };
    let unit = unit.trim_end();
    let unit = unit.strip_suffix('s').unwrap_or(unit);
    let seconds: u64 = match unit {
        "second" => 1,
        "minute" => 60,
        "hour" => 3_600,
        "year" => {
            return Err(format!(
                "a window of years is not kept ({whole:?}): give per in seconds, per=365 * 86400"
            ))
        }
        _ => match Period::parse(unit) {
            Some(period) if multiplier == 1 => return Ok(Some(Window::Calendar(period))),
            Some(Period::Month) => {
                return Err(format!(
                    "months differ in length ({whole:?}): give per in seconds, per=60 * 86400 for 60 days"
                ))
            }
            Some(period) => period.longest_ms() / 1000,
            None => return Ok(None),
        },
    };
    if multiplier == 0 {
        return Err(format!("a window of 0 {unit}s ({whole:?}) holds nothing"));
    }
    Ok(multiplier.checked_mul(seconds * 1000).map(Window::Ms))
}

/// `"5 per minute"` split at ` per ` (spaces optional, as `limits` reads it).
fn split_per(text: &str) -> Option<(&str, &str)> {
    let at = text.find("per")?;
    Some((&text[..at], &text[at + 3..]))
}

#[cfg(test)]
#[path = "notation_tests.rs"]
mod tests;
