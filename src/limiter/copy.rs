//! Scratch copies of a limiter's windows, to run releases forward on (crate::queue)
//! without touching the limiter the webhook and the releaser charge. Apart from mod.rs,
//! which is long enough, and a child of it, so it reads the buckets directly.

use super::Limiter;

impl Limiter {
    /// A limiter holding copies of the buckets of the rules `keep` accepts, and nothing
    /// else (no reservations; their slots are charges in the buckets already): a scratch
    /// copy to run releases forward on without touching this one (crate::queue).
    pub fn copy_rules(&self, keep: impl Fn(&str) -> bool) -> Limiter {
        let mut copy = Limiter::new(self.max_buckets);
        copy.buckets = self
            .buckets
            .iter()
            .filter(|(key, _)| keep(&key.rule))
            .map(|(key, bucket)| (key.clone(), bucket.clone()))
            .collect();
        copy
    }

    /// [`Limiter::copy_rules`] of one rule.
    pub fn copy_rule(&self, rule: &str) -> Limiter {
        self.copy_rules(|r| r == rule)
    }
}
