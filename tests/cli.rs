//! The binary's commands as a user runs them: check-config, default-policy, serve --dev, demo,
//! status and release without a cluster, and the kubectl plugin name.

use std::process::Command;

fn binary() -> Command {
    Command::new(env!("CARGO_BIN_EXE_churn-throttler"))
}

#[test]
fn check_config_names_file_line_and_problem() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // (case, file content, expected exit success, text expected in the output)
    let cases = [
        ("valid", "rules:\n  - name: a\n    match: { resources: [pods], operations: [DELETE] }\n    limit: { events: 3, window: 1s }\n    action: deny\n", true, "ok, 1 rules"),
        ("typo", "rules:\n  - name: a\n    match: { resources: [pods], operations: [DELETE] }\n    limit: { events: 3, window: 1s }\n    acton: deny\n", false, ":5: rules[0]: unknown field `acton`"),
        ("semantic", "rules:\n  - name: a\n    match: { resources: [pods], operations: [DELETE] }\n    limit: { events: 3, window: 1s }\n    action: hold\n", false, ":5: rule \"a\": hold needs maxHold"),
        ("not yaml", "rules: [", false, ".yaml:2: did not find expected node content"),
    ];
    for (case, content, ok, needle) in cases {
        let path = dir.path().join(format!("{case}.yaml"));
        std::fs::write(&path, content).unwrap_or_else(|e| panic!("{e}"));
        let out = binary()
            .arg("check-config")
            .arg(&path)
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.success(), ok, "{case}: {text}");
        assert!(text.contains(needle), "{case}: {text}");
        assert!(
            text.contains(&path.display().to_string()),
            "{case}: names the file: {text}"
        );
    }
    let missing = binary()
        .args(["check-config", "/nonexistent/policy.yaml"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/policy.yaml: cannot read")
    );
}

/// Schedules: refused with the file and the window's line; a valid one prints what is in
/// force and the next changes, and warns of a window that never closes.
#[test]
fn check_config_checks_schedules_and_prints_the_next_changes() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let head = "rules:\n  - name: a\n    match: { resources: [pods], operations: [DELETE] }\n    limit: { events: 3, window: 1s }\n    action: retry-after\n    schedules:\n";
    // (case, windows, exit success, text expected in the output)
    let cases = [
        ("bad cron", "      - schedule: \"0 9 * * 1-5 *\"\n        duration: 8h\n        limit: { events: 0 }\n", false, ".yaml:7: rule \"a\": schedules[0]: schedule \"0 9 * * 1-5 *\": \"0 9 * * 1-5 *\" has 6 fields"),
        ("bad zone", "      - schedule: \"0 9 * * 1-5\"\n        timeZone: Europe/Nowhere\n        duration: 8h\n        limit: { events: 0 }\n", false, ".yaml:8: rule \"a\": schedules[0]: unknown time zone \"Europe/Nowhere\""),
        ("no duration", "      - schedule: \"0 9 * * 1-5\"\n        limit: { events: 0 }\n", false, ".yaml:7: rule \"a\": schedules[0] has no duration"),
        ("the issue's example", "      - schedule: \"0 9 * * 1-5\"\n        timeZone: Europe/Berlin\n        duration: 8h\n        limit: { events: 0 }\n      - schedule: \"0 1 * * *\"\n        duration: 3h\n        limit: { events: 50 }\n", true,
         "next changes:\n  2026-12-07T01:00:00.000Z  a: 50 per 1s (global), burst 2 (schedules[1] \"0 1 * * *\" UTC)\n  2026-12-07T04:00:00.000Z  a: 3 per 1s (global), burst 2 (the rule's own)\n  2026-12-07T08:00:00.000Z  a: paused until 2026-12-07T16:00:00.000Z (schedules[0] \"0 9 * * 1-5\" Europe/Berlin)"),
        ("always open", "      - schedule: \"0 * * * *\"\n        duration: 2h\n        limit: { events: 1 }\n", true, "warning: rule \"a\": schedules[0] (\"0 * * * *\" for 2h) lasts longer than the time between its starts: it is always open"),
    ];
    for (case, windows, ok, needle) in cases {
        let path = dir.path().join(format!("{}.yaml", case.replace(' ', "-")));
        std::fs::write(&path, format!("{head}{windows}")).unwrap_or_else(|e| panic!("{e}"));
        let out = binary()
            .arg("check-config")
            .arg(&path)
            .args(["--at", "2026-12-07T00:30:00Z"])
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.success(), ok, "{case}: {text}");
        assert!(text.contains(needle), "{case}: {text}");
        assert!(text.contains(&path.display().to_string()), "{case}: {text}");
    }
}

