//! The stored names of a session and of an agent's lite topic: tenant-scoped, as every
//! shard's table and topics spell them.

/// A session's stored (tenant-scoped) key.
pub fn session_key(tenant: Option<&str>, sid: &str) -> String {
    match tenant {
        Some(t) => format!("{t}/{sid}"),
        None => sid.to_owned(),
    }
}

/// The stored name of the lite topic `agent.<agent>` of `tenant`.
pub fn agent_topic(tenant: Option<&str>, agent: &str) -> String {
    match tenant {
        Some(t) => format!(":{t}.agent.{agent}"),
        None => format!(":agent.{agent}"),
    }
}
