//! Calendar windows: a fixed window that starts and ends at a UTC calendar boundary (a day at
//! midnight, an ISO week on Monday at midnight, a month on the 1st at midnight). The same
//! arithmetic runs in `lua/prelude/rates.lua` on the server's clock; both use Howard Hinnant's
//! `days_from_civil` / `civil_from_days` (proleptic Gregorian calendar, leap years included).

const DAY_MS: i64 = 86_400_000;

/// The calendar unit of a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Period {
    Day,
    Week,
    Month,
}

impl Period {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "day" => Some(Period::Day),
            "week" => Some(Period::Week),
            "month" => Some(Period::Month),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
        }
    }

    /// Its code in the scripts' arguments and in keys (a fixed window's is "f").
    pub fn code(self) -> &'static str {
        match self {
            Period::Day => "d",
            Period::Week => "w",
            Period::Month => "m",
        }
    }

    /// The longest such window, in ms (a month of 31 days).
    pub fn longest_ms(self) -> u64 {
        match self {
            Period::Day => 86_400_000,
            Period::Week => 7 * 86_400_000,
            Period::Month => 31 * 86_400_000,
        }
    }

    /// The first boundary after `unix_ms` (ms since 1970-01-01 00:00 UTC), in the same ms.
    pub fn next_boundary(self, unix_ms: u64) -> u64 {
        let days = (unix_ms as i64).div_euclid(DAY_MS);
        let next_day = match self {
            Period::Day => days + 1,
            // 1970-01-01 was a Thursday: days + 3 counts from a Monday.
            Period::Week => days - (days + 3).rem_euclid(7) + 7,
            Period::Month => {
                let (year, month, _) = civil_from_days(days);
                if month == 12 {
                    days_from_civil(year + 1, 1, 1)
                } else {
                    days_from_civil(year, month + 1, 1)
                }
            }
        };
        (next_day * DAY_MS) as u64
    }
}

/// Days since 1970-01-01 of a date (month 1 to 12, day 1 to 31).
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The date (year, month 1 to 12, day 1 to 31) of a day counted from 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ms since the epoch of a UTC date and time.
    fn at(year: i64, month: i64, day: i64, hour: i64, minute: i64) -> u64 {
        (days_from_civil(year, month, day) * DAY_MS + (hour * 60 + minute) * 60_000) as u64
    }

    #[test]
    fn dates_convert_to_days_and_back() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2026, 12, 2), 20_789);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        for days in -800_000..800_000 {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
            assert!((1..=12).contains(&m) && (1..=31).contains(&d));
        }
    }

    #[test]
    fn a_day_ends_at_the_next_midnight_utc() {
        assert_eq!(
            Period::Day.next_boundary(at(2026, 12, 2, 13, 45)),
            at(2026, 12, 3, 0, 0)
        );
        assert_eq!(
            Period::Day.next_boundary(at(2026, 12, 31, 23, 59)),
            at(2027, 1, 1, 0, 0)
        );
        // At the boundary itself a new day has begun: it ends a whole day later.
        assert_eq!(
            Period::Day.next_boundary(at(2026, 12, 3, 0, 0)),
            at(2026, 12, 4, 0, 0)
        );
        assert_eq!(
            Period::Day.next_boundary(at(2028, 2, 28, 12, 0)),
            at(2028, 2, 29, 0, 0)
        );
    }

    #[test]
    fn a_week_ends_on_the_next_monday_at_midnight_utc() {
        // 2026-12-02 is a Wednesday; 2026-12-07 a Monday.
        assert_eq!(
            Period::Week.next_boundary(at(2026, 12, 2, 13, 45)),
            at(2026, 12, 7, 0, 0)
        );
        assert_eq!(
            Period::Week.next_boundary(at(2026, 12, 6, 23, 59)),
            at(2026, 12, 7, 0, 0)
        );
        assert_eq!(
            Period::Week.next_boundary(at(2026, 12, 7, 0, 0)),
            at(2026, 12, 14, 0, 0)
        );
        // Across a year's end: Thursday 2026-12-31 to Monday 2027-01-04.
        assert_eq!(
            Period::Week.next_boundary(at(2026, 12, 31, 8, 0)),
            at(2027, 1, 4, 0, 0)
        );
        assert_eq!(Period::Week.next_boundary(0), at(1970, 1, 5, 0, 0));
    }

    #[test]
    fn a_month_ends_on_the_first_of_the_next_at_midnight_utc() {
        let month = |ms| Period::Month.next_boundary(ms);
        assert_eq!(
            month(at(2026, 12, 2, 13, 45)),
            at(2027, 1, 1, 0, 0),
            "December to January"
        );
        assert_eq!(month(at(2026, 1, 31, 23, 59)), at(2026, 2, 1, 0, 0));
        assert_eq!(
            month(at(2028, 2, 29, 12, 0)),
            at(2028, 3, 1, 0, 0),
            "a leap February"
        );
        assert_eq!(month(at(2027, 2, 28, 12, 0)), at(2027, 3, 1, 0, 0));
        assert_eq!(
            month(at(2100, 2, 28, 12, 0)),
            at(2100, 3, 1, 0, 0),
            "2100 is no leap year"
        );
        assert_eq!(month(at(2000, 2, 29, 0, 0)), at(2000, 3, 1, 0, 0), "2000 is one");
        assert_eq!(month(at(2026, 4, 30, 0, 0)), at(2026, 5, 1, 0, 0));
        assert_eq!(month(at(2026, 5, 1, 0, 0)), at(2026, 6, 1, 0, 0));
        // 2000-03-01 00:00 UTC is 951868800 s after the epoch (`date -u -d 2000-03-01 +%s`).
        assert_eq!(at(2000, 3, 1, 0, 0), 951_868_800_000);
    }

    #[test]
    fn no_window_is_longer_than_its_longest() {
        for period in [Period::Day, Period::Week, Period::Month] {
            let mut now = at(2023, 12, 25, 7, 0);
            for _ in 0..40 {
                let end = period.next_boundary(now);
                assert!(end > now && end - now <= period.longest_ms());
                now = end;
            }
            assert_eq!(Period::parse(period.name()), Some(period));
        }
        assert_eq!(Period::parse("fortnight"), None);
    }
}
