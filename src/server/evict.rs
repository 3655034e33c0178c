//! Which open connection makes room for a newcomer at a port's connection caps: a pure
//! choice over a snapshot of the connection table, so a flood of idle connections cannot
//! lock out the API server's (which complete requests) by merely being there first.
//!
//! The order: within the newcomer's source address when that source is at its own cap,
//! else across the port when the port is full; in both, first a connection that never
//! completed a request (oldest first; an unfinished TLS handshake counts), then the one
//! idle longest. A connection with a request in flight is never chosen: when every
//! candidate has one, the newcomer is refused.

use std::net::IpAddr;
use std::time::Duration;

/// One open connection as the choice sees it. Times are offsets from a common origin
/// (the table's), so the function takes no clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub id: u64,
    pub source: IpAddr,
    /// When it was accepted.
    pub opened: Duration,
    /// Whether any request on it has been answered.
    pub completed: bool,
    /// Requests being served on it right now.
    pub in_flight: usize,
    /// When its last request ended (`opened` when none did).
    pub last_active: Duration,
}

/// Which cap the newcomer hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// Its source address already has `per_source` connections.
    Source,
    /// The port already has `total` connections.
    Port,
}

impl Cap {
    pub fn label(self) -> &'static str {
        match self {
            Cap::Source => "source",
            Cap::Port => "port",
        }
    }
}

/// Why the victim was the one chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// It never completed a request (a flood's connection, or a handshake not finished).
    NeverCompleted,
    /// It completed requests and has been idle the longest.
    Idle,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::NeverCompleted => "never-completed",
            Kind::Idle => "idle",
        }
    }
}

/// The outcome for one newcomer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Below both caps: nothing to close.
    Room,
    /// Close connection `id` to make room.
    Evict { id: u64, cap: Cap, kind: Kind },
    /// Every candidate has a request in flight: the newcomer is closed.
    Refuse { cap: Cap },
}

/// The caps of one port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub total: usize,
    pub per_source: usize,
}

/// The choice for a newcomer from `source` given the open connections `table`.
pub fn choose(table: &[Candidate], source: IpAddr, caps: Caps) -> Choice {
    let per_source = caps.per_source.clamp(1, caps.total.max(1));
    let from_source = table.iter().filter(|c| c.source == source).count();
    if from_source >= per_source {
        return pick(table.iter().filter(|c| c.source == source), Cap::Source);
    }
    if table.len() >= caps.total.max(1) {
        return pick(table.iter(), Cap::Port);
    }
    Choice::Room
}

