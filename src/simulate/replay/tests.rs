//! Table tests of the audit reader, the attribution rules and the replay, on
//! real-looking audit events (tests/fixtures/audit/).

use super::attribute::{Attributor, Dropped, Kind, Unattributed};
use super::audit::{parse_rfc3339_ms, read_line, Level, Line, NotDisruptive, Skip, What};
use super::input::{from_reader, Range, Reader};
use super::*;
use flate2::write::GzEncoder;
use flate2::Compression;
use std::io::Write;

const EVENTS: &str = include_str!("../../../tests/fixtures/audit/events.jsonl");
const ROLLOUT: &str = include_str!("../../../tests/fixtures/audit/metadata-rollout.jsonl");

fn line(n: usize) -> &'static str {
    EVENTS.lines().nth(n - 1).expect("test data")
}

#[test]
fn rfc3339_times() {
    let base = 1_777_629_600_000; // 2026-05-01T10:00:00Z
    let cases = [
        ("2026-05-01T10:00:00Z", Some(base)),
        ("2026-05-01T10:00:00.123456Z", Some(base + 123)),
        ("2026-05-01T10:00:00.1Z", Some(base + 100)),
        ("2026-05-01T10:00:00.999999999Z", Some(base + 999)),
        ("2026-05-01T12:00:00+02:00", Some(base)),
        ("2026-05-01T09:30:00.5-00:30", Some(base + 500)),
        ("1970-01-01T00:00:00Z", Some(0)),
        ("2024-02-29T00:00:00Z", Some(1_709_164_800_000)),
        ("2026-05-01T10:00:00", None),
        ("2026-13-01T10:00:00Z", None),
        ("2026-05-01T10:00:00.Z", None),
        ("yesterday", None),
        ("", None),
    ];
    for (text, want) in cases {
        assert_eq!(parse_rfc3339_ms(text), want, "{text}");
    }
}

#[test]
fn each_fixture_line_is_read_as_expected() {
    let req = |n: usize| match read_line(line(n).as_bytes()) {
        Line::Request(r) => r,
        other => panic!("line {n}: {other:?}"),
    };
    let r = req(1);
    assert_eq!(
        (r.what, r.namespace.as_str(), r.name.as_str()),
        (What::PodDelete, "shop", "db-2")
    );
    assert!(!r.from_node);
    assert_eq!(
        r.received,
        parse_rfc3339_ms("2026-05-01T10:00:01.100Z").expect("test data")
    );
    assert_eq!(r.stage, r.received + 8);
    assert!(req(2).from_node);
    assert_eq!(req(3).what, What::PodCreate);
    assert_eq!(req(4).what, What::Binding);
    let r = req(5);
    assert_eq!(
        (r.what, r.name.as_str(), r.level),
        (What::PodCreate, "", Level::Request)
    );
    assert_eq!(r.owner_kind.as_deref(), Some("ReplicaSet"));
    assert_eq!(r.generate_name.as_deref(), Some("front-7d9f8c6b5-"));
    assert_eq!(req(7).what, What::Eviction);
    assert_eq!(req(8).what, What::PodDelete);
    assert_eq!(req(9).what, What::StatefulSetWrite { partition: Some(3) });
    assert_eq!(req(10).what, What::StatefulSetWrite { partition: Some(1) });
    let set_aside = [
        (11, Line::NotDisruptive(NotDisruptive::NotSuccessful)),
        (12, Line::NotDisruptive(NotDisruptive::OtherStage)),
        (13, Line::Skipped(Skip::UnknownApiVersion)),
        (14, Line::NotDisruptive(NotDisruptive::Other)),
        (15, Line::Skipped(Skip::Malformed)),
        (16, Line::Skipped(Skip::NoTimestamp)),
    ];
    for (n, want) in set_aside {
        assert_eq!(read_line(line(n).as_bytes()), want, "line {n}");
    }
    assert_eq!(
        read_line(b"not json at all"),
        Line::Skipped(Skip::Malformed)
    );
    assert_eq!(read_line(b""), Line::Skipped(Skip::Malformed));
}

