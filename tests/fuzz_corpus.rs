//! The fuzzing corpus (fuzz/corpus/, see docs/fuzzing.md) replayed on stable in every
//! `cargo test`: each input goes through what the fuzz targets run, and none may panic.

use churn_throttler::admission::{classify, decide, respond, Endpoint};
use churn_throttler::budget::{scale_policy, GateRole, Share};
use churn_throttler::limiter::Limiter;
use churn_throttler::policy::Policy;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use kube::core::DynamicObject;
use std::path::PathBuf;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("fuzz/corpus/{target}"));
    let mut inputs: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.is_file())
        .map(|path| {
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (path, bytes)
        })
        .collect();
    inputs.sort();
    inputs
}

#[test]
fn the_review_decoder_corpus_decides_without_panicking() {
    let builtin = Policy::builtin();
    let scaled = scale_policy(&builtin, Share::Counted { replicas: 3 }, GateRole::Follower);
    let inputs = corpus("review_decoder");
    assert!(inputs.len() >= 10, "{} inputs", inputs.len());
    let mut decided = 0;
    for (path, bytes) in &inputs {
        let Ok(review) = serde_json::from_slice::<AdmissionReview<DynamicObject>>(bytes) else {
            continue;
        };
        let converted: Result<AdmissionRequest<DynamicObject>, _> = review.try_into();
        let Ok(request) = converted else {
            continue;
        };
        let _ = classify(&request);
        for policy in [&builtin, &scaled] {
            let mut limiter = Limiter::new(64);
            for (round, endpoint) in [Endpoint::Validate, Endpoint::Mutate, Endpoint::Validate]
                .into_iter()
                .enumerate()
            {
                let now = 1_800_000_000_000 + round as u64 * 1_500;
                let decision = decide(&request, endpoint, policy, &mut limiter, now);
                let answer = respond(&request, &decision).into_review();
                serde_json::to_vec(&answer).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            }
        }
        decided += 1;
    }
    assert!(decided >= 10, "only {decided} inputs decoded");
}

#[test]
fn the_policy_parser_corpus_parses_or_says_why() {
    let inputs = corpus("policy_parser");
    assert!(inputs.len() >= 5, "{} inputs", inputs.len());
    let mut good = 0;
    for (path, bytes) in &inputs {
        let text = String::from_utf8_lossy(bytes);
        match Policy::from_yaml(&text, "corpus.yaml") {
            Ok(policy) => {
                let _ = policy.longest_window();
                good += 1;
            }
            Err(e) => assert!(
                e.to_string().starts_with("corpus.yaml:"),
                "{}: {e}",
                path.display()
            ),
        }
    }
    assert!(good >= 3, "only {good} policies parsed");
}
