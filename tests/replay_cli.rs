//! `simulate --replay` as a user runs it: exit codes 0 (replayed), 1 (nothing could be),
//! 2 (usage), gzip from stdin, and the CSV and SVG it writes.

use std::io::Write;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_churn-throttler");
const FIXTURE: &str = "tests/fixtures/audit/metadata-rollout.jsonl";

fn replay(args: &[&str], stdin: Option<Vec<u8>>) -> (i32, String, String) {
    let mut child = Command::new(BIN)
        .arg("simulate")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the binary");
    let mut pipe = child.stdin.take().expect("stdin");
    pipe.write_all(&stdin.unwrap_or_default())
        .expect("write stdin");
    drop(pipe);
    let out = child.wait_with_output().expect("wait");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn replays_a_file_and_writes_csv_and_svg() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("r.csv");
    let svg = dir.path().join("r.svg");
    let (code, out, err) = replay(
        &[
            "--replay",
            FIXTURE,
            "--csv",
            csv.to_str().expect("utf-8"),
            "--plot",
            svg.to_str().expect("utf-8"),
        ],
        None,
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("partition_steps"), "{out}");
    let csv = std::fs::read_to_string(csv).expect("csv");
    // The header, one row per kind, then per kind and controller (`starts:StatefulSet`).
    let kinds: Vec<&str> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').next().unwrap_or(""))
        .collect();
    assert_eq!(
        kinds[..5],
        [
            "creations",
            "starts",
            "deletions",
            "evictions",
            "partition_steps"
        ],
        "{csv}"
    );
    assert!(kinds.len() > 5, "{csv}");
    for k in &kinds[5..] {
        let (kind, controller) = k.split_once(':').expect("kind:controller");
        assert!(
            kinds[..5].contains(&kind) && !controller.is_empty(),
            "{csv}"
        );
    }
    assert!(std::fs::read_to_string(svg).expect("svg").contains("<svg"));
}

#[test]
fn gzip_on_stdin_reads_like_the_file() {
    let text = std::fs::read(FIXTURE).expect("fixture");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&text).expect("gzip");
    let (code, from_stdin, err) = replay(&["--replay", "-"], Some(gz.finish().expect("gzip")));
    assert_eq!(code, 0, "{err}");
    let (_, from_file, _) = replay(&["--replay", FIXTURE], None);
    // Everything but the wall-time line.
    let table = |s: &str| {
        s.lines()
            .filter(|l| !l.contains(" s wall"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert!(table(&from_file).len() > 10, "{from_file}");
    assert_eq!(table(&from_stdin), table(&from_file));
}

#[test]
fn nothing_to_replay_exits_1_with_the_audit_policy_lines() {
    let other = "{\"kind\":\"Event\",\"apiVersion\":\"audit.k8s.io/v1\",\"level\":\"Metadata\",\"stage\":\"ResponseComplete\",\"verb\":\"get\",\"objectRef\":{\"resource\":\"configmaps\",\"namespace\":\"a\",\"name\":\"c\"},\"responseStatus\":{\"code\":200},\"requestReceivedTimestamp\":\"2026-05-01T10:00:00Z\"}\n";
    let (code, _, err) = replay(&["--replay", "-"], Some(other.repeat(3).into_bytes()));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("pods/eviction"), "{err}");
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["--replay", FIXTURE, "--since", "yesterday"][..],
        &["--replay", "/nonexistent/audit.log"][..],
        &["--replay", FIXTURE, "--policy", "/nonexistent/policy.yaml"][..],
        &["--since", "2026-05-01T10:00:00Z"][..],
    ] {
        let (code, _, err) = replay(args, None);
        assert_eq!(code, 2, "{args:?}: {err}");
    }
}
