//! CreateNode idempotency keys: a node asked for and not answered is asked for again with the
//! same key, so Manager hands back the node the first call made instead of making a second.
//!
//! Every CreateNode carries a `request_id`. When the call gets no definite answer (a timeout, a
//! broken connection) Manager may or may not have made the node; the key is then kept as
//! *unanswered* under the intent it was for (a bundle replica, a spare target), and the next
//! CreateNode for that intent repeats it. A key whose node has since appeared in the mirror
//! (`Node.request_id`) is resolved and dropped: the operator sees that node the usual way.
//!
//! Pure: the caller passes the clock, what the mirror knows and how to make a fresh key. Memory
//! is bounded: at most [`MAX_PER_INTENT`] keys per intent, none older than [`KEEP_FOR`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long an unanswered key is repeated. Long past any request timeout: by then Manager has
/// either made the node (and the mirror shows it, which resolves the key) or never will.
pub const KEEP_FOR: Duration = Duration::from_secs(3600);

/// Unanswered keys kept per intent; the oldest go first.
pub const MAX_PER_INTENT: usize = 16;

/// Unanswered CreateNode keys by intent.
#[derive(Debug, Default, Clone)]
pub struct ProvisionKeys {
    unanswered: HashMap<String, Vec<(String, Instant)>>,
}

impl ProvisionKeys {
    /// The key for the next CreateNode made for `intent`: the oldest unanswered key of that
    /// intent whose node the mirror does not show (`known` says whether it does; those are
    /// dropped), else `fresh()`. The key returned is no longer kept: give it back with
    /// [`ProvisionKeys::unanswered`] if this call is not answered either.
    pub fn take(
        &mut self,
        intent: &str,
        known: impl Fn(&str) -> bool,
        now: Instant,
        fresh: impl FnOnce() -> String,
    ) -> String {
        let Some(keys) = self.unanswered.get_mut(intent) else {
            return fresh();
        };
        keys.retain(|(key, at)| now.saturating_duration_since(*at) < KEEP_FOR && !known(key));
        let key = (!keys.is_empty()).then(|| keys.remove(0).0);
        if keys.is_empty() {
            self.unanswered.remove(intent);
        }
        key.unwrap_or_else(fresh)
    }

    /// Keeps `key`, which a CreateNode for `intent` sent without a definite answer, for the next
    /// CreateNode of that intent.
    pub fn unanswered(&mut self, intent: &str, key: String, now: Instant) {
        let keys = self.unanswered.entry(intent.to_owned()).or_default();
        keys.push((key, now));
        if keys.len() > MAX_PER_INTENT {
            keys.remove(0);
        }
    }

    /// How many unanswered keys are kept, over all intents.
    pub fn len(&self) -> usize {
        self.unanswered.values().map(Vec::len).sum()
    }

    /// Whether no unanswered key is kept.
    pub fn is_empty(&self) -> bool {
        self.unanswered.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn counter() -> impl FnMut() -> String {
        let mut n = 0;
        move || {
            n += 1;
            format!("fresh-{n}")
        }
    }

    #[test]
    fn an_answered_ask_takes_a_fresh_key_each_time() {
        let mut keys = ProvisionKeys::default();
        let mut fresh = counter();
        let now = Instant::now();
        assert_eq!(keys.take("r", |_| false, now, &mut fresh), "fresh-1");
        assert_eq!(keys.take("r", |_| false, now, &mut fresh), "fresh-2");
        assert!(keys.is_empty());
    }

    #[test]
    fn an_unanswered_key_is_repeated_for_its_intent_only_and_once() {
        let mut keys = ProvisionKeys::default();
        let mut fresh = counter();
        let now = Instant::now();
        let k = keys.take("r", |_| false, now, &mut fresh);
        keys.unanswered("r", k.clone(), now);
        assert_eq!(keys.take("other", |_| false, now, &mut fresh), "fresh-2");
        assert_eq!(keys.take("r", |_| false, now, &mut fresh), k);
        // Taken: a second ask in the same pass is a new node.
        assert_eq!(keys.take("r", |_| false, now, &mut fresh), "fresh-3");
    }

    #[test]
    fn a_key_whose_node_the_mirror_shows_is_resolved() {
        let mut keys = ProvisionKeys::default();
        let now = Instant::now();
        keys.unanswered("r", "a".into(), now);
        keys.unanswered("r", "b".into(), now);
        assert_eq!(keys.take("r", |k| k == "a", now, || "new".into()), "b");
        assert!(keys.is_empty());
    }

    #[test]
    fn keys_expire_and_are_bounded_per_intent() {
        let mut keys = ProvisionKeys::default();
        let now = Instant::now();
        keys.unanswered("r", "old".into(), now);
        let later = now + KEEP_FOR;
        assert_eq!(keys.take("r", |_| false, later, || "new".into()), "new");
        for i in 0..MAX_PER_INTENT + 5 {
            keys.unanswered("r", format!("k{i}"), now);
        }
        assert_eq!(keys.len(), MAX_PER_INTENT);
        assert_eq!(keys.take("r", |_| false, now, || "new".into()), "k5");
    }

    proptest! {
        /// Whatever the sequence of asks and lost answers, no key is handed out twice while an
        /// earlier holder of it could still be waiting, and every unanswered key is repeated
        /// before any fresh one (unless resolved).
        #[test]
        fn an_unanswered_key_comes_back_before_a_fresh_one(lost in proptest::collection::vec(any::<bool>(), 1..40)) {
            let mut keys = ProvisionKeys::default();
            let mut fresh = counter();
            let now = Instant::now();
            let mut waiting: Vec<String> = Vec::new();
            for lose in lost {
                let k = keys.take("r", |_| false, now, &mut fresh);
                if let Some(pos) = waiting.iter().position(|w| *w == k) {
                    prop_assert_eq!(pos, 0, "the oldest unanswered key first");
                    waiting.remove(pos);
                } else {
                    prop_assert!(waiting.is_empty(), "fresh key {} while {:?} wait", k, waiting);
                }
                if lose {
                    keys.unanswered("r", k.clone(), now);
                    waiting.push(k);
                }
            }
            prop_assert_eq!(keys.len(), waiting.len());
        }
    }
}