#[test]
fn the_built_in_policy_passes_its_own_check() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let out = binary()
        .arg("default-policy")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success());
    let path = dir.path().join("default.yaml");
    std::fs::write(&path, &out.stdout).unwrap_or_else(|e| panic!("{e}"));
    let check = binary()
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

#[test]
fn serve_without_certificates_says_what_to_do() {
    let out = binary()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .env_remove("CHURN_THROTTLER_TLS_CERT")
        .env_remove("CHURN_THROTTLER_TLS_KEY")
        .env("CHURN_THROTTLER_RELEASER", "false")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--tls-cert") && err.contains("--dev"), "{err}");
}

#[test]
fn serve_dev_answers_and_stops_cleanly_on_sigterm() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut child = binary()
        .args([
            "serve",
            "--dev",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .arg("--dev-dir")
        .arg(dir.path())
        .env("CHURN_THROTTLER_SHUTDOWN_DELAY", "300ms")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("stdout"));
    let lines: Vec<String> = BufReader::new(stdout)
        .lines()
        .take(5)
        .map_while(Result::ok)
        .collect();
    let text = lines.join("\n");
    assert!(
        text.contains("curl --cacert") && text.contains("/validate"),
        "{text}"
    );
    assert!(
        text.contains("churn-throttler demo"),
        "points to the demo: {text}"
    );
    assert!(dir.path().join("ca.crt").exists() && dir.path().join("sample-review.json").exists());
    let metrics = text
        .split_whitespace()
        .find(|w| w.starts_with("http://127.0.0.1:") && w.ends_with("/metrics"))
        .unwrap_or_else(|| panic!("no metrics address in {text}"))
        .to_string();
    let ready = std::process::Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &metrics.replace("/metrics", "/readyz"),
        ])
        .output();
    if let Ok(out) = ready {
        assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    }
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(killed.success());
    let mut status = None;
    for _ in 0..100 {
        if let Some(s) = child.try_wait().unwrap_or_else(|e| panic!("{e}")) {
            status = Some(s);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let status = status.unwrap_or_else(|| {
        let _ = child.kill();
        panic!("serve did not stop within 10 s of SIGTERM")
    });
    assert!(status.success(), "exit status {status}");
}

/// `demo` with a small count: it ends by itself, every pod is admitted once, the answers
/// include an admission at once, a hold and a 429 (10 deletions sent 100 ms apart against
/// 2 at once then one per 525 ms: the 7th waits past maxHold 2 s), and the admissions never
/// come more than the burst at once beyond the spacing, recomputed here from the lines.
#[test]
fn demo_shows_holds_429s_and_the_spacing_then_stops() {
    let mut child = binary()
        .args(["demo", "--count", "10", "--interval", "100ms"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    // Bounded: 10 pods at one per 525 ms plus Retry-After waits end well within this.
    let mut status = None;
    for _ in 0..600 {
        if let Some(s) = child.try_wait().unwrap_or_else(|e| panic!("{e}")) {
            status = Some(s);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let Some(status) = status else {
        let _ = child.kill();
        panic!("demo did not stop within 60 s");
    };
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // "   0.531s  web-5d9c7b8f6d-demo003  held 0.330s, allowed"
    let mut admitted: Vec<(f64, String)> = Vec::new();
    let (mut at_once, mut held, mut too_many) = (0, 0, 0);
    for line in text.lines().filter(|l| l.contains("-demo")) {
        let mut words = line.split_whitespace();
        let at: f64 = words
            .next()
            .and_then(|w| w.trim_end_matches('s').parse().ok())
            .unwrap_or_else(|| panic!("no time in {line:?}"));
        let pod = words.next().unwrap_or_else(|| panic!("no pod in {line:?}"));
        let rest: Vec<&str> = words.collect();
        match rest.first().copied() {
            Some("allowed") => at_once += 1,
            Some("held") => held += 1,
            Some("429,") => {
                too_many += 1;
                assert!(line.contains("Retry-After"), "{line}");
                continue;
            }
            _ => panic!("unexpected answer: {line:?}"),
        }
        admitted.push((at, pod.to_string()));
    }
    assert!(at_once >= 1 && held >= 1 && too_many >= 1, "{text}");
    let mut pods: Vec<&str> = admitted.iter().map(|(_, p)| p.as_str()).collect();
    pods.sort();
    pods.dedup();
    assert_eq!(pods.len(), 10, "each pod admitted once: {text}");
    assert_eq!(admitted.len(), 10, "{text}");
    // The spacing the policy keeps, at the answers: any run of consecutive admissions is at
    // most 2 (the burst) plus the 525 ms spacings between its ends (50 ms for the answer's trip).
    let times: Vec<f64> = {
        let mut t: Vec<f64> = admitted.iter().map(|(t, _)| *t).collect();
        t.sort_by(f64::total_cmp);
        t
    };
    for i in 0..times.len() {
        for j in i..times.len() {
            let spacings = ((times[j] - times[i] + 0.050) / 0.525).floor() as usize;
            let run = j - i + 1;
            assert!(
                run <= 2 + spacings,
                "{run} admissions between {}s and {}s: {text}",
                times[i],
                times[j]
            );
        }
    }
    let summary = text
        .lines()
        .find(|l| l.starts_with("summary:"))
        .unwrap_or_else(|| panic!("no summary: {text}"));
    assert!(summary.contains("10 pods admitted"), "{summary}");
    assert!(
        summary.contains("at most 2 at once, else one per 0.525s"),
        "{summary}"
    );
}

/// A kubeconfig whose API server is 127.0.0.1:1, where nothing listens.
fn unreachable_kubeconfig(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    let text = "apiVersion: v1\nkind: Config\nclusters:\n  - name: nowhere\n    cluster: { server: \"https://127.0.0.1:1\", insecure-skip-tls-verify: true }\nusers:\n  - name: someone\n    user: { token: \"t\" }\ncontexts:\n  - name: nowhere\n    context: { cluster: nowhere, user: someone, namespace: shop }\ncurrent-context: nowhere\n";
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
    path
}

#[test]
fn status_and_release_without_a_cluster_fail_in_one_line() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let kubeconfig = unreachable_kubeconfig(dir.path());
    // (case, arguments, KUBECONFIG, text expected in the one line)
    let missing = dir.path().join("missing");
    let cases: Vec<(&str, Vec<&str>, &std::path::Path, &str)> = vec![
        (
            "status, server not listening",
            vec!["status"],
            &kubeconfig,
            "churn-throttler status: cannot reach the API server at https://127.0.0.1:1: ",
        ),
        (
            "status -A -o json",
            vec!["status", "-A", "-o", "json"],
            &kubeconfig,
            "cannot reach the API server at https://127.0.0.1:1",
        ),
        (
            "status sts/db --wait",
            vec!["status", "sts/db", "--wait", "--timeout", "5s"],
            &kubeconfig,
            "cannot reach the API server at https://127.0.0.1:1",
        ),
        (
            "release pods",
            vec!["release", "pods", "-n", "shop"],
            &kubeconfig,
            "churn-throttler release: cannot reach the API server at https://127.0.0.1:1",
        ),
        (
            "no kubeconfig at all",
            vec!["status"],
            &missing,
            "churn-throttler status: no Kubernetes configuration: ",
        ),
    ];
    for (case, args, config, needle) in cases {
        let started = std::time::Instant::now();
        let out = binary()
            .args(&args)
            .env("KUBECONFIG", config)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{case}: {stderr}");
        assert!(out.stdout.is_empty(), "{case}: nothing on stdout");
        assert_eq!(stderr.lines().count(), 1, "{case}: one line: {stderr}");
        assert!(stderr.contains(needle), "{case}: {stderr}");
        assert!(
            started.elapsed().as_secs() < 20,
            "{case}: took {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn run_as_a_kubectl_plugin_it_is_churn_throttler() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let plugin = dir.path().join("kubectl-churn_throttler");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_churn-throttler"), &plugin)
        .unwrap_or_else(|e| panic!("{e}"));
    let help = Command::new(&plugin)
        .args(["status", "--help"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success(), "{text}");
    assert!(
        text.contains("Usage: kubectl churn-throttler status [OPTIONS] [TARGET]"),
        "{text}"
    );
    // The same commands: a status without a cluster fails as churn-throttler's does.
    let kubeconfig = unreachable_kubeconfig(dir.path());
    let out = Command::new(&plugin)
        .arg("status")
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the API server"));
}