fn reader_of(texts: Vec<Vec<u8>>) -> Reader {
    let inputs = texts
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let r: Box<dyn std::io::Read> = Box::new(std::io::Cursor::new(t));
            (format!("f{i}"), from_reader(r).expect("test data"))
        })
        .collect();
    Reader::new(inputs, Range::default())
}

fn attribute(reader: &mut Reader) -> Attributor {
    let mut a = Attributor::default();
    for r in reader.by_ref() {
        a.push(r);
    }
    a.finish();
    a
}

#[test]
fn every_line_is_counted_once() {
    for text in [EVENTS, ROLLOUT] {
        let mut reader = reader_of(vec![text.as_bytes().to_vec()]);
        let a = attribute(&mut reader);
        let c = &reader.counts;
        assert_eq!(c.lines, text.lines().count() as u64);
        assert_eq!(
            c.lines,
            c.requests + c.not_disruptive_total() + c.skipped_total() + c.out_of_range
        );
        let dropped: u64 = a.dropped.values().sum();
        assert_eq!(c.requests, a.replayed + dropped);
    }
}

#[test]
fn fixture_events_are_attributed() {
    let mut reader = reader_of(vec![EVENTS.as_bytes().to_vec()]);
    let a = attribute(&mut reader);
    let kinds: Vec<(Kind, &str)> = a.events.iter().map(|e| (e.kind, e.name.as_str())).collect();
    assert_eq!(
        kinds,
        [
            (Kind::Deletions, "db-2"),
            (Kind::Creations, "db-2"),
            (Kind::Starts, "db-2"),
            // The generateName creation took its pod's name from the binding.
            (Kind::Creations, "front-7d9f8c6b5-x2kqp"),
            (Kind::Starts, "front-7d9f8c6b5-x2kqp"),
            (Kind::Evictions, "front-5c4b9d7f8-abcde"),
            // partition 3 -> 1: two steps.
            (Kind::PartitionSteps, "db"),
            (Kind::PartitionSteps, "db"),
        ]
    );
    assert_eq!(a.events[1].set, Some(("db".into(), 2)));
    assert_eq!(
        a.events[2].set,
        Some(("db".into(), 2)),
        "binding inherits the set"
    );
    assert_eq!(a.dropped.get(&Dropped::NodeDelete), Some(&1));
    // The admin's DELETE after the eviction is the final delete of a terminating pod.
    assert_eq!(a.dropped.get(&Dropped::FinalDelete), Some(&1));
    // The first partition write sets the partition, lowers nothing.
    assert_eq!(a.dropped.get(&Dropped::NotAStep), Some(&1));
    assert_eq!(reader.counts.first_skipped[&Skip::Malformed], vec!["f0:15"]);
    assert_eq!(
        reader.counts.first_skipped[&Skip::UnknownApiVersion],
        vec!["f0:13"]
    );
}

/// Builds a Metadata-level pod event line.
fn pod_line(verb: &str, sub: &str, ns: &str, name: &str, user: &str, received_ms: u64) -> String {
    let t = |ms: u64| {
        format!(
            "2026-05-01T10:{:02}:{:02}.{:03}Z",
            ms / 60_000,
            ms / 1000 % 60,
            ms % 1000
        )
    };
    let sub = if sub.is_empty() {
        String::new()
    } else {
        format!(",\"subresource\":\"{sub}\"")
    };
    format!(
        "{{\"kind\":\"Event\",\"apiVersion\":\"audit.k8s.io/v1\",\"level\":\"Metadata\",\"stage\":\"ResponseComplete\",\
         \"verb\":\"{verb}\",\"user\":{{\"username\":\"{user}\",\"groups\":[\"system:authenticated\"]}},\
         \"objectRef\":{{\"resource\":\"pods\",\"namespace\":\"{ns}\",\"name\":\"{name}\"{sub}}},\
         \"responseStatus\":{{\"code\":200}},\"requestReceivedTimestamp\":\"{}\",\"stageTimestamp\":\"{}\"}}",
        t(received_ms),
        t(received_ms + 5)
    )
}

