//! The router: per-topic rules `{condition (CESQL), targets, copy | move}` applied to an event
//! after the transformer. `copy` stores the event in the targets too; `move` stores it only
//! there. Routes are followed on: an event routed to `b` meets `b`'s routes as well (the
//! transformer runs once, for the topic it was published to). A set of routes in which an event
//! could come back to a topic it passed is refused when the route is set, so following them
//! always ends; so is one that would let one event reach more than [`MAX_DESTINATIONS`] topics.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::subscription::cesql::{self, Event, Expr};

/// Most topics one event can be stored in through routes (the one it was published to included).
pub const MAX_DESTINATIONS: usize = 8;

/// Most routes of one topic (each is evaluated for every event published to it).
pub const MAX_ROUTES_PER_TOPIC: usize = 16;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteMode {
    /// Stored in the targets as well.
    #[default]
    Copy,
    /// Stored in the targets instead.
    Move,
}

/// A route, as `PUT /admin/routes/{id}` takes it (topics are stored names: `tenant.name`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    pub topic: String,
    /// A CESQL expression; the route applies to events for which it is `TRUE`.
    pub condition: String,
    pub targets: Vec<String>,
    #[serde(default)]
    pub mode: RouteMode,
}

#[derive(Debug)]
pub struct Route {
    pub id: String,
    pub spec: RouteSpec,
    condition: Expr,
}

impl Route {
    /// Checks one route on its own (the set it joins is checked by [`Router::with`]).
    pub fn new(id: &str, spec: RouteSpec) -> Result<Route, String> {
        if spec.targets.is_empty() || spec.targets.len() >= MAX_DESTINATIONS {
            return Err(format!("a route has 1 to {} targets", MAX_DESTINATIONS - 1));
        }
        if spec.targets.contains(&spec.topic) {
            return Err(format!("a route of {} cannot target {0} itself", spec.topic));
        }
        let condition = cesql::compile(&spec.condition).map_err(|e| format!("condition: {e}"))?;
        Ok(Route { id: id.to_owned(), spec, condition })
    }
}

/// Every route in force, by the topic they apply to.
#[derive(Debug, Default)]
pub struct Router {
    by_topic: BTreeMap<String, Vec<Arc<Route>>>,
}

/// Where an event goes: the topics to store it in, the one it was published to first (when no
/// `move` route took it away).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Destinations {
    pub topics: Vec<String>,
}

impl Router {
    pub fn new(routes: Vec<Arc<Route>>) -> Router {
        let mut by_topic: BTreeMap<String, Vec<Arc<Route>>> = BTreeMap::new();
        for r in routes {
            by_topic.entry(r.spec.topic.clone()).or_default().push(r);
        }
        for list in by_topic.values_mut() {
            list.sort_by(|a, b| a.id.cmp(&b.id));
        }
        Router { by_topic }
    }

    /// Every route, by id.
    pub fn all(&self) -> Vec<Arc<Route>> {
        let mut all: Vec<_> = self.by_topic.values().flatten().cloned().collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }

    pub fn routes(&self, topic: &str) -> bool {
        self.by_topic.contains_key(topic)
    }

    /// The router with `id` replaced by `route` (or removed): refused if the routes could then
    /// send an event back to a topic it passed, or to more than [`MAX_DESTINATIONS`] topics.
    pub fn with(&self, id: &str, route: Option<Route>) -> Result<Router, String> {
        let mut all: Vec<Arc<Route>> = self.all().into_iter().filter(|r| r.id != id).collect();
        all.extend(route.map(Arc::new));
        let next = Router::new(all);
        if let Some((t, _)) = next.by_topic.iter().find(|(_, r)| r.len() > MAX_ROUTES_PER_TOPIC) {
            return Err(format!("{t} has {MAX_ROUTES_PER_TOPIC} routes already"));
        }
        let mut done = BTreeSet::new();
        for topic in next.by_topic.keys() {
            next.find_loop(topic, &mut Vec::new(), &mut done)?;
        }
        for topic in next.by_topic.keys() {
            let n = next.reachable(topic);
            if n > MAX_DESTINATIONS {
                return Err(format!(
                    "an event published to {topic} could reach {n} topics through routes (at most {MAX_DESTINATIONS})"
                ));
            }
        }
        Ok(next)
    }

