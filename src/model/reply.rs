//! What became of a reply to a request (request-reply), on this instance or another.

/// What became of a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyOutcome {
    /// A requester waited and has it.
    Delivered,
    /// Nobody waits for it: unknown, already answered, its requester gone, or another
    /// tenant's (which must not learn that the id exists).
    Unknown,
    /// Its request's deadline passed.
    Late,
    /// The replier may not reply to that request's topic (the deciding ACL rule, if any).
    Denied { topic: String, rule: Option<String> },
    /// The reply carries no `emcorrelationid`.
    MissingId,
    /// Its requester waits at another instance, which did not answer in time
    /// (`cluster::replies::WAIT`) or is not live.
    Unreachable,
}

impl ReplyOutcome {
    /// The HTTP status that tells a replier what became of its reply, and a detail for the
    /// problem (nothing for a delivered reply).
    pub fn status(&self, replier: &str) -> (u16, String) {
        match self {
            ReplyOutcome::Delivered => (202, String::new()),
            ReplyOutcome::Unknown | ReplyOutcome::Late => {
                (404, "no request waits for this reply (unknown, expired or already answered)".into())
            }
            ReplyOutcome::Denied { topic, .. } => (403, format!("{replier} may not REPLY topic:{topic}")),
            ReplyOutcome::MissingId => (400, "a reply carries the request's emcorrelationid".into()),
            ReplyOutcome::Unreachable => (503, "the instance where the request waits did not answer; try again".into()),
        }
    }
}
