//! How a controller's pass ends, as plain data: where its object stands and when it is looked
//! at again. The planners answer with these; the controllers write them as kstatus conditions
//! and requeue actions.

use std::time::Duration;

use crate::vocab::Standing;

/// When an object is looked at again, besides the watches that wake it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextLook {
    /// Only when it, or what it waits on, changes.
    OnChange,
    /// After this long, whatever changes.
    After(Duration),
}

/// Where an object stands after a pass: the kstatus standing, its reason word and a sentence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Ready, Reconciling or Stalled.
    pub standing: Standing,
    /// The conditions' reason (a CamelCase word).
    pub reason: &'static str,
    /// The sentence a person reads.
    pub message: String,
}

impl Verdict {
    /// A verdict of `standing` with `reason` and `message`.
    pub fn new(standing: Standing, reason: &'static str, message: impl Into<String>) -> Self {
        Verdict {
            standing,
            reason,
            message: message.into(),
        }
    }

    /// Stalled, with `reason` and `message`.
    pub fn stalled(reason: &'static str, message: impl Into<String>) -> Self {
        Verdict::new(Standing::Stalled, reason, message)
    }
}