#[test]
fn final_deletion_rules() {
    let rs = attribute::REPLICASET_CONTROLLER;
    // (lines, deletions+evictions replayed, final deletes, node deletes)
    let cases: Vec<(Vec<String>, usize, u64, u64)> = vec![
        // A second DELETE of the same pod before it is re-created: final.
        (
            vec![
                pod_line("delete", "", "a", "p", rs, 0),
                pod_line("delete", "", "a", "p", "admin", 100),
            ],
            1,
            1,
            0,
        ),
        // Re-created in between: two first deletions.
        (
            vec![
                pod_line("delete", "", "a", "p", rs, 0),
                pod_line("create", "", "a", "p", rs, 50),
                pod_line("delete", "", "a", "p", rs, 100),
            ],
            2,
            0,
            0,
        ),
        // An eviction then a DELETE: the DELETE is final.
        (
            vec![
                pod_line("create", "eviction", "a", "p", "admin", 0),
                pod_line("delete", "", "a", "p", "admin", 100),
            ],
            1,
            1,
            0,
        ),
        // The node's DELETE is never a first deletion.
        (
            vec![pod_line("delete", "", "a", "p", "system:node:n1", 0)],
            0,
            0,
            1,
        ),
        // Same name in another namespace: another pod.
        (
            vec![
                pod_line("delete", "", "a", "p", rs, 0),
                pod_line("delete", "", "b", "p", rs, 10),
            ],
            2,
            0,
            0,
        ),
    ];
    for (i, (lines, replayed, finals, nodes)) in cases.into_iter().enumerate() {
        let mut reader = reader_of(vec![lines.join("\n").into_bytes()]);
        let a = attribute(&mut reader);
        let n = a
            .events
            .iter()
            .filter(|e| matches!(e.kind, Kind::Deletions | Kind::Evictions))
            .count();
        assert_eq!(n, replayed, "case {i}");
        assert_eq!(
            a.dropped.get(&Dropped::FinalDelete).copied().unwrap_or(0),
            finals,
            "case {i}"
        );
        assert_eq!(
            a.dropped.get(&Dropped::NodeDelete).copied().unwrap_or(0),
            nodes,
            "case {i}"
        );
    }
}

#[test]
fn generate_name_creations_pair_with_bindings_in_order() {
    let rs = attribute::REPLICASET_CONTROLLER;
    let lines = [
        pod_line("create", "", "a", "", rs, 0),
        pod_line("create", "", "a", "", rs, 10),
        pod_line("create", "", "b", "", rs, 20),
        // An old pod's deletion must not take a new pod's creation.
        pod_line("delete", "", "a", "web-old-zzzzz", rs, 30),
        pod_line(
            "create",
            "binding",
            "a",
            "web-new-aaaaa",
            "system:kube-scheduler",
            40,
        ),
        pod_line(
            "create",
            "binding",
            "a",
            "web-new-bbbbb",
            "system:kube-scheduler",
            50,
        ),
        pod_line(
            "create",
            "binding",
            "c",
            "other-ccccc",
            "system:kube-scheduler",
            60,
        ),
    ];
    let mut reader = reader_of(vec![lines.join("\n").into_bytes()]);
    let a = attribute(&mut reader);
    let created: Vec<&str> = a
        .events
        .iter()
        .filter(|e| e.kind == Kind::Creations)
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(created, ["web-new-aaaaa", "web-new-bbbbb", ""]);
    assert_eq!(
        a.unattributed.get(&Unattributed::GenerateNameUnpaired),
        Some(&1)
    );
    assert_eq!(
        a.unattributed.get(&Unattributed::CreatedBeforeLog),
        Some(&1)
    );
}

fn gzip(text: &str) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::fast());
    e.write_all(text.as_bytes()).expect("test data");
    e.finish().expect("test data")
}

