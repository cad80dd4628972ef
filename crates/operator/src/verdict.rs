//! A condition's verdict (status, reason, message) before it gets its
//! times: what device health (report.rs) and reverse entries (reverse.rs)
//! conclude, and the controller writes.

/// A condition's status, reason and message, before it gets its times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

impl Verdict {
    pub(crate) fn new(
        status: &'static str,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Verdict {
        Verdict {
            status,
            reason,
            message: message.into(),
        }
    }
}
