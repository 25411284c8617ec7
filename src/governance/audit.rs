//! The audit log: admin changes and denied attempts, one JSON object per line.
//!
//! Writers never wait: a record goes into a bounded queue (dropped and counted when full) and
//! the `evmesh-audit` thread writes at most `audit_max_per_second` lines a second (what is over
//! is counted and summed up in a `{"suppressed": N}` line), into a file that is rotated to
//! `<file>.1` at `audit_max_bytes`: a flood of denied requests costs at most twice that much
//! disk, and never a core.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TrySendError};
use serde::Serialize;

/// One line of the log.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// RFC 3339, UTC.
    pub time: String,
    pub principal: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub action: String,
    pub resource: String,
    /// `allowed`, `denied` (403), `unauthenticated` (401), or an admin change's status.
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
}

/// Records waiting for the writer at most.
const QUEUE: usize = 4096;

pub struct Audit {
    tx: Option<Sender<Record>>,
    /// Records dropped because the queue was full.
    pub dropped: AtomicU64,
}

impl Audit {
    /// No audit log (tests of other things, `evmesh` subcommands that serve nothing).
    pub fn disabled() -> Audit {
        Audit { tx: None, dropped: AtomicU64::new(0) }
    }

    /// Starts the writer thread on `path` (created, appended to).
    pub fn start(path: PathBuf, per_second: u32, max_bytes: u64) -> std::io::Result<Audit> {
        let file = open(&path)?;
        let (tx, rx) = bounded(QUEUE);
        std::thread::Builder::new()
            .name("evmesh-audit".into())
            .spawn(move || writer(rx, path, file, per_second.max(1), max_bytes))?;
        Ok(Audit { tx: Some(tx), dropped: AtomicU64::new(0) })
    }

    pub fn record(&self, r: Record) {
        if let Some(tx) = &self.tx {
            if let Err(TrySendError::Full(_)) = tx.try_send(r) {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn open(path: &PathBuf) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new().create(true).append(true).open(path)
}

fn writer(rx: Receiver<Record>, path: PathBuf, mut file: std::fs::File, per_second: u32, max_bytes: u64) {
    let mut size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut tokens = f64::from(per_second);
    let mut refilled = Instant::now();
    let mut suppressed = 0u64;
    let mut line = Vec::with_capacity(512);
    loop {
        let record = match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(r) => Some(r),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let now = Instant::now();
        tokens =
            (tokens + now.duration_since(refilled).as_secs_f64() * f64::from(per_second)).min(f64::from(per_second));
        refilled = now;
        line.clear();
        if suppressed > 0 && tokens >= 1.0 {
            tokens -= 1.0;
            let time = crate::adaptor::rfc3339_from_micros(crate::model::clock::now_micros());
            serde_json::to_writer(&mut line, &serde_json::json!({"time": time, "suppressed": suppressed}))
                .expect("writes to a Vec");
            line.push(b'\n');
            suppressed = 0;
        }
        if let Some(r) = record {
            if tokens >= 1.0 {
                tokens -= 1.0;
                serde_json::to_writer(&mut line, &r).expect("writes to a Vec");
                line.push(b'\n');
            } else {
                suppressed += 1;
            }
        }
        if line.is_empty() {
            continue;
        }
        if size + line.len() as u64 > max_bytes {
            let mut old = path.clone().into_os_string();
            old.push(".1");
            let _ = std::fs::rename(&path, &old);
            match open(&path) {
                Ok(f) => {
                    file = f;
                    size = 0;
                }
                Err(e) => crate::log::warn("audit", &format!("audit log {}: {e}", path.display()), &[]),
            }
        }
        match file.write_all(&line) {
            Ok(()) => size += line.len() as u64,
            Err(e) => crate::log::warn("audit", &format!("audit log {}: {e}", path.display()), &[]),
        }
    }
}
