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
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use serde_json::Value as Json;

use crate::adaptor::a2a::Task;

/// Stream responses a task keeps for its streams.
pub const EVENTS: usize = 1024;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A doorbell any number of waiters (a blocking send, streams) listen to, on any shard.
#[derive(Default)]
pub struct Bell {
    state: Mutex<(u64, Vec<Waker>)>,
}

impl Bell {
    /// How many times it rang.
    pub fn rung(&self) -> u64 {
        lock(&self.state).0
    }

    /// Resolves once it rang after `seen` (at once if it did).
    pub async fn after(&self, seen: u64) {
        std::future::poll_fn(|cx| {
            let mut s = lock(&self.state);
            if s.0 != seen {
                return Poll::Ready(());
            }
            if !s.1.iter().any(|w| w.will_wake(cx.waker())) {
                s.1.push(cx.waker().clone());
            }
            Poll::Pending
        })
        .await
    }

    pub fn ring(&self) {
        let wakers = {
            let mut s = lock(&self.state);
            s.0 += 1;
            std::mem::take(&mut s.1)
        };
        for w in wakers {
            w.wake();
        }
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
    /// When it last changed (ms since the epoch).
    pub updated_ms: u64,
}

impl TaskLog {
    /// Records a stream response (the task was changed to match it).
    pub fn emit(&mut self, event: Json, now_ms: u64) {
        if self.events.len() == EVENTS {
            self.events.pop_front();
            self.first += 1;
        }
        self.events.push_back(event);
        self.updated_ms = now_ms;
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
                log.emit(e, now_ms);
            }
            log.updated_ms = now_ms;
        }
        self.bell.ring();
    }
}

/// Every task, by id.
pub struct Tasks {
    map: Mutex<HashMap<String, Arc<TaskEntry>>>,
    max: usize,
}

/// The table is full.
#[derive(Debug)]
pub struct Full;

impl Tasks {
    pub fn new(max: usize) -> Tasks {
        Tasks { map: Mutex::new(HashMap::new()), max }
    }

    pub fn insert(&self, entry: Arc<TaskEntry>) -> Result<(), Full> {
        let mut map = lock(&self.map);
        if map.len() >= self.max {
            return Err(Full);
        }
        map.insert(entry.id.clone(), entry);
        Ok(())
    }

    pub fn get(&self, id: &str) -> Option<Arc<TaskEntry>> {
        lock(&self.map).get(id).cloned()
    }

    /// The tasks `keep` wants.
    pub fn matching(&self, keep: impl Fn(&TaskEntry) -> bool) -> Vec<Arc<TaskEntry>> {
        lock(&self.map).values().filter(|e| keep(e)).cloned().collect()
    }

    /// Drops the tasks unchanged for `ttl_ms`; returns them.
    pub fn expire(&self, now_ms: u64, ttl_ms: u64) -> Vec<Arc<TaskEntry>> {
        let mut gone = Vec::new();
        lock(&self.map).retain(|_, e| {
            let stale = e.log().updated_ms.saturating_add(ttl_ms) <= now_ms;
            if stale {
                gone.push(e.clone());
            }
            !stale
        });
        for e in &gone {
            e.bell.ring(); // streams of it end
        }
        gone
    }

    pub fn len(&self) -> usize {
        lock(&self.map).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
        let log = TaskLog { task, events: VecDeque::new(), first: 0, turn: 0, updated_ms: now };
        Arc::new(TaskEntry {
            id: id.into(),
            owner: None,
            tenant: None,
            agent: "a".into(),
            call_key: "k".into(),
            log: Mutex::new(log),
            bell: Bell::default(),
        })
    }

    #[test]
    fn tasks_are_bounded_expire_and_keep_their_last_events() {
        let t = Tasks::new(2);
        t.insert(entry("1", 0)).unwrap();
        t.insert(entry("2", 50)).unwrap();
        assert!(t.insert(entry("3", 0)).is_err(), "at most max");
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
    }

    #[test]
    fn a_bell_wakes_every_waiter() {
        let bell = Arc::new(Bell::default());
        let seen = bell.rung();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let b = bell.clone();
                std::thread::spawn(move || futures::executor::block_on(b.after(seen)))
            })
            .collect();
        // Once all three wait on it (a condition, not a sleep).
        while lock(&bell.state).1.len() < 3 {
            std::thread::yield_now();
        }
        bell.ring();
        for w in waiters {
            w.join().unwrap();
        }
        futures::executor::block_on(bell.after(seen)); // rang since: at once
    }
}