#[test]
fn gzip_members_concatenated_read_like_the_plain_file() {
    let lines: Vec<&str> = ROLLOUT.lines().collect();
    let half = lines.len() / 2;
    let mut data = gzip(&(lines[..half].join("\n") + "\n"));
    data.extend(gzip(&(lines[half..].join("\n") + "\n")));
    let mut gz = reader_of(vec![data]);
    let mut plain = reader_of(vec![ROLLOUT.as_bytes().to_vec()]);
    let a: Vec<_> = gz.by_ref().collect();
    let b: Vec<_> = plain.by_ref().collect();
    assert_eq!(a, b);
    assert_eq!(gz.counts.lines, lines.len() as u64);
    assert!(gz.counts.truncated.is_empty());
}

#[test]
fn cut_gzip_is_reported_and_its_head_replayed() {
    let data = gzip(ROLLOUT);
    let cut = data[..data.len() * 2 / 3].to_vec();
    let mut reader = reader_of(vec![cut]);
    let got = reader.by_ref().count();
    let c = &reader.counts;
    assert_eq!(c.truncated.len(), 1, "{:?}", c.truncated);
    assert!(c.truncated[0].starts_with(&format!("f0: truncated after line {}", c.lines)));
    assert!(got > 0 && c.lines > 0 && c.lines < ROLLOUT.lines().count() as u64);
}

#[test]
fn files_merge_in_received_order_and_lines_reorder_within_the_slack() {
    let rs = attribute::REPLICASET_CONTROLLER;
    // One API server logs in stage order: a long request received first comes last.
    let one = [
        pod_line("delete", "", "a", "p2", rs, 2_000),
        pod_line("delete", "", "a", "p1", rs, 1_000),
        pod_line("delete", "", "a", "p5", rs, 5_000),
    ]
    .join("\n");
    let two = [
        pod_line("delete", "", "a", "p3", rs, 3_000),
        pod_line("delete", "", "a", "p4", rs, 4_000),
    ]
    .join("\n");
    let mut reader = reader_of(vec![one.into_bytes(), two.into_bytes()]);
    let names: Vec<String> = reader.by_ref().map(|r| r.name).collect();
    assert_eq!(names, ["p1", "p2", "p3", "p4", "p5"]);
    assert_eq!(reader.counts.reordered_late, 0);
}

#[test]
fn since_and_until_keep_a_range() {
    let rs = attribute::REPLICASET_CONTROLLER;
    let text = (0..10)
        .map(|i| pod_line("delete", "", "a", &format!("p{i}"), rs, i * 1000))
        .collect::<Vec<_>>()
        .join("\n");
    let base = parse_rfc3339_ms("2026-05-01T10:00:00Z").expect("test data");
    let inputs = vec![(
        "f".to_string(),
        from_reader(Box::new(std::io::Cursor::new(text.into_bytes()))).expect("test data"),
    )];
    let range = Range {
        since: Some(base + 3000),
        until: Some(base + 7000),
    };
    let mut reader = Reader::new(inputs, range);
    let names: Vec<String> = reader.by_ref().map(|r| r.name).collect();
    assert_eq!(names, ["p3", "p4", "p5", "p6"]);
    assert_eq!(reader.counts.out_of_range, 6);
}

fn replay_text(text: &str, opt_in: &[&str]) -> Replay {
    let opts = Options {
        opt_in: opt_in.iter().map(|s| s.to_string()).collect(),
        ..Options::default()
    };
    let inputs = vec![(
        "f".to_string(),
        from_reader(Box::new(std::io::Cursor::new(text.as_bytes().to_vec()))).expect("test data"),
    )];
    run(&opts, inputs).expect("test data")
}

/// 40 StatefulSets of 3 rolled at once: far over the built-in 20 per 10 s unpaced.
fn heavy_rollout() -> String {
    heavy_rollouts(1)
}

