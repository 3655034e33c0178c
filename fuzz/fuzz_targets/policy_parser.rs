//! Bytes -> Policy::from_yaml (what check-config and the reloader run on a policy file).
//! Any text may be refused with an error; nothing may panic or hang.
#![no_main]

use churn_throttler::policy::Policy;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match Policy::from_yaml(&text, "fuzz.yaml") {
        Ok(policy) => {
            let _ = policy.server_deadline();
            let _ = policy.longest_window();
            for rule in &policy.rules {
                for limit in &rule.limits {
                    let _ = limit.to_string();
                }
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
