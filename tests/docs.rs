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

fn read(path: &str) -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    std::fs::read_to_string(format!("{root}/{path}")).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The text between `<!-- NAME: begin -->` and `<!-- NAME: end -->` in `doc`, inside
/// one fenced ```yaml block.
fn marked_yaml_block<'a>(doc: &'a str, name: &str) -> &'a str {
    let begin = format!("<!-- {name}: begin -->\n```yaml\n");
    let end = format!("```\n<!-- {name}: end -->");
    let start = doc
        .find(&begin)
        .unwrap_or_else(|| panic!("no {begin:?} marker"))
        + begin.len();
    let len = doc[start..]
        .find(&end)
        .unwrap_or_else(|| panic!("no {end:?} marker"));
    &doc[start..start + len]
}

#[test]
fn the_readme_policy_block_is_the_built_in_policy() {
    let readme = read("README.md");
    let block = marked_yaml_block(&readme, "default-policy");
    let builtin = churn_throttler::policy::DEFAULT_POLICY_YAML;
    if block != builtin {
        let first = block
            .lines()
            .zip(builtin.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| block.lines().count().min(builtin.lines().count()));
        panic!(
            "the README's policy block differs from src/policy/default-policy.yaml at line {} \
             (README: {:?}, built-in: {:?}); copy `churn-throttler default-policy` into it",
            first + 1,
            block.lines().nth(first),
            builtin.lines().nth(first)
        );
    }
}

#[test]
fn the_readme_reference_policy_is_a_valid_policy() {
    let readme = read("README.md");
    let block = marked_yaml_block(&readme, "policy-reference");
    if let Err(e) = churn_throttler::policy::Policy::from_yaml(block, "README.md") {
        panic!("the README's reference policy does not load: {e}");
    }
}

/// The users a webhook configuration's matchConditions keep away from the webhook:
/// the list literal in the `not-from-an-exempt-user` condition.
fn users_skipped_by(webhooks_yaml: &str, file: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(webhooks_yaml) {
        let value = <serde_yaml::Value as serde::Deserialize>::deserialize(doc)
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let kind = value["kind"].as_str().unwrap_or_default().to_string();
        for hook in value["webhooks"].as_sequence().into_iter().flatten() {
            let conditions = hook["matchConditions"]
                .as_sequence()
                .unwrap_or_else(|| panic!("{file}: {kind} has no matchConditions"));
            let expression = conditions
                .iter()
                .find(|c| c["name"].as_str() == Some("not-from-an-exempt-user"))
                .and_then(|c| c["expression"].as_str())
                .unwrap_or_else(|| panic!("{file}: {kind} has no not-from-an-exempt-user"));
            let list = expression
                .split_once('[')
                .and_then(|(_, rest)| rest.split_once(']'))
                .map(|(list, _)| list)
                .unwrap_or_else(|| panic!("{file}: {kind}: no list in {expression:?}"));
            let mut users: Vec<String> = list
                .split(',')
                .map(|u| u.trim().trim_matches('\'').to_string())
                .filter(|u| !u.is_empty())
                .collect();
            users.sort();
            assert!(
                conditions.iter().any(|c| c["expression"].as_str()
                    == Some("!('system:nodes' in request.userInfo.groups)")),
                "{file}: {kind} does not skip the group system:nodes"
            );
            found.push(users);
        }
    }
    found
}

#[test]
fn match_conditions_skip_exactly_the_shipped_policy_exempt_users() {
    let policy = churn_throttler::policy::Policy::builtin();
    let mut exempt = policy.exempt.users.clone();
    exempt.sort();
    let file = "manifests/base/webhooks.yaml";
    let per_hook = users_skipped_by(&read(file), file);
    assert_eq!(
        per_hook.len(),
        2,
        "{file}: a validating and a mutating webhook"
    );
    for users in per_hook {
        assert_eq!(
            users, exempt,
            "{file}: matchConditions must skip exactly default-policy's exempt.users \
             (docs/operations.md: keeping matchConditions in step with the policy)"
        );
    }
}
