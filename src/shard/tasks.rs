//! A2A tasks (the gateway, `ingress::a2a`), process-wide like the agent sessions they run on, so
//! a task started on one shard is read, cancelled or streamed from any.
//!
//! A task runs on an agent streaming session (Mode 1, `shard::calls`): its context is the
//! session, each message of it a turn. A task keeps its A2A state (`adaptor::a2a::Task`) and the
//! stream responses that changed it since it was created (at most [`EVENTS`]; a stream that
//! falls further behind starts again from a snapshot), and rings its [`Bell`] on each change.
//! At most `max` tasks are kept; one not changed for the session TTL is dropped (an expired
//! task is one the spec lets a server forget: TaskNotFound).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use serde_json::Value as Json;

use crate::adaptor::a2a::Task;

/// Stream responses a task keeps for its streams.
pub const EVENTS: usize = 1024;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A doorbell any number of waiters (a blocking send, streams) listen to, on any shard. A
/// waiter that goes away (its stream's client left) takes its waker with it.
#[derive(Default)]
pub struct Bell {
    state: Mutex<BellState>,
}

#[derive(Default)]
struct BellState {
    rung: u64,
    next_slot: u64,
    waiting: Vec<(u64, Waker)>,
}

/// A wait on a [`Bell`] (see [`Bell::after`]).
pub struct Ring<'b> {
    bell: &'b Bell,
    seen: u64,
    slot: Option<u64>,
}

impl std::future::Future for Ring<'_> {
    type Output = ();
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        let bell = self.bell;
        let mut s = lock(&bell.state);
        if s.rung != self.seen {
            return Poll::Ready(());
        }
        match self.slot {
            Some(slot) => match s.waiting.iter_mut().find(|(id, _)| *id == slot) {
                Some((_, w)) if w.will_wake(cx.waker()) => {}
                Some((_, w)) => *w = cx.waker().clone(),
                None => s.waiting.push((slot, cx.waker().clone())),
            },
            None => {
                let slot = s.next_slot;
                s.next_slot += 1;
                s.waiting.push((slot, cx.waker().clone()));
                drop(s);
                self.slot = Some(slot);
            }
        }
        Poll::Pending
    }
}

impl Drop for Ring<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            lock(&self.bell.state).waiting.retain(|(id, _)| *id != slot);
        }
    }
}

impl Bell {
    /// How many times it rang.
    pub fn rung(&self) -> u64 {
        lock(&self.state).rung
    }

    /// Resolves once it rang after `seen` (at once if it did).
    pub fn after(&self, seen: u64) -> Ring<'_> {
        Ring { bell: self, seen, slot: None }
    }

    pub fn ring(&self) {
        let wakers = {
            let mut s = lock(&self.state);
            s.rung += 1;
            std::mem::take(&mut s.waiting)
        };
        for (_, w) in wakers {
            w.wake();
        }
    }

    /// Waiters now (for tests).
    #[cfg(test)]
    fn waiters(&self) -> usize {
        lock(&self.state).waiting.len()
    }
}

/// A task and what changed it.
pub struct TaskLog {
    pub task: Task,
    /// Stream responses since the task was created, the oldest first; `first` is the number of
    /// the oldest kept.
    pub events: VecDeque<Json>,
    pub first: u64,
    /// The turn of its session that is the task's now (0: none yet).
    pub turn: u64,
}

impl TaskLog {
    /// Records a stream response (the task was changed to match it).
    pub fn emit(&mut self, event: Json) {
        if self.events.len() == EVENTS {
            self.events.pop_front();
            self.first += 1;
        }
        self.events.push_back(event);
    }

    /// The number of the next event.
    pub fn end(&self) -> u64 {
        self.first + self.events.len() as u64
    }
}

/// One task.
pub struct TaskEntry {
    pub id: String,
    /// Who may see it (the principal that sent its first message; `None` with `auth = none`).
    pub owner: Option<String>,
    pub tenant: Option<String>,
    /// The agent as the caller named it, and its session's stored key.
    pub agent: String,
    pub call_key: String,
    pub log: Mutex<TaskLog>,
    pub bell: Bell,
    /// When it last changed (ms since the epoch), read without its lock.
    pub updated_ms: AtomicU64,
}

