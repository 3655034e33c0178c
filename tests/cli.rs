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
