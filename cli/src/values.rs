//! The value parsers the commands' options share: durations and `KEY=VALUE` pairs. They sit
//! apart from the command tree (`args.rs`), which names every command's options, so that the
//! commands' modules use them without importing the tree that imports them.

use std::time::Duration;

/// A duration: plain seconds (`10`, `1.5`), or anything [`humantime`] reads (`500ms`, `10s`,
/// `5m`, `2h`, `1h 30m`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let bare_seconds = !t.is_empty()
        && t.chars().all(|c| c.is_ascii_digit() || c == '.')
        && t.chars().any(|c| c.is_ascii_digit());
    if bare_seconds {
        let value: f64 = t.parse().map_err(|_| {
            format!("{text:?} is not a duration: write seconds (10, 1.5) or 500ms, 5m")
        })?;
        return Duration::try_from_secs_f64(value).map_err(|e| format!("{text:?}: {e}"));
    }
    humantime::parse_duration(t).map_err(|e| {
        format!("{text:?} is not a duration ({e}): write seconds (10, 1.5) or 500ms, 10s, 5m, 2h")
    })
}

/// A `KEY=VALUE` pair with a non-empty key.
pub fn parse_key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_pairs() {
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert!(parse_duration("-1").is_err());
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        assert!(
            parse_duration("3 fortnights")
                .unwrap_err()
                .contains("unknown time unit")
        );
        assert!(parse_duration("1.2.3").is_err());
        assert!(parse_duration("").is_err());
        assert_eq!(parse_key_value("A=").unwrap(), ("A".into(), String::new()));
        assert!(parse_key_value("=x").is_err());
    }
}
