//! Human durations in the policy file ("500ms", "10s", "2m", "1h").
//! Kept tiny and strict so a typo is an error, not a surprising value.

use std::time::Duration;

/// Parses `<integer><unit>` with unit one of ms, s, m, h.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(|| {
        format!("duration {text:?} has no unit (use ms, s, m or h, e.g. \"10s\")")
    })?;
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err(format!("duration {text:?} does not start with a number"));
    }
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("duration {text:?} is out of range"))?;
    let millis = match unit {
        "ms" => Some(value),
        "s" => value.checked_mul(1_000),
        "m" => value.checked_mul(60_000),
        "h" => value.checked_mul(3_600_000),
        other => {
            return Err(format!(
                "duration {text:?} has unknown unit {other:?} (use ms, s, m or h)"
            ))
        }
    };
    millis
        .map(Duration::from_millis)
        .ok_or_else(|| format!("duration {text:?} is out of range"))
}

/// Formats a duration the way the policy file writes it, for messages.
pub fn format_duration(duration: Duration) -> String {
    let millis = duration.as_millis();
    if millis % 3_600_000 == 0 && millis > 0 {
        format!("{}h", millis / 3_600_000)
    } else if millis % 60_000 == 0 && millis > 0 {
        format!("{}m", millis / 60_000)
    } else if millis % 1_000 == 0 {
        format!("{}s", millis / 1_000)
    } else {
        format!("{millis}ms")
    }
}

pub mod serde_duration {
    use super::parse_duration;
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

pub mod serde_opt_duration {
    use super::parse_duration;
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = Option::<String>::deserialize(d)?;
        text.map(|t| parse_duration(&t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let cases: &[(&str, Result<u64, ()>)] = &[
            ("500ms", Ok(500)),
            ("10s", Ok(10_000)),
            ("2m", Ok(120_000)),
            ("1h", Ok(3_600_000)),
            (" 3s ", Ok(3_000)),
            ("10", Err(())),
            ("s", Err(())),
            ("1.5s", Err(())),
            ("10d", Err(())),
            ("99999999999999999999s", Err(())),
        ];
        for (text, want) in cases {
            let got = parse_duration(text)
                .map(|d| d.as_millis() as u64)
                .map_err(|_| ());
            assert_eq!(&got, want, "case {text:?}");
        }
    }

    #[test]
    fn formats_round_trip() {
        for ms in [0u64, 1, 500, 1000, 90_000, 60_000, 3_600_000] {
            let text = format_duration(Duration::from_millis(ms));
            assert_eq!(
                parse_duration(&text),
                Ok(Duration::from_millis(ms)),
                "{text}"
            );
        }
    }
}