    /// Depth-first over every route whatever its condition: a topic met again on the path is a
    /// loop. Each topic is explored once (`done`): the routes are walked once, each step
    /// looking along the current path.
    fn find_loop<'a>(
        &'a self,
        topic: &'a str,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Result<(), String> {
        if done.contains(topic) {
            return Ok(());
        }
        if let Some(i) = path.iter().position(|t| *t == topic) {
            let mut cycle: Vec<&str> = path[i..].to_vec();
            cycle.push(topic);
            return Err(format!("routes would loop: {}", cycle.join(" -> ")));
        }
        path.push(topic);
        for r in self.by_topic.get(topic).into_iter().flatten() {
            for t in &r.spec.targets {
                self.find_loop(t, path, done)?;
            }
        }
        path.pop();
        done.insert(topic);
        Ok(())
    }

    /// How many topics an event published to `topic` could be stored in (itself included).
    fn reachable(&self, topic: &str) -> usize {
        let mut seen = BTreeSet::from([topic]);
        let mut queue = vec![topic];
        while let Some(t) = queue.pop() {
            for r in self.by_topic.get(t).into_iter().flatten() {
                for target in &r.spec.targets {
                    if seen.insert(target.as_str()) {
                        queue.push(target);
                    }
                }
            }
        }
        seen.len()
    }

    /// The topics an event published to `topic` is stored in. Each route's condition is
    /// evaluated within CESQL's per-event budget; over it, the route's id is the error (the
    /// event cannot be placed: a `move` it slipped past would leave it in the wrong topic).
    pub fn destinations<E: Event + ?Sized>(&self, topic: &str, event: &E) -> Result<Destinations, String> {
        let mut out = Destinations::default();
        let mut queue = vec![topic.to_owned()];
        let mut seen = BTreeSet::new();
        while let Some(t) = queue.pop() {
            if !seen.insert(t.clone()) || seen.len() > MAX_DESTINATIONS {
                continue;
            }
            let mut keep = true;
            for r in self.by_topic.get(&t).into_iter().flatten() {
                let mut budget = cesql::Budget::PER_EVENT;
                let verdict = r.condition.verdict(event, &mut budget);
                if verdict == cesql::Verdict::OverBudget {
                    return Err(r.id.clone());
                }
                if verdict == cesql::Verdict::Match {
                    keep &= r.spec.mode == RouteMode::Copy;
                    queue.extend(r.spec.targets.iter().rev().cloned());
                }
            }
            if keep {
                out.topics.push(t);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subscription::cesql::Value;

    struct Ev(&'static str);
    impl Event for Ev {
        fn attribute(&self, name: &str) -> Option<Value> {
            (name == "type").then(|| Value::Str(self.0.into()))
        }
    }

    fn route(id: &str, topic: &str, cond: &str, targets: &[&str], mode: RouteMode) -> Route {
        let spec = RouteSpec {
            topic: topic.into(),
            condition: cond.into(),
            targets: targets.iter().map(|t| t.to_string()).collect(),
            mode,
        };
        Route::new(id, spec).unwrap()
    }

    #[test]
    fn copy_keeps_the_event_move_takes_it_and_routes_are_followed() {
        let r = Router::default()
            .with("1", Some(route("1", "orders", "type = 'big'", &["audit"], RouteMode::Copy)))
            .unwrap()
            .with("2", Some(route("2", "orders", "type = 'eu'", &["orders.eu"], RouteMode::Move)))
            .unwrap()
            .with("3", Some(route("3", "orders.eu", "TRUE", &["archive"], RouteMode::Copy)))
            .unwrap();
        assert_eq!(r.destinations("orders", &Ev("small")).unwrap().topics, ["orders"]);
        assert_eq!(r.destinations("orders", &Ev("big")).unwrap().topics, ["orders", "audit"]);
        assert_eq!(r.destinations("orders", &Ev("eu")).unwrap().topics, ["orders.eu", "archive"]);
        assert_eq!(r.destinations("other", &Ev("big")).unwrap().topics, ["other"]);
    }

    #[test]
    fn routes_that_would_loop_or_fan_out_too_far_are_refused() {
        let r = Router::default()
            .with("a", Some(route("a", "a", "TRUE", &["b"], RouteMode::Copy)))
            .unwrap()
            .with("b", Some(route("b", "b", "TRUE", &["c"], RouteMode::Copy)))
            .unwrap();
        let e = r.with("c", Some(route("c", "c", "FALSE", &["a"], RouteMode::Move))).unwrap_err();
        assert!(e.contains("a -> b -> c -> a"), "{e}");
        assert!(Route::new(
            "s",
            RouteSpec { topic: "x".into(), condition: "TRUE".into(), targets: vec!["x".into()], mode: RouteMode::Copy }
        )
        .is_err());
        // Replacing a route is checked as the set it makes: b -> a after b's old route is gone.
        let r2 = r.with("b", Some(route("b", "b", "TRUE", &["d"], RouteMode::Copy))).unwrap();
        assert!(r2.with("d", Some(route("d", "d", "TRUE", &["a"], RouteMode::Copy))).is_err());
        // Fan-out: a root copying to 4 hubs that copy to 4 topics each reaches 21, over 8.
        let mut r = Router::default();
        for i in 0..4 {
            let targets: Vec<String> = (0..4).map(|j| format!("t{i}{j}")).collect();
            let t: Vec<&str> = targets.iter().map(String::as_str).collect();
            r = r
                .with(&format!("h{i}"), Some(route(&format!("h{i}"), &format!("h{i}"), "TRUE", &t, RouteMode::Copy)))
                .unwrap();
        }
        let hubs = ["h0", "h1", "h2", "h3"];
        let e = r.with("root", Some(route("root", "root", "TRUE", &hubs, RouteMode::Copy))).unwrap_err();
        assert!(e.contains("could reach 21 topics"), "{e}");
        assert!(Route::new(
            "c",
            RouteSpec {
                topic: "x".into(),
                condition: "type = ".into(),
                targets: vec!["y".into()],
                mode: RouteMode::Copy
            }
        )
        .is_err());
    }
}
