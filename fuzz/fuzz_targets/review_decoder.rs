//! Bytes -> AdmissionReview (serde_json, as the server decodes it) -> classify -> decide
//! -> response, on both endpoints, against the built-in policy and a budget-scaled one.
//! Anything may be refused; nothing may panic.
#![no_main]

use churn_throttler::admission::{classify, decide, respond, Endpoint};
use churn_throttler::budget::{scale_policy, GateRole, Share};
use churn_throttler::limiter::Limiter;
use churn_throttler::policy::Policy;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use kube::core::DynamicObject;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn policies() -> &'static [Policy; 2] {
    static POLICIES: OnceLock<[Policy; 2]> = OnceLock::new();
    POLICIES.get_or_init(|| {
        let builtin = Policy::builtin();
        let scaled = scale_policy(&builtin, Share::Counted { replicas: 3 }, GateRole::Follower);
        [builtin, scaled]
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(review) = serde_json::from_slice::<AdmissionReview<DynamicObject>>(data) else {
        return;
    };
    // kube implements TryInto (not TryFrom) for this conversion, as the server uses it.
    let converted: Result<AdmissionRequest<DynamicObject>, _> = review.try_into();
    let Ok(request) = converted else {
        return;
    };
    let _ = classify(&request);
    let now = 1_800_000_000_000;
    for policy in policies() {
        let mut limiter = Limiter::new(64);
        // Three rounds: admitted, then reserved or refused, then claimed or retried.
        for (round, endpoint) in [Endpoint::Validate, Endpoint::Mutate, Endpoint::Validate]
            .into_iter()
            .enumerate()
        {
            let decision = decide(
                &request,
                endpoint,
                policy,
                &mut limiter,
                now + round as u64 * 1_500,
            );
            let answer = respond(&request, &decision).into_review();
            let _ = serde_json::to_vec(&answer);
        }
        let _ = limiter.sweep(now + 3_600_000);
    }
});
