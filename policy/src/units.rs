//! Sizes and durations as operators write them: `"16 MiB"`, `"10m"`, or
//! plain integers (bytes, seconds).

use std::time::Duration;

/// Why a size or duration from the policy file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("`{0}` is not a size like `16 MiB`")]
    NotASize(String),
    #[error("unknown size unit `{0}` (use B, KiB, MiB, GiB, KB, MB or GB)")]
    SizeUnit(String),
    #[error("`{0}` is not a duration like `90s`, `10m`, `1h 30m` or `90d`")]
    NotADuration(String),
    #[error("`{0}` is negative")]
    Negative(String),
    #[error("`{0}` is too large")]
    TooLarge(String),
}

/// Parses `"512"`, `"64 KiB"`, `"16MiB"`, `"1 GB"` into bytes.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| UnitError::NotASize(text.to_owned()))?;
    let multiplier: u64 = match unit.trim() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => {
            return Err(UnitError::SizeUnit(other.to_owned()));
        }
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| UnitError::TooLarge(text.to_owned()))
}

/// Parses `"90s"`, `"10m"`, `"1h 30m"` (jiff's friendly format), or whole
/// days `"90d"`, into a duration; negative durations are refused.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    // jiff's SignedDuration has no days (they are calendar units there);
    // for ages and retention a day is 24 hours.
    if let Some(days) = text
        .trim()
        .strip_suffix('d')
        .and_then(|d| d.trim().parse::<u64>().ok())
    {
        return days
            .checked_mul(86_400)
            .map(Duration::from_secs)
            .ok_or_else(|| UnitError::TooLarge(text.to_owned()));
    }
    let signed: jiff::SignedDuration = text
        .trim()
        .parse()
        .map_err(|_| UnitError::NotADuration(text.to_owned()))?;
    Duration::try_from(signed).map_err(|_| UnitError::Negative(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("64 KiB"), Ok(65536));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("1 GB"), Ok(1_000_000_000));
        assert!(
            parse_size("1 PiB")
                .unwrap_err()
                .to_string()
                .contains("unknown size unit")
        );
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999999999999 GiB").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("90d"), Ok(Duration::from_secs(90 * 86_400)));
        assert!(parse_duration("-5s").is_err());
        assert!(parse_duration("soon").is_err());
    }
}