/// `rounds` of [`heavy_rollout`], 10 minutes apart.
fn heavy_rollouts(rounds: u64) -> String {
    let sts = attribute::STATEFULSET_CONTROLLER;
    let mut lines = Vec::new();
    for round in 0..rounds {
        let base = round * 600_000;
        for s in 0..40u64 {
            let ns = format!("t{}", s % 7);
            let set = format!("db{s}");
            let write = pod_line("patch", "", &ns, &set, "admin", base)
                .replace("\"resource\":\"pods\"", "\"resource\":\"statefulsets\"");
            lines.push(write);
            let mut t = base + 100 + s;
            for o in (0..3).rev() {
                let pod = format!("{set}-{o}");
                lines.push(pod_line("delete", "", &ns, &pod, sts, t));
                lines.push(pod_line("create", "", &ns, &pod, sts, t + 2000));
                lines.push(pod_line(
                    "create",
                    "binding",
                    &ns,
                    &pod,
                    "system:kube-scheduler",
                    t + 2050,
                ));
                t += 2050 + 3000;
            }
        }
    }
    let mut sorted: Vec<(u64, String)> = lines
        .into_iter()
        .map(|l| {
            let at = l.find("stageTimestamp").expect("test data");
            (
                parse_rfc3339_ms(&l[at + 17..at + 41]).expect("test data"),
                l,
            )
        })
        .collect();
    sorted.sort();
    sorted
        .into_iter()
        .map(|(_, l)| l)
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_set_rolled_twice_is_re_simulated_twice() {
    let r = replay_text(&heavy_rollouts(2), &[]);
    assert_eq!(r.paced.workloads[&engine::Treatment::Resimulated].len(), 80);
    let x = row(&r, Kind::Deletions);
    assert_eq!((x.events, x.paced_events), (240, 240));
    assert!(x.paced_peak <= 20, "{x:?}");
    assert_eq!(row(&r, Kind::PartitionSteps).paced_events, 240);
}

fn row(r: &Replay, kind: Kind) -> report::Row {
    report::rows(r)
        .into_iter()
        .find(|x| x.kind == kind)
        .expect("test data")
}

#[test]
fn heavy_rollout_is_paced_within_the_built_in_limit() {
    let r = replay_text(&heavy_rollout(), &[]);
    for kind in [Kind::Deletions, Kind::Starts, Kind::PartitionSteps] {
        let x = row(&r, kind);
        assert_eq!(x.events, 120, "{kind:?}");
        assert_eq!(x.paced_events, 120, "{kind:?}");
        assert!(x.recorded_peak > 20, "{kind:?} {x:?}");
        assert!(x.paced_peak <= 20, "{kind:?} {x:?}");
        assert!(x.paced_makespan_s > x.recorded_makespan_s, "{kind:?} {x:?}");
    }
    // 120 steps at 20 per 10 s take at least 50 s.
    assert!(
        row(&r, Kind::Deletions)
            .paced_makespan_s
            .expect("test data")
            >= 50.0
    );
    assert_eq!(r.paced.workloads[&engine::Treatment::Resimulated].len(), 40);
    let steps = r
        .paced
        .rules
        .get(&("statefulset-rollouts".to_string(), "step".to_string()));
    assert_eq!(steps, Some(&120));
}

#[test]
fn namespaces_not_opted_in_are_not_paced() {
    let r = replay_text(&heavy_rollout(), &["nobody"]);
    let x = row(&r, Kind::Deletions);
    assert!(x.paced_peak > 20, "{x:?}");
    assert!(r.paced.rules.is_empty(), "{:?}", r.paced.rules);
}

#[test]
fn same_input_same_output() {
    let a = replay_text(ROLLOUT, &[]);
    let b = replay_text(ROLLOUT, &[]);
    assert_eq!(report::text(&a), report::text(&b));
    assert_eq!(
        report::csv(&report::rows(&a)),
        report::csv(&report::rows(&b))
    );
}

#[test]
fn csv_has_one_row_per_kind() {
    let r = replay_text(ROLLOUT, &[]);
    let csv = report::csv(&report::rows(&r));
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("kind,events,paced_events,recorded_peak,paced_peak,recorded_makespan_s,paced_makespan_s")
    );
    let kinds: Vec<&str> = lines
        .map(|l| l.split(',').next().expect("test data"))
        .collect();
    assert_eq!(
        kinds,
        [
            "creations",
            "starts",
            "deletions",
            "evictions",
            "partition_steps"
        ]
    );
}

