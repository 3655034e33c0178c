//! The README documents every metric the registry exposes.

use churn_throttler::metrics::Metrics;

#[test]
fn every_metric_is_documented_in_the_readme() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .unwrap_or_else(|e| panic!("README.md: {e}"));
    let metrics = Metrics::new();
    let families = metrics.registry().gather();
    assert!(
        families.len() >= 15,
        "registry has {} families",
        families.len()
    );
    for family in families {
        let name = family.name();
        assert!(name.starts_with("churn_throttler_"), "{name}");
        assert!(
            readme.contains(&format!("`{name}`")),
            "{name} is not in the README's metrics table"
        );
    }
}
