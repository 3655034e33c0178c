//! Five-field POSIX cron expressions (minute hour day-of-month month day-of-week, Sunday
//! = 0) and their fire times in an IANA time zone. Pure: instants come in and go out.
//!
//! Fire times are wall-clock times in the zone. A wall time that a spring-forward skips
//! fires when the clock has moved on (02:30 in Berlin's skipped hour fires at 03:30 CEST);
//! a wall time that a fall-back repeats fires once, at its first occurrence (jiff's
//! "compatible" disambiguation, the one RFC 5545 and most cron daemons follow). So wall
//! order and instant order never disagree, which the searches below rely on.

use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    /// Bit n set: minute n (0..=59).
    minutes: u64,
    /// Bit n: hour n (0..=23).
    hours: u32,
    /// Bit n: day of month n (1..=31).
    days: u32,
    /// Bit n: month n (1..=12).
    months: u16,
    /// Bit n: weekday n, Sunday = 0 (0..=6).
    weekdays: u8,
    /// POSIX: when both day fields are restricted (neither starts with `*`), a day
    /// matches if either does; otherwise both must.
    days_restricted: bool,
    weekdays_restricted: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CronError(String);

/// A fold moves wall time back by at most this much (an hour nearly everywhere; the
/// searches start this far beyond their bound so no repeated wall time is missed).
const FOLD_SLACK: SignedDuration = SignedDuration::from_hours(3);

struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const MINUTE: Field = Field {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
};
const HOUR: Field = Field {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
};
const DAY: Field = Field {
    name: "day of month",
    min: 1,
    max: 31,
    names: &[],
};
const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ],
};
// 7 is accepted for Sunday as well (Vixie cron and most others do).
const WEEKDAY: Field = Field {
    name: "day of week",
    min: 0,
    max: 7,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
};

impl Field {
    fn value(&self, text: &str) -> Result<u32, CronError> {
        if let Some(i) = self.names.iter().position(|n| n.eq_ignore_ascii_case(text)) {
            // Month names count from 1, weekday names from 0 (Sunday).
            return Ok(i as u32 + if self.min == 1 { 1 } else { 0 });
        }
        let n: u32 = text.parse().map_err(|_| {
            CronError(format!(
                "{} field: {text:?} is not a number{}",
                self.name,
                if self.names.is_empty() {
                    ""
                } else {
                    " or a three-letter name"
                }
            ))
        })?;
        if n < self.min || n > self.max {
            return Err(CronError(format!(
                "{} field: {n} is out of range {}-{}",
                self.name, self.min, self.max
            )));
        }
        Ok(n)
    }

    /// The field's values as a bit set: comma-separated `*`, `N`, `N-M`, each with an
    /// optional `/STEP`.
    fn parse(&self, text: &str) -> Result<u64, CronError> {
        let mut bits = 0u64;
        for item in text.split(',') {
            let (range, step) = match item.split_once('/') {
                Some((r, s)) => {
                    let step: u32 = s.parse().ok().filter(|&s| s > 0).ok_or_else(|| {
                        CronError(format!(
                            "{} field: step {s:?} must be a positive number",
                            self.name
                        ))
                    })?;
                    (r, step)
                }
                None => (item, 1),
            };
            let (low, high) = if range == "*" {
                (self.min, self.max)
            } else if let Some((a, b)) = range.split_once('-') {
                let (a, b) = (self.value(a)?, self.value(b)?);
                if a > b {
                    return Err(CronError(format!(
                        "{} field: range {range:?} runs backwards",
                        self.name
                    )));
                }
                (a, b)
            } else {
                let a = self.value(range)?;
                // `N/STEP` means N to the end, every STEP.
                (a, if step > 1 { self.max } else { a })
            };
            let mut v = low;
            while v <= high {
                bits |= 1 << v;
                v += step;
            }
        }
        Ok(bits)
    }
}