#[test]
fn a_log_without_pod_events_says_what_to_record() {
    let text = line(14).to_string() + "\n";
    let inputs = vec![(
        "f".to_string(),
        from_reader(Box::new(std::io::Cursor::new(text.into_bytes()))).expect("test data"),
    )];
    let err = run(&Options::default(), inputs).err().expect("test data");
    let nothing = err.downcast_ref::<NothingReplayed>().expect("test data");
    assert!(nothing.0.contains("pods/binding"), "{}", nothing.0);
    assert!(nothing.0.contains("level: Metadata"), "{}", nothing.0);
}

proptest::proptest! {
    /// Any mix of fixture lines, cut anywhere or with bytes flipped, never panics and
    /// every line lands in exactly one count.
    #[test]
    fn any_input_is_counted_line_by_line(
        picks in proptest::collection::vec((0usize..16, 0usize..4000, proptest::prelude::any::<u8>()), 0..40)
    ) {
        let lines: Vec<&str> = EVENTS.lines().collect();
        let mut text = Vec::new();
        for (n, cut, byte) in &picks {
            let mut l = lines[*n].as_bytes().to_vec();
            match cut % 3 {
                0 => l.truncate(cut % (l.len() + 1)),
                1 => {
                    let at = cut % l.len();
                    l[at] = if *byte == b'\n' { b' ' } else { *byte };
                }
                _ => {}
            }
            text.extend_from_slice(&l);
            text.push(b'\n');
        }
        let mut reader = reader_of(vec![text]);
        let a = attribute(&mut reader);
        let c = &reader.counts;
        proptest::prop_assert_eq!(c.lines, picks.len() as u64);
        proptest::prop_assert_eq!(
            c.lines,
            c.requests + c.not_disruptive_total() + c.skipped_total() + c.out_of_range
        );
        let dropped: u64 = a.dropped.values().sum();
        proptest::prop_assert_eq!(c.requests, a.replayed + dropped);
    }
}

/// Many short-lived workloads over a long log (20,000 of them, one a second: 5.5 hours):
/// what the attributor keeps per pod follows the pods in flight within its horizon, not
/// the log's length. Counted in entries.
#[test]
fn per_pod_state_is_bounded_by_the_pods_in_flight() {
    use super::attribute::{POD_STATE_HORIZON_MS, REPLICASET_CONTROLLER};
    use super::audit::Request;
    let request = |what, ns: &str, name: &str, user: &str, from_node, at| Request {
        what,
        namespace: ns.to_string(),
        name: name.to_string(),
        user: user.to_string(),
        from_node,
        received: at,
        stage: at + 5,
        level: Level::Metadata,
        owner_kind: None,
        generate_name: None,
    };
    let step: u64 = 1_000;
    let workloads: u64 = 20_000;
    let mut a = Attributor::default();
    let mut most = 0;
    for w in 0..workloads {
        let t = 1_000_000 + w * step;
        let ns = format!("ns-{}", w % 50);
        let job = format!("job-{w}");
        let web = format!("web-{w}-x");
        let rs = REPLICASET_CONTROLLER;
        for r in [
            // A pod created by name: bound, deleted, the node's final delete.
            request(What::PodCreate, &ns, &job, "admin", false, t),
            request(What::Binding, &ns, &job, "scheduler", false, t + 10),
            request(What::PodDelete, &ns, &job, "admin", false, t + 500),
            request(What::PodDelete, &ns, &job, "system:node:n", true, t + 600),
            // A generateName pod, paired by its binding, then deleted.
            request(What::PodCreate, &ns, "", rs, false, t + 1),
            request(What::Binding, &ns, &web, "scheduler", false, t + 20),
            request(What::PodDelete, &ns, &web, rs, false, t + 700),
            // A generateName pod never bound.
            request(What::PodCreate, &ns, "", rs, false, t + 2),
        ] {
            a.push(r);
            most = most.max(a.retained());
        }
    }
    a.finish();
    // Per second of log, kept for the horizon (plus the second the unnamed ones wait):
    // two deleted pods (each a state and a horizon entry) and two unnamed creations (a
    // binding pairs with the oldest one waiting, so the one left is another, one a second).
    let bound = 6 * (POD_STATE_HORIZON_MS / step + 2) as usize;
    assert!(
        most <= bound,
        "kept {most} entries at most, bound {bound} (the log has {workloads} workloads)"
    );
    assert!(
        workloads as usize * 6 > 10 * bound,
        "the log is long against the bound"
    );
    // Nothing is lost from the counts: every unbound creation is counted as unpaired.
    assert_eq!(
        a.unattributed.get(&Unattributed::GenerateNameUnpaired),
        Some(&workloads)
    );
    assert_eq!(
        a.events.iter().filter(|e| e.kind == Kind::Starts).count() as u64,
        2 * workloads
    );
}

