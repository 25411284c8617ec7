//! Cluster homing as the ingress uses it (with Kafka; on the embedded log everything is served
//! here): which instance is the home of a subscription (its sessions, polls and acks), of an
//! agent or of a lite topic (`cluster::homes`), waiting for this instance's own claim to be read
//! back, and the 307 that sends a request to its home (marked so it is never sent on twice).
//! Also the wait for a subscription's definition another instance made a moment ago.

use super::session;
use super::Traffic;
use crate::http::{problem, StatusCode};
use crate::server::{Request, Response};
use crate::storage::StorageError;
use crate::subscription::definition::Definition;

/// How long a session, poll or ack waits for this instance's claim of its subscription to be
/// read back, and how often it looks.
pub(super) const SETTLE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
pub(super) const SETTLE_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// Requests per shard waiting for a definition still on its way (see `Traffic::defined`).
pub(super) const MAX_DEFINITION_WAITS: usize = 64;

/// Gives a slot of a count back when dropped.
pub(super) fn scopeguard_dec(count: &std::cell::Cell<usize>) -> impl Drop + '_ {
    struct Slot<'a>(&'a std::cell::Cell<usize>);
    impl Drop for Slot<'_> {
        fn drop(&mut self) {
            self.0.set(self.0.get() - 1);
        }
    }
    Slot(count)
}

/// Where an agent's or a lite topic's key is served (see [`Traffic::placed`]).
pub(super) enum Placed {
    /// Here; `claim`: no claim names this instance yet.
    Here { claim: bool },
    /// At the home instance of this URL.
    There(String),
}

/// Marks a request sent on by [`to_home`]: served where it arrives, never sent on again (two
/// instances whose views of the home differ for a moment would send it back and forth); for an
/// agent or a lite topic, unless a live instance's claim names another home.
pub(super) const REDIRECTED: &str = "evmeshRedirected";

/// 307 to the same request at `home` (the method and body kept, as 307 says), before any
/// upgrade: `target` is the path and query.
pub(super) fn to_home(home: &str, target: &str) -> Response {
    let detail = format!("this is served by its home instance {home}");
    let sep = if target.contains('?') { '&' } else { '?' };
    problem(StatusCode(307), &detail).with_header("location", format!("{home}{target}{sep}{REDIRECTED}=1"))
}

impl Traffic {
    /// Subscription `stored`'s definition. A request another instance sent here (`redirected`:
    /// it knew the subscription) waits up to [`SETTLE_WAIT`] for the definition to come
    /// through Kafka, so a subscription made a moment ago there is not a 404 here. Any client
    /// can mark a request so: at most [`MAX_DEFINITION_WAITS`] wait per shard, others are
    /// answered at once.
    pub(super) async fn defined(&self, stored: &str, redirected: bool) -> Result<Option<Definition>, StorageError> {
        let db = &self.shard.shared.db;
        let def = crate::storage::meta::get_subscription(db, stored)?;
        let waits = &self.shard.definition_waits;
        let alone = !self.shard.shared.config.storage.clustered();
        if def.is_some() || !redirected || alone || waits.get() >= MAX_DEFINITION_WAITS {
            return Ok(def);
        }
        waits.set(waits.get() + 1);
        let _waiting = scopeguard_dec(waits);
        let until = std::time::Instant::now() + SETTLE_WAIT;
        while std::time::Instant::now() < until {
            monoio::time::sleep(SETTLE_POLL * 4).await;
            if let Some(def) = crate::storage::meta::get_subscription(db, stored)? {
                return Ok(Some(def));
            }
        }
        Ok(None)
    }

    /// With instances over Kafka: the URL of the home of subscription key `key`
    /// (`cluster::homes`) when that is another instance (its sessions, polls and acks are
    /// served there only). `None` on the embedded log, at the home, or while no live instance
    /// is known (then served here); 503 while this instance has not read the claims written
    /// before it started. A choice not claimed yet is claimed; when this instance has just
    /// claimed itself, it waits until its claim is read back (up to [`SETTLE_WAIT`], then
    /// 503): the offsets the previous home stored are read by then, and of two instances that
    /// claimed at once the one that lost sends the request on.
    pub(super) async fn home_elsewhere(&self, key: &str) -> Result<Option<String>, Response> {
        let shared = &self.shard.shared;
        if !shared.config.storage.clustered() {
            return Ok(None);
        }
        let until = std::time::Instant::now() + SETTLE_WAIT;
        let me = &shared.config.instance_id;
        let mut polled = 0u32;
        loop {
            // Waiting for this instance's own claim: the cheap look most times, the whole
            // answer (another claim may have come first) every 20th.
            polled += 1;
            if polled % 20 != 1 && !shared.cluster.claimed_here(key) && std::time::Instant::now() < until {
                monoio::time::sleep(SETTLE_POLL).await;
                continue;
            }
            let Some(home) = shared.cluster.home(key, true) else {
                // Starting: the claims (and the offsets with them) are not read yet. Served
                // here only once they are, or while no instance is known live (Kafka away).
                if !shared.cluster.homes().is_caught_up() {
                    return Err(problem(StatusCode::SERVICE_UNAVAILABLE, "this instance is starting; try again")
                        .with_header("retry-after", "1"));
                }
                return Ok(None);
            };
            if home.id != *me && home.url != shared.config.advertised_url {
                return Ok(Some(home.url));
            }
            if home.settled {
                return Ok(None);
            }
            if std::time::Instant::now() >= until {
                return Err(problem(StatusCode::SERVICE_UNAVAILABLE, "this instance is taking the subscription over")
                    .with_header("retry-after", "1"));
            }
            monoio::time::sleep(SETTLE_POLL).await;
        }
    }