impl Cron {
    pub fn parse(text: &str) -> Result<Cron, CronError> {
        let expanded = match text.trim() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other => other,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(CronError(format!(
                "{text:?} has {} fields; a schedule has five: minute hour day-of-month month \
                 day-of-week (Sunday = 0), e.g. \"0 9 * * 1-5\"",
                fields.len()
            )));
        }
        let mut weekdays = WEEKDAY.parse(fields[4])?;
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays | 1) & 0x7f;
        }
        Ok(Cron {
            minutes: MINUTE.parse(fields[0])?,
            hours: HOUR.parse(fields[1])? as u32,
            days: DAY.parse(fields[2])? as u32,
            months: MONTH.parse(fields[3])? as u16,
            weekdays: weekdays as u8,
            days_restricted: !fields[2].starts_with('*'),
            weekdays_restricted: !fields[4].starts_with('*'),
        })
    }

    fn day_matches(&self, date: Date) -> bool {
        if self.months & (1 << date.month()) == 0 {
            return false;
        }
        let dom = self.days & (1 << date.day()) != 0;
        let dow = self.weekdays & (1 << date.weekday().to_sunday_zero_offset()) != 0;
        if self.days_restricted && self.weekdays_restricted {
            dom || dow
        } else {
            dom && dow
        }
    }

    /// Whether a wall time is one the expression names (on a whole minute).
    pub fn matches_wall(&self, dt: DateTime) -> bool {
        dt.second() == 0
            && dt.subsec_nanosecond() == 0
            && self.day_matches(dt.date())
            && self.hours & (1 << dt.hour()) != 0
            && self.minutes & (1 << dt.minute()) != 0
    }

    /// The wall times of `date` that match, latest first.
    fn times_desc(&self, date: Date) -> impl Iterator<Item = DateTime> + '_ {
        (0..24i8)
            .rev()
            .filter(|h| self.hours & (1 << h) != 0)
            .flat_map(move |h| {
                (0..60i8)
                    .rev()
                    .filter(|m| self.minutes & (1 << m) != 0)
                    .map(move |m| date.at(h, m, 0, 0))
            })
    }

    /// The latest fire time at or before `at` and not before `floor`.
    pub fn prev_fire(&self, zone: &TimeZone, at: Timestamp, floor: Timestamp) -> Option<Timestamp> {
        // The latest wall time an instant up to `at` can read: `at`'s own, or after a
        // fall-back within the slack, the reading before the clock went back.
        let upper = wall(zone, at).max(
            wall(zone, at.saturating_sub(FOLD_SLACK).ok()?)
                .checked_add(FOLD_SLACK)
                .ok()?,
        );
        let floor_date = wall(zone, floor.saturating_sub(FOLD_SLACK).ok()?).date();
        let mut date = upper.date();
        while date >= floor_date {
            if self.day_matches(date) {
                for dt in self.times_desc(date).filter(|dt| *dt <= upper) {
                    let Ok(t) = zone.to_ambiguous_timestamp(dt).compatible() else {
                        continue;
                    };
                    if t < floor {
                        return None;
                    }
                    if t <= at {
                        return Some(t);
                    }
                }
            }
            date = date.yesterday().ok()?;
        }
        None
    }

    /// The first fire time after `after` and not after `ceiling`.
    pub fn next_fire(
        &self,
        zone: &TimeZone,
        after: Timestamp,
        ceiling: Timestamp,
    ) -> Option<Timestamp> {
        // The earliest wall time that can map past `after`: `after`'s own, or after a
        // spring-forward within the slack, a skipped wall time (it fires when the clock
        // has jumped, so later than it reads).
        let lower = wall(zone, after).min(
            wall(zone, after.saturating_sub(FOLD_SLACK).ok()?)
                .checked_add(FOLD_SLACK)
                .ok()?,
        );
        let last_date = wall(zone, ceiling.saturating_add(FOLD_SLACK).ok()?).date();
        let mut date = lower.date();
        while date <= last_date {
            if self.day_matches(date) {
                let mut times: Vec<DateTime> =
                    self.times_desc(date).filter(|dt| *dt >= lower).collect();
                times.reverse();
                for dt in times {
                    let Ok(t) = zone.to_ambiguous_timestamp(dt).compatible() else {
                        continue;
                    };
                    if t > ceiling {
                        return None;
                    }
                    if t > after {
                        return Some(t);
                    }
                }
            }
            date = date.tomorrow().ok()?;
        }
        None
    }
}