impl TaskEntry {
    pub fn log(&self) -> MutexGuard<'_, TaskLog> {
        lock(&self.log)
    }

    /// Changes the task with `change`, which returns the stream responses saying so; rings.
    pub fn update(&self, now_ms: u64, change: impl FnOnce(&mut Task) -> Vec<Json>) {
        {
            let mut log = self.log();
            for e in change(&mut log.task) {
                log.emit(e);
            }
        }
        self.touch(now_ms);
        self.bell.ring();
    }

    pub fn touch(&self, now_ms: u64) {
        self.updated_ms.store(now_ms, Ordering::Relaxed);
    }

    /// Whom it belongs to: tenant, principal and agent (the key of [`Tasks`]' index).
    pub fn scope(&self) -> Scope {
        scope(self.tenant.as_deref(), self.owner.as_deref(), &self.agent)
    }
}

/// A caller's view: tenant, principal and agent, `\0`-joined.
pub type Scope = String;

pub fn scope(tenant: Option<&str>, owner: Option<&str>, agent: &str) -> Scope {
    format!("{}\0{}\0{agent}", tenant.unwrap_or(""), owner.unwrap_or(""))
}

#[derive(Default)]
struct Table {
    map: HashMap<String, Arc<TaskEntry>>,
    /// Task ids by scope, so a listing reads the caller's tasks only.
    by_scope: HashMap<Scope, Vec<String>>,
    /// A caller's contexts: (scope, contextId) -> the session's stored key and the context's
    /// latest task.
    contexts: HashMap<(Scope, String), (String, String)>,
}

/// Every task, by id.
pub struct Tasks {
    table: Mutex<Table>,
    max: usize,
}

/// The table is full.
#[derive(Debug)]
pub struct Full;

impl Tasks {
    pub fn new(max: usize) -> Tasks {
        Tasks { table: Mutex::new(Table::default()), max }
    }

    /// Adds a task, the latest of its context (`context`: the session's stored key and the
    /// context id).
    pub fn insert(&self, entry: Arc<TaskEntry>, context: (&str, &str)) -> Result<(), Full> {
        let mut t = lock(&self.table);
        if t.map.len() >= self.max {
            return Err(Full);
        }
        let scope = entry.scope();
        t.by_scope.entry(scope.clone()).or_default().push(entry.id.clone());
        t.contexts.insert((scope, context.1.to_owned()), (context.0.to_owned(), entry.id.clone()));
        t.map.insert(entry.id.clone(), entry);
        Ok(())
    }

    pub fn get(&self, id: &str) -> Option<Arc<TaskEntry>> {
        lock(&self.table).map.get(id).cloned()
    }

    /// A caller's context: its session's stored key and latest task.
    pub fn context(&self, scope: &Scope, context: &str) -> Option<(String, Arc<TaskEntry>)> {
        let t = lock(&self.table);
        let (key, task) = t.contexts.get(&(scope.clone(), context.to_owned()))?;
        Some((key.clone(), t.map.get(task)?.clone()))
    }

    /// The tasks of a scope.
    pub fn of(&self, scope: &Scope) -> Vec<Arc<TaskEntry>> {
        let t = lock(&self.table);
        let ids = t.by_scope.get(scope).map(Vec::as_slice).unwrap_or_default();
        ids.iter().filter_map(|id| t.map.get(id).cloned()).collect()
    }

    /// Drops the tasks unchanged for `ttl_ms`; a task that had not settled fails first, so
    /// its streams and waiters hear why. Returns them.
    pub fn expire(&self, now_ms: u64, ttl_ms: u64) -> Vec<Arc<TaskEntry>> {
        let stale = |e: &TaskEntry| e.updated_ms.load(Ordering::Relaxed).saturating_add(ttl_ms) <= now_ms;
        let gone: Vec<Arc<TaskEntry>> = {
            let mut t = lock(&self.table);
            let gone: Vec<Arc<TaskEntry>> = t.map.values().filter(|e| stale(e)).cloned().collect();
            for e in &gone {
                t.map.remove(&e.id);
            }
            let Table { map, by_scope, contexts } = &mut *t;
            by_scope.retain(|_, ids| {
                ids.retain(|id| map.contains_key(id));
                !ids.is_empty()
            });
            contexts.retain(|_, (_, task)| map.contains_key(task));
            gone
        };
        for e in &gone {
            // Streams of it end (they find it gone), after this last word.
            e.update(now_ms, crate::adaptor::a2a::task::expire);
        }
        gone
    }
}

