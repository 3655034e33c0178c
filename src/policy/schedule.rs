//! A rule's schedule windows (policy key `schedules`): when each one is active. Pure;
//! which limit is in force among them is decided in `crate::pacing::schedule`.
//!
//! A window opens at every fire time of its cron expression (wall time in its zone) and
//! stays open for `duration` of elapsed time, whatever DST does meanwhile. Occurrences
//! that overlap (a duration longer than the gap between fire times) join into one.

use super::cron::Cron;
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};
use std::time::Duration;

/// Milliseconds since the Unix epoch, the same count as `limiter::Millis` (the policy
/// layer does not import the limiter).
type Millis = u64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleWindow {
    /// As written, for messages.
    pub schedule: String,
    pub cron: Cron,
    /// The IANA name, for messages ("UTC" by default).
    pub zone_name: String,
    pub zone: TimeZone,
    pub duration: Duration,
    /// In force for every limit of the rule while the window is open; 0 is a pause.
    pub events: u32,
    /// None: the limit's own burst, at most `events`.
    pub burst: Option<u32>,
    /// None: the rule's own.
    pub max_not_ready: Option<u32>,
}

/// Occurrences joined into one open stretch before the window counts as always open.
pub const MAX_JOINED: usize = 1_000;

/// How far ahead the next change is looked for: a window that opens less often than
/// this (a yearly one) shows no next change until it comes within reach.
pub const HORIZON_MS: Millis = 400 * 24 * 3600 * 1000;

fn ts(at: Millis) -> Timestamp {
    Timestamp::from_millisecond(at.min(i64::MAX as u64) as i64).unwrap_or(Timestamp::MAX)
}

fn ms(t: Timestamp) -> Millis {
    t.as_millisecond().max(0) as Millis
}

impl ScheduleWindow {
    fn span(&self) -> SignedDuration {
        SignedDuration::try_from(self.duration).unwrap_or(SignedDuration::MAX)
    }

    /// The start of the occurrence open at `now`, if one is: the latest fire time `t <= now`
    /// with `now < t + duration` (an earlier fire ends earlier still, so only the latest
    /// can hold `now`).
    pub fn open_since(&self, now: Millis) -> Option<Millis> {
        let now_ts = ts(now);
        let floor = now_ts.saturating_sub(self.span()).ok()?;
        let fire = self.cron.prev_fire(&self.zone, now_ts, floor)?;
        let end = fire.saturating_add(self.span()).ok()?;
        (now_ts < end).then(|| ms(fire))
    }

    /// When the window, open at `now`, closes: occurrences that start before the current
    /// one ends extend it. None when it stays open over the horizon or over
    /// [`MAX_JOINED`] occurrences in a row (a window longer than its period: "* * * * *"
    /// for 2 minutes would otherwise take a step per minute over the whole horizon).
    pub fn closes_at(&self, now: Millis) -> Option<Millis> {
        let start = self.open_since(now)?;
        let ceiling = ts(now.saturating_add(HORIZON_MS));
        let mut end = ts(start).saturating_add(self.span()).ok()?;
        for _ in 0..MAX_JOINED {
            if end > ceiling {
                return None;
            }
            // The latest fire that starts by `end` (a fire exactly at `end` reopens it).
            let floor = end.saturating_sub(self.span()).ok()?;
            match self.cron.prev_fire(&self.zone, end, floor) {
                Some(fire) => {
                    let next_end = fire.saturating_add(self.span()).ok()?;
                    if next_end <= end {
                        return Some(ms(end));
                    }
                    end = next_end;
                }
                None => return Some(ms(end)),
            }
        }
        None
    }

    /// The next time the window opens after `now`, within the horizon.
    pub fn opens_at(&self, now: Millis) -> Option<Millis> {
        let ceiling = ts(now.saturating_add(HORIZON_MS));
        self.cron.next_fire(&self.zone, ts(now), ceiling).map(ms)
    }

