use super::*;

#[test]
fn the_forms_of_limits_are_read_as_it_reads_them() {
    for (text, count, window) in [
        ("5/minute", 5, Window::Ms(60_000)),
        ("5/MINUTES", 5, Window::Ms(60_000)),
        ("100 per hour", 100, Window::Ms(3_600_000)),
        (" 10 / 30 seconds ", 10, Window::Ms(30_000)),
        ("7per2hours", 7, Window::Ms(7_200_000)),
        ("1/second", 1, Window::Ms(1_000)),
        ("1000/day", 1000, Window::Calendar(Period::Day)),
        ("3 per 2 days", 3, Window::Ms(2 * 86_400_000)),
        ("50/week", 50, Window::Calendar(Period::Week)),
        ("9/month", 9, Window::Calendar(Period::Month)),
    ] {
        assert_eq!(parse_rate(text), Ok((count, window)), "{text}");
    }
}

#[test]
fn a_window_alone_is_per_as_text() {
    assert_eq!(parse_window("minute"), Ok(Window::Ms(60_000)));
    assert_eq!(parse_window("Hour"), Ok(Window::Ms(3_600_000)));
    assert_eq!(parse_window("90 seconds"), Ok(Window::Ms(90_000)));
    assert_eq!(parse_window("day"), Ok(Window::Calendar(Period::Day)));
    assert_eq!(parse_window("2 weeks"), Ok(Window::Ms(14 * 86_400_000)));
}

#[test]
fn what_cannot_be_read_says_the_forms() {
    for text in [
        "5",
        "five/minute",
        "5/fortnight",
        "-5/minute",
        "5/",
        "/minute",
        "5/1.5 hours",
        "5/minute;100/hour",
    ] {
        let error = parse_rate(text).unwrap_err();
        assert!(
            error.contains("\"5/minute\", \"100 per hour\""),
            "{text}: {error}"
        );
    }
    assert!(parse_rate("5/year").unwrap_err().contains("per=365 * 86400"));
    assert!(parse_rate("5/2 months")
        .unwrap_err()
        .contains("months differ in length"));
    assert!(parse_rate("5/0 seconds").unwrap_err().contains("holds nothing"));
    assert!(parse_window("99999999999999999999 hours").is_err());
}