fn pick<'a>(candidates: impl Iterator<Item = &'a Candidate>, cap: Cap) -> Choice {
    // Ordered by: never completed before completed; then the older (never completed:
    // accepted earlier; completed: idle since earlier); then the lower id, so ties
    // are decided the same way every time.
    candidates
        .filter(|c| c.in_flight == 0)
        .min_by_key(|c| {
            let since = if c.completed { c.last_active } else { c.opened };
            (c.completed, since, c.id)
        })
        .map_or(Choice::Refuse { cap }, |c| Choice::Evict {
            id: c.id,
            cap,
            kind: if c.completed {
                Kind::Idle
            } else {
                Kind::NeverCompleted
            },
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::Ipv4Addr;

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// id, source, opened, completed, in flight, last active
    fn c(id: u64, src: u8, opened: u64, completed: bool, in_flight: usize, last: u64) -> Candidate {
        Candidate {
            id,
            source: ip(src),
            opened: ms(opened),
            completed,
            in_flight,
            last_active: ms(last),
        }
    }

    const CAPS: Caps = Caps {
        total: 4,
        per_source: 2,
    };

    #[test]
    fn table() {
        use Choice::*;
        let cases: Vec<(&str, Vec<Candidate>, u8, Choice)> = vec![
            ("empty", vec![], 1, Room),
            ("below both caps", vec![c(1, 1, 0, false, 0, 0)], 2, Room),
            (
                "port full: the oldest never-completed goes, before any idle one",
                vec![
                    c(1, 1, 0, true, 0, 0),
                    c(2, 2, 5, false, 0, 5),
                    c(3, 3, 3, false, 0, 3),
                    c(4, 4, 1, true, 0, 1),
                ],
                9,
                Evict {
                    id: 3,
                    cap: Cap::Port,
                    kind: Kind::NeverCompleted,
                },
            ),
            (
                "port full of completed ones: the idle longest goes",
                vec![
                    c(1, 1, 0, true, 0, 50),
                    c(2, 2, 1, true, 0, 20),
                    c(3, 3, 2, true, 0, 30),
                    c(4, 4, 3, true, 0, 40),
                ],
                9,
                Evict {
                    id: 2,
                    cap: Cap::Port,
                    kind: Kind::Idle,
                },
            ),
            (
                "a connection with a request in flight is never chosen",
                vec![
                    c(1, 1, 0, false, 1, 0),
                    c(2, 2, 1, true, 2, 0),
                    c(3, 3, 2, true, 0, 90),
                    c(4, 4, 3, false, 1, 3),
                ],
                9,
                Evict {
                    id: 3,
                    cap: Cap::Port,
                    kind: Kind::Idle,
                },
            ),
            (
                "all in flight: refused",
                vec![
                    c(1, 1, 0, false, 1, 0),
                    c(2, 2, 1, true, 1, 0),
                    c(3, 3, 2, true, 1, 0),
                    c(4, 4, 3, false, 1, 3),
                ],
                9,
                Refuse { cap: Cap::Port },
            ),
            (
                "source at its cap: evicts within that source, not the port's oldest",
                vec![
                    c(1, 1, 0, false, 0, 0),
                    c(2, 2, 5, true, 0, 9),
                    c(3, 2, 6, true, 0, 7),
                ],
                2,
                Evict {
                    id: 3,
                    cap: Cap::Source,
                    kind: Kind::Idle,
                },
            ),
            (
                "source at its cap with all in flight: refused though the port has room",
                vec![
                    c(1, 1, 0, false, 0, 0),
                    c(2, 2, 5, true, 1, 9),
                    c(3, 2, 6, false, 1, 7),
                ],
                2,
                Refuse { cap: Cap::Source },
            ),
            (
                "another source is not held back by a full one",
                vec![c(1, 1, 0, false, 0, 0), c(2, 1, 1, false, 0, 1)],
                2,
                Room,
            ),
            (
                "ties go to the lower id",
                vec![
                    c(7, 1, 4, false, 0, 4),
                    c(5, 2, 4, false, 0, 4),
                    c(6, 3, 4, false, 0, 4),
                    c(8, 4, 9, false, 0, 9),
                ],
                9,
                Evict {
                    id: 5,
                    cap: Cap::Port,
                    kind: Kind::NeverCompleted,
                },
            ),
        ];
        for (name, table, src, want) in cases {
            assert_eq!(choose(&table, ip(src), CAPS), want, "{name}");
        }
    }

    #[test]
    fn a_per_source_cap_above_the_total_is_the_total() {
        let table = vec![c(1, 1, 0, false, 0, 0), c(2, 1, 1, false, 0, 1)];
        let caps = Caps {
            total: 2,
            per_source: 10,
        };
        assert_eq!(
            choose(&table, ip(1), caps),
            Choice::Evict {
                id: 1,
                cap: Cap::Source,
                kind: Kind::NeverCompleted
            }
        );
    }

    fn candidate() -> impl Strategy<Value = Candidate> {
        (1u8..4, 0u64..100, any::<bool>(), 0usize..3, 0u64..100).prop_map(
            |(src, opened, completed, in_flight, extra)| Candidate {
                id: 0,
                source: ip(src),
                opened: ms(opened),
                completed,
                in_flight,
                last_active: ms(opened + extra),
            },
        )
    }

    proptest! {
        #[test]
        fn the_choice_keeps_its_promises(
            mut table in prop::collection::vec(candidate(), 0..12),
            src in 1u8..5,
            total in 1usize..10,
            per_source in 1usize..10,
        ) {
            for (i, c) in table.iter_mut().enumerate() {
                c.id = i as u64;
            }
            let caps = Caps { total, per_source };
            let from_source = table.iter().filter(|c| c.source == ip(src)).count();
            match choose(&table, ip(src), caps) {
                Choice::Room => {
                    prop_assert!(table.len() < total);
                    prop_assert!(from_source < per_source.min(total));
                }
                Choice::Refuse { cap } => {
                    let pool: Vec<_> = table.iter()
                        .filter(|c| cap == Cap::Port || c.source == ip(src)).collect();
                    prop_assert!(!pool.is_empty());
                    prop_assert!(pool.iter().all(|c| c.in_flight > 0));
                }
                Choice::Evict { id, cap, kind } => {
                    let victim = table[id as usize];
                    // never one with a request in flight
                    prop_assert_eq!(victim.in_flight, 0);
                    if cap == Cap::Source {
                        prop_assert_eq!(victim.source, ip(src));
                        prop_assert!(from_source >= per_source.min(total));
                    } else {
                        prop_assert!(table.len() >= total);
                    }
                    let pool: Vec<_> = table.iter()
                        .filter(|c| c.in_flight == 0)
                        .filter(|c| cap == Cap::Port || c.source == ip(src)).collect();
                    match kind {
                        Kind::NeverCompleted => {
                            prop_assert!(!victim.completed);
                            // the oldest of the never-completed
                            prop_assert!(pool.iter().filter(|c| !c.completed)
                                .all(|c| c.opened >= victim.opened));
                        }
                        Kind::Idle => {
                            prop_assert!(victim.completed);
                            // only when no never-completed one is left, and idle longest
                            prop_assert!(pool.iter().all(|c| c.completed));
                            prop_assert!(pool.iter().all(|c| c.last_active >= victim.last_active));
                        }
                    }
                }
            }
        }
    }
}