    /// Serves the request here if this instance is the home of subscription key `key` (see
    /// [`Traffic::home_elsewhere`]), or if another instance sent it here already (never sent
    /// on twice); else the 307 to the home.
    pub(super) async fn at_home(&self, key: &str, req: &Request<'_>) -> Result<(), Response> {
        match self.home_elsewhere(key).await? {
            Some(home) if req.query(REDIRECTED).is_none() => Err(to_home(&home, req.target())),
            _ => Ok(()),
        }
    }

    /// Whether instances share Kafka: only then is anything served at a home elsewhere.
    pub(super) fn clustered(&self) -> bool {
        self.shard.shared.config.storage.clustered()
    }

    /// [`Traffic::served_here`] for lite topic `stored` (a choice nobody claimed stays here
    /// while the topic is followed here). Nothing is looked up on the embedded log.
    pub(super) fn lite_served_here(
        &self,
        stored: &str,
        at: Option<&Request<'_>>,
        what: impl FnOnce() -> String,
    ) -> Result<(), Response> {
        if !self.clustered() {
            return Ok(());
        }
        let here = self.shard.shared.watchers.is_followed(stored);
        self.served_here(&session::lite_home(stored).0, (at, here), what).map(|_| ())
    }

    /// With Kafka: whether an agent's or a lite topic's `key` (`cluster::homes`) is served
    /// here: `Ok(claim)`, `claim` saying no claim names this instance yet (its caller claims
    /// it once it served the request: `Cluster::claim_here`); else the 307 to its home for an
    /// HTTP request `at`, or a 409 naming `what` (a WebSocket message). A live claim of
    /// another instance always sends the request on; a choice nobody claimed does unless
    /// another instance sent the request here (`evmeshRedirected`): then this one takes it.
    /// Never waits: these keys carry no offsets to catch up on, and two racing first choices
    /// are settled by the claims' log (the loser forgets, `runtime::cluster::appliers::claim_read`). Nothing is
    /// recorded here: a caller that is sent on leaves no claim behind.
    pub(super) fn served_here(
        &self,
        key: &str,
        (at, serving): (Option<&Request<'_>>, bool),
        what: impl FnOnce() -> String,
    ) -> Result<bool, Response> {
        let redirected = at.is_some_and(|r| r.query(REDIRECTED).is_some());
        match self.placed(key, redirected || serving)? {
            Placed::Here { claim } => Ok(claim),
            Placed::There(url) => Err(match at {
                Some(req) => to_home(&url, req.target()),
                None => problem(StatusCode::CONFLICT, &format!("{} is served by its home instance {url}", what())),
            }),
        }
    }

    /// Where `key` is served, as [`Traffic::served_here`] says (`kept`: a choice nobody
    /// claimed stays here, the request being sent here by another instance, or this instance
    /// serving the key already: an agent registered or attached here, a lite topic followed
    /// here); 503 while this instance is starting, or knows no live instance (Kafka away:
    /// what it took then, it could not tell the others).
    pub(super) fn placed(&self, key: &str, kept: bool) -> Result<Placed, Response> {
        let shared = &self.shard.shared;
        if !self.clustered() {
            return Ok(Placed::Here { claim: false });
        }
        let Some(home) = shared.cluster.home(key, false) else {
            let detail = match shared.cluster.homes().is_caught_up() {
                false => "this instance is starting; try again",
                true => "no live instance is known (Kafka away?); try again",
            };
            return Err(problem(StatusCode::SERVICE_UNAVAILABLE, detail).with_header("retry-after", "1"));
        };
        if home.id == shared.config.instance_id {
            return Ok(Placed::Here { claim: !home.claimed });
        }
        if !home.claimed && kept {
            return Ok(Placed::Here { claim: true });
        }
        Ok(Placed::There(home.url))
    }
}