/// The wall time of an instant in a zone.
fn wall(zone: &TimeZone, t: Timestamp) -> DateTime {
    zone.to_datetime(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(text: &str) -> Timestamp {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn berlin() -> TimeZone {
        TimeZone::get("Europe/Berlin").unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn parses_posix_fields_and_refuses_the_rest() {
        let ok = [
            "0 9 * * 1-5",
            "*/15 * * * *",
            "0 1 * * *",
            "0 0 1,15 * sun",
            "30 2 * JAN-mar 7",
            "@daily",
            "5/10 * * * *",
        ];
        for text in ok {
            assert!(Cron::parse(text).is_ok(), "{text}");
        }
        let bad = [
            ("0 9 * *", "has 4 fields"),
            ("0 0 9 * * 1-5", "has 6 fields"),
            ("60 * * * *", "minute field: 60 is out of range 0-59"),
            ("0 24 * * *", "hour field: 24"),
            ("0 0 0 * *", "day of month field: 0"),
            ("0 0 * 13 *", "month field: 13"),
            ("0 0 * * 8", "day of week field: 8"),
            ("0 0 * * mon-sun-x", "not a number"),
            ("*/0 * * * *", "step"),
            ("5-1 * * * *", "backwards"),
            ("? * * * *", "not a number"),
        ];
        for (text, needle) in bad {
            match Cron::parse(text) {
                Ok(_) => panic!("{text}: expected an error"),
                Err(e) => assert!(e.to_string().contains(needle), "{text}: {e}"),
            }
        }
    }

    #[test]
    fn sunday_is_zero_and_seven_and_days_or_when_both_restricted() {
        let sunday = Date::constant(2026, 12, 6);
        let monday = Date::constant(2026, 12, 7);
        for text in ["0 0 * * 0", "0 0 * * 7", "0 0 * * sun"] {
            let c = Cron::parse(text).unwrap_or_else(|e| panic!("{e}"));
            assert!(c.day_matches(sunday), "{text}");
            assert!(!c.day_matches(monday), "{text}");
        }
        // Day 1 of the month or any Monday.
        let c = Cron::parse("0 0 1 * 1").unwrap_or_else(|e| panic!("{e}"));
        assert!(c.day_matches(monday));
        assert!(c.day_matches(Date::constant(2026, 12, 1)));
        assert!(!c.day_matches(sunday));
        // `*/1` in the day of month counts as unrestricted: Mondays only.
        let c = Cron::parse("0 0 */1 * 1").unwrap_or_else(|e| panic!("{e}"));
        assert!(!c.day_matches(Date::constant(2026, 12, 1)));
    }

    #[test]
    fn fire_times_in_a_zone() {
        let c = Cron::parse("0 9 * * 1-5").unwrap_or_else(|e| panic!("{e}"));
        let z = berlin();
        // Monday 7 December 2026, 10:00 in Berlin (CET, UTC+1) = 09:00Z.
        let now = ts("2026-12-07T09:00:00Z");
        let week_ago = ts("2026-11-30T00:00:00Z");
        assert_eq!(
            c.prev_fire(&z, now, week_ago),
            Some(ts("2026-12-07T08:00:00Z"))
        );
        assert_eq!(
            c.next_fire(&z, now, ts("2027-01-01T00:00:00Z")),
            Some(ts("2026-12-08T08:00:00Z"))
        );
        // Saturday: the next fire is Monday.
        let saturday = ts("2026-12-12T12:00:00Z");
        assert_eq!(
            c.next_fire(&z, saturday, ts("2027-01-01T00:00:00Z")),
            Some(ts("2026-12-14T08:00:00Z"))
        );
        assert_eq!(
            c.prev_fire(&z, saturday, week_ago),
            Some(ts("2026-12-11T08:00:00Z"))
        );
        // Nothing within the bounds.
        assert_eq!(c.prev_fire(&z, saturday, ts("2026-12-12T00:00:00Z")), None);
        assert_eq!(c.next_fire(&z, saturday, ts("2026-12-13T00:00:00Z")), None);
    }

    #[test]
    fn dst_skipped_wall_times_fire_after_the_jump_and_repeated_ones_once() {
        let z = berlin();
        // 29 March 2026: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist.
        let c = Cron::parse("30 2 * * *").unwrap_or_else(|e| panic!("{e}"));
        let fire = c.next_fire(&z, ts("2026-03-28T12:00:00Z"), ts("2026-04-01T00:00:00Z"));
        // 03:30 CEST = 01:30Z.
        assert_eq!(fire, Some(ts("2026-03-29T01:30:00Z")));
        // The day after: 02:30 CEST = 00:30Z.
        let fire = c.next_fire(&z, ts("2026-03-29T01:30:00Z"), ts("2026-04-01T00:00:00Z"));
        assert_eq!(fire, Some(ts("2026-03-30T00:30:00Z")));
        // 25 October 2026: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice, and
        // fires at the first (00:30Z), not at the second (01:30Z).
        let fire = c.next_fire(&z, ts("2026-10-24T12:00:00Z"), ts("2026-10-27T00:00:00Z"));
        assert_eq!(fire, Some(ts("2026-10-25T00:30:00Z")));
        let after = c.next_fire(&z, ts("2026-10-25T00:30:00Z"), ts("2026-10-27T00:00:00Z"));
        assert_eq!(after, Some(ts("2026-10-26T01:30:00Z")));
        // Seen from the second 02:40 (01:40Z), the latest fire is the first 02:30.
        let prev = c.prev_fire(&z, ts("2026-10-25T01:40:00Z"), ts("2026-10-24T00:00:00Z"));
        assert_eq!(prev, Some(ts("2026-10-25T00:30:00Z")));
    }
}
