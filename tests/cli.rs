//! The binary's commands as a user runs them: check-config and default-policy.

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
        .take(4)
        .map_while(Result::ok)
        .collect();
    let text = lines.join("\n");
    assert!(
        text.contains("curl --cacert") && text.contains("/validate"),
        "{text}"
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