/// The built-in rules are adaptive: a step's replacement pod needs room in the network
/// window, which the pods adaptive gate rules still hold gated take first (as the real
/// partition releaser computes it). 40 ReplicaSet pods created just after the rollout's
/// writes fill it: the steps taken before they came are all until they are all but
/// released (on the real control plane: 5 steps, then none while a Deployment's 60 pods
/// were gated; docs/simulator.md).
#[test]
fn steps_wait_while_gated_pods_fill_the_network_window() {
    let rs = attribute::REPLICASET_CONTROLLER;
    let mut text = heavy_rollout();
    for i in 0..40u64 {
        let pod = format!("web-5d9f-{i}");
        text.push('\n');
        text += &pod_line("create", "", "t0", &pod, rs, 10 + i);
        text.push('\n');
        text += &pod_line(
            "create",
            "binding",
            "t0",
            &pod,
            "system:kube-scheduler",
            60 + i,
        );
    }
    let r = replay_text(&text, &[]);
    let rs_starts = &r.paced.by_controller[&(Kind::Starts, attribute::Controller::ReplicaSet)];
    assert_eq!(rs_starts.len(), 40);
    // Steps have room while STEP_ROOM_GAIN x the window exceeds the pods in flight and
    // gated: the window starts at 4 (room 16 against 40 gated) and grows by one with each
    // binding (a sample at its floor), so no step goes before the k-th binding with
    // 4 x (4 + k) <= 40 - k, k < 5; once the window has grown, steps go while ReplicaSet
    // pods still wait.
    use crate::pacing::network::{INITIAL_WINDOW, STEP_ROOM_GAIN};
    let (gain, start) = (STEP_ROOM_GAIN as usize, INITIAL_WINDOW as usize);
    let blocked = (0..40).take_while(|k| gain * (start + k) <= 40 - k).count();
    assert!(blocked >= 4, "{blocked}");
    let steps = &r.paced.times[&Kind::PartitionSteps];
    let (from, until) = (rs_starts[0] + 1, rs_starts[blocked - 1]);
    let meanwhile: Vec<_> = steps.iter().filter(|&&t| t > from && t < until).collect();
    assert!(
        meanwhile.is_empty(),
        "steps {meanwhile:?} while the window was too small for the gated pods ({from}..{until})"
    );
    assert!(
        steps.iter().any(|&t| t > until && t < rs_starts[20]),
        "steps once the window has grown, while ReplicaSet pods still wait"
    );
    assert!(
        steps.iter().any(|&t| t <= from),
        "some steps before the pods came"
    );
    let x = row(&r, Kind::PartitionSteps);
    assert_eq!(x.paced_events, 120);
    assert!(x.paced_peak <= 20, "{x:?}");
}