    /// The next time after `now` the window opens or closes.
    pub fn next_change(&self, now: Millis) -> Option<Millis> {
        match self.open_since(now) {
            Some(_) => self.closes_at(now),
            None => self.opens_at(now),
        }
    }

    /// Whether the window never closes once open: its duration covers the gaps between
    /// consecutive fire times over the horizon from `now`, or over [`MAX_JOINED`] of them
    /// (check-config warns).
    pub fn always_open(&self, now: Millis) -> bool {
        match self.opens_at(now.saturating_sub(1)) {
            Some(first) => self.closes_at(first).is_none(),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Millis {
        let t: Timestamp = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
        ms(t)
    }

    fn window(schedule: &str, zone: &str, duration: Duration) -> ScheduleWindow {
        ScheduleWindow {
            schedule: schedule.into(),
            cron: Cron::parse(schedule).unwrap_or_else(|e| panic!("{e}")),
            zone_name: zone.into(),
            zone: TimeZone::get(zone).unwrap_or_else(|e| panic!("{e}")),
            duration,
            events: 0,
            burst: None,
            max_not_ready: None,
        }
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn business_hours_in_berlin() {
        let w = window("0 9 * * 1-5", "Europe/Berlin", 8 * HOUR);
        // Monday 7 December 2026 (CET, UTC+1): open 08:00Z to 16:00Z.
        assert_eq!(w.open_since(at("2026-12-07T07:59:59Z")), None);
        assert_eq!(
            w.opens_at(at("2026-12-07T07:00:00Z")),
            Some(at("2026-12-07T08:00:00Z"))
        );
        assert_eq!(
            w.open_since(at("2026-12-07T08:00:00Z")),
            Some(at("2026-12-07T08:00:00Z"))
        );
        assert_eq!(
            w.closes_at(at("2026-12-07T12:00:00Z")),
            Some(at("2026-12-07T16:00:00Z"))
        );
        assert_eq!(w.open_since(at("2026-12-07T16:00:00Z")), None);
        // Friday evening: next opening on Monday.
        assert_eq!(
            w.next_change(at("2026-12-11T17:00:00Z")),
            Some(at("2026-12-14T08:00:00Z"))
        );
        assert!(!w.always_open(at("2026-12-07T00:00:00Z")));
    }

    #[test]
    fn duration_is_elapsed_time_across_dst() {
        // 01:00 Berlin on 29 March 2026 (CET) = 00:00Z; 3 h elapsed ends at 03:00Z, which
        // is 05:00 CEST on the wall, not 04:00.
        let w = window("0 1 * * *", "Europe/Berlin", 3 * HOUR);
        assert_eq!(
            w.closes_at(at("2026-03-29T01:00:00Z")),
            Some(at("2026-03-29T03:00:00Z"))
        );
        // Fall back on 25 October 2026: 01:00 CEST = 23:00Z the day before; ends 02:00Z.
        assert_eq!(
            w.closes_at(at("2026-10-25T00:00:00Z")),
            Some(at("2026-10-25T02:00:00Z"))
        );
    }

    #[test]
    fn overlapping_occurrences_join_and_a_window_longer_than_its_period_never_closes() {
        // Every hour, open 90 minutes: always open.
        let w = window("0 * * * *", "UTC", 90 * Duration::from_secs(60));
        assert!(w.open_since(at("2026-12-07T10:30:00Z")).is_some());
        assert_eq!(w.closes_at(at("2026-12-07T10:30:00Z")), None);
        assert!(w.always_open(at("2026-12-07T00:00:00Z")));
        // Hours 10 and 11, 90 minutes each: one stretch 10:00 to 12:30.
        let w = window("0 10,11 * * *", "UTC", 90 * Duration::from_secs(60));
        assert_eq!(
            w.closes_at(at("2026-12-07T10:15:00Z")),
            Some(at("2026-12-07T12:30:00Z"))
        );
        assert!(!w.always_open(at("2026-12-07T00:00:00Z")));
    }
}