/// Remote A2A agents (`POST /agent/register` with `a2aUrl`): the gateway calls them as an A2A
/// client. What is known of each: its URL, its card (fetched when first asked for, kept a
/// minute) and the JSON-RPC URL the card names. The tasks evmesh's callers made there are
/// remembered by id with the caller's scope (at most `max` of them, the oldest forgotten),
/// so a caller reads, cancels and lists only its own.
pub struct Remotes {
    map: Mutex<HashMap<String, Remote>>,
    owners: Mutex<(HashMap<String, Scope>, VecDeque<String>)>,
    max_agents: usize,
    max_tasks: usize,
}

#[derive(Clone, Debug)]
pub struct Remote {
    pub url: String,
    /// The card as the remote serves it, when it was fetched (ms), and its JSON-RPC URL.
    pub card: Option<(Json, u64, String)>,
    /// Where its host is, and since when (ms): names are resolved at most once a minute.
    pub addr: Option<(std::net::SocketAddr, u64)>,
}

impl Remotes {
    pub fn new(max_agents: usize, max_tasks: usize) -> Remotes {
        Remotes { map: Mutex::default(), owners: Mutex::default(), max_agents, max_tasks }
    }

    /// Registers (or moves) a remote agent; `Ok(true)` if it is new.
    pub fn register(&self, id: &str, url: &str) -> Result<bool, Full> {
        let mut m = lock(&self.map);
        if !m.contains_key(id) && m.len() >= self.max_agents {
            return Err(Full);
        }
        let old = m.insert(id.to_owned(), Remote { url: url.to_owned(), card: None, addr: None });
        Ok(old.is_none())
    }

    pub fn get(&self, id: &str) -> Option<Remote> {
        lock(&self.map).get(id).cloned()
    }

    /// Keeps the card fetched from `url` (not if the agent moved meanwhile).
    pub fn set_card(&self, id: &str, url: &str, card: Json, now_ms: u64, rpc_url: String) {
        if let Some(r) = lock(&self.map).get_mut(id).filter(|r| r.url == url) {
            r.card = Some((card, now_ms, rpc_url));
        }
    }

    /// Keeps where the agent registered at `url` is (not if it moved meanwhile).
    pub fn set_addr(&self, id: &str, url: &str, addr: std::net::SocketAddr, now_ms: u64) {
        if let Some(r) = lock(&self.map).get_mut(id).filter(|r| r.url == url) {
            r.addr = Some((addr, now_ms));
        }
    }

    pub fn remove(&self, id: &str) -> bool {
        lock(&self.map).remove(id).is_some()
    }

