//! The README documents every metric the code registers.

#[test]
fn every_metric_is_documented_in_the_readme() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md"))
        .unwrap_or_else(|e| panic!("README.md: {e}"));
    let source = std::fs::read_to_string(format!("{root}/src/metrics.rs"))
        .unwrap_or_else(|e| panic!("metrics.rs: {e}"));
    // Metric names are the string literals that start with the project prefix.
    let names: Vec<&str> = source
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.starts_with("churn_throttler_")
                && s.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        })
        .collect();
    assert!(
        names.len() >= 20,
        "found only {} metric names in src/metrics.rs",
        names.len()
    );
    for name in names {
        assert!(
            readme.contains(&format!("`{name}`")),
            "{name} is not in the README's metrics table"
        );
    }
}
