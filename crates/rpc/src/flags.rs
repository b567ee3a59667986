//! Parsers for command-line flags the services share.

use std::time::Duration;

/// Parses `<number><unit>` with unit s, m, h or d (`7d`, `12h`, `30s`), longer than zero; for
/// clap's `value_parser`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 =
        number.parse().map_err(|_| format!("{text:?}: expected a number followed by s, m, h or d"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: unit must be s, m, h or d")),
    };
    if number == 0 {
        return Err(format!("{text:?}: must be longer than zero"));
    }
    number.checked_mul(seconds).map(Duration::from_secs).ok_or_else(|| format!("{text:?}: too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("6s"), Ok(Duration::from_secs(6)));
        for bad in ["", "7", "d", "7w", "0s", "-1s", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