    /// Remembers that `id` (a task's, or `c:` and a context's) is `scope`'s; one already
    /// another's stays theirs, and ids over 256 bytes are not kept (nor then reachable).
    pub fn own(&self, id: &str, scope: &Scope) {
        if id.is_empty() || id.len() > 256 {
            return;
        }
        let mut o = lock(&self.owners);
        let (map, order) = &mut *o;
        if map.contains_key(id) {
            return;
        }
        map.insert(id.to_owned(), scope.clone());
        order.push_back(id.to_owned());
        while order.len() > self.max_tasks {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
    }

    /// Remembers a task the remote answered (its id and its context) as `scope`'s.
    pub fn own_task(&self, task: &serde_json::Map<String, Json>, scope: &Scope) {
        if let Some(id) = task.get("id").and_then(Json::as_str) {
            self.own(id, scope);
        }
        if let Some(c) = task.get("contextId").and_then(Json::as_str) {
            self.own(&format!("c:{c}"), scope);
        }
    }

    /// Whether `id` is `scope`'s.
    pub fn owns(&self, id: &str, scope: &Scope) -> bool {
        lock(&self.owners).0.get(id) == Some(scope)
    }

    /// Whether a context may be named by `scope`: its own, or nobody's yet.
    pub fn context_free_for(&self, context: &str, scope: &Scope) -> bool {
        lock(&self.owners).0.get(&format!("c:{context}")).is_none_or(|s| s == scope)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptor::a2a::TaskState;

    fn entry(id: &str, now: u64) -> Arc<TaskEntry> {
        let task = Task {
            id: id.into(),
            context_id: "c".into(),
            state: TaskState::Submitted,
            status_message: None,
            timestamp: String::new(),
            artifacts: Vec::new(),
            history: Vec::new(),
            artifact_bytes: 0,
        };
        let log = TaskLog { task, events: VecDeque::new(), first: 0, turn: 0 };
        Arc::new(TaskEntry {
            id: id.into(),
            owner: None,
            tenant: None,
            agent: "a".into(),
            call_key: "k".into(),
            log: Mutex::new(log),
            bell: Bell::default(),
            updated_ms: AtomicU64::new(now),
        })
    }

    #[test]
    fn tasks_are_bounded_expire_and_keep_their_last_events() {
        let t = Tasks::new(2);
        t.insert(entry("1", 0), ("k", "c1")).unwrap();
        t.insert(entry("2", 50), ("k", "c2")).unwrap();
        assert!(t.insert(entry("3", 0), ("k", "c3")).is_err(), "at most max");
        let e = t.get("2").unwrap();
        for i in 0..EVENTS + 10 {
            e.update(60, |task| {
                task.state = TaskState::Working;
                vec![serde_json::json!(i)]
            });
        }
        let log = e.log();
        assert_eq!(
            (log.first, log.end(), log.events.front().cloned()),
            (10, EVENTS as u64 + 10, Some(serde_json::json!(10)))
        );
        drop(log);
        let gone = t.expire(100, 50);
        assert_eq!(gone.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["1"]);
        assert!(t.get("1").is_none() && t.get("2").is_some());
        assert_eq!(gone[0].log().task.state, TaskState::Failed, "an unsettled task fails as it goes");
        let s = scope(None, None, "a");
        assert_eq!(t.of(&s).len(), 1, "the index forgets it too");
        assert!(t.context(&s, "c1").is_none() && t.context(&s, "c2").is_some());
    }

    #[test]
    fn remote_tasks_are_their_owners_and_forgotten_oldest_first() {
        let r = Remotes::new(1, 2);
        assert!(r.register("a", "http://x").unwrap() && !r.register("a", "http://y").unwrap());
        assert!(r.register("b", "http://z").is_err(), "at most max_agents");
        let (me, you) = (scope(None, Some("me"), "a"), scope(None, Some("you"), "a"));
        r.own("t1", &me);
        r.own("t2", &you);
        assert!(r.owns("t1", &me) && !r.owns("t1", &you) && !r.owns("nope", &me));
        r.own("t2", &me);
        assert!(r.owns("t2", &you) && !r.owns("t2", &me), "another's stays theirs");
        r.own("t3", &me);
        assert!(!r.owns("t1", &me), "the oldest forgotten past max_tasks");
        r.own(&"x".repeat(300), &me);
        assert!(!r.owns(&"x".repeat(300), &me), "overlong ids are not kept");
    }

    #[test]
    fn a_bell_wakes_every_waiter() {
        use std::future::Future;
        let bell = Arc::new(Bell::default());
        let seen = bell.rung();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let b = bell.clone();
                std::thread::spawn(move || futures::executor::block_on(b.after(seen)))
            })
            .collect();
        // Once all three wait on it (a condition, not a sleep).
        while bell.waiters() < 3 {
            std::thread::yield_now();
        }
        bell.ring();
        for w in waiters {
            w.join().unwrap();
        }
        futures::executor::block_on(bell.after(seen)); // rang since: at once
                                                       // A waiter that goes away takes its waker with it.
        let seen = bell.rung();
        for _ in 0..100 {
            let mut wait = Box::pin(bell.after(seen));
            let waker = futures::task::noop_waker();
            let _ = wait.as_mut().poll(&mut std::task::Context::from_waker(&waker));
        }
        assert_eq!(bell.waiters(), 0);
    }
}
