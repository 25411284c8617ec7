//! The file connectors (SPEC, "Connectors").
//!
//! * **Source**: each complete line of `path` (ended by `\n`; blank lines skipped) becomes one
//!   event. A line that is a JSON object with `specversion` is taken as a structured
//!   CloudEvent as it is; any other line becomes the `data` of an event with
//!   `source = "file://<path>"`, `type = "evmesh.connect.file.line"` and
//!   `id = "<inode>-<byte offset of the line>"`, the same on every re-read of that line (JSON
//!   data when the line is JSON, else text). The position is `{"inode", "offset"}` (the byte
//!   after the last line taken). The file is followed across rotation: at its end, a `path`
//!   that now names another file (renamed away and made again) is read from its start once the
//!   old one is read to its end (its last line even without a `\n`); one shorter than the
//!   position (truncated in place) is read again from 0. Started from a position whose inode
//!   `path` no longer names, the old file is looked for beside it (`orders.jsonl.1`, ...) and
//!   its rest read first; if it is gone, that rest is lost and said so. A line longer than
//!   `max_line_bytes` (default 1 MiB) is skipped and said so: memory stays bounded.
//! * **Sink**: each event's structured JSON (without the delivery's `emdeliveryid`,
//!   `empartition`, `emoffset`, `emattempt`), one per line, appended to `path`. An event
//!   already written (same `id` and `source`) is not written again: the keys written and the
//!   file's committed length are kept in the offsets store, synced after the file, and a
//!   file longer than its committed length at open (a crash between the two) has its extra
//!   lines' keys taken and a torn last line cut. One longer than `max_line_bytes` is refused
//!   (it goes to the dead-letter topic).
//!
//! Files are read and written with blocking calls on the runtime's threads: local files,
//! bounded by a batch.

use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use cloudevents::{AttributesReader, Event, EventBuilder, EventBuilderV10};
use serde_json::{json, Value};

use super::{key, only_keys, with_position};
use crate::spi::{ConnectError, Position, Sink, SinkError, Source, SourceRecord};
use crate::store::Scoped;

/// The default longest line, either way.
const MAX_LINE: usize = 1 << 20;
/// Read this much at a time.
const CHUNK: usize = 64 << 10;
/// How often a source at the end of its file looks again.
const IDLE: Duration = Duration::from_millis(20);

fn path_of(config: &toml::Table) -> Result<PathBuf, ConnectError> {
    key(config, "path", toml::Value::as_str, "a file path")?
        .map(PathBuf::from)
        .ok_or_else(|| ConnectError::Fatal("config.path: the file is required".into()))
}

fn max_line_of(config: &toml::Table) -> Result<usize, ConnectError> {
    let n = key(config, "max_line_bytes", toml::Value::as_integer, "a number of bytes")?;
    match n {
        None => Ok(MAX_LINE),
        Some(n) if (64..=64 << 20).contains(&n) => Ok(n as usize),
        Some(n) => Err(ConnectError::Fatal(format!("config.max_line_bytes {n}: 64 to 64 MiB"))),
    }
}

fn io(what: &str, path: &Path, e: std::io::Error) -> ConnectError {
    ConnectError::Transient(format!("{what} {}: {e}", path.display()))
}

/// The file source (see the module doc).
pub struct FileSource {
    path: PathBuf,
    uri: String,
    max_line: usize,
    open: Option<Reading>,
    /// A skipped over-long line goes on until the next `\n`.
    skipping: bool,
}

/// The file being read.
struct Reading {
    file: File,
    inode: u64,
    /// Where `buf` starts in the file: the first byte not yet taken.
    offset: u64,
    buf: Vec<u8>,
}

impl FileSource {
    pub fn new(config: &toml::Table) -> Result<FileSource, ConnectError> {
        only_keys(config, &["path", "max_line_bytes"])?;
        let path = path_of(config)?;
        let uri = format!("file://{}", path.display());
        Ok(FileSource { path, uri, max_line: max_line_of(config)?, open: None, skipping: false })
    }

    /// Opens `path` (or the rotated file of `inode` beside it) at `offset`.
    fn open_at(&mut self, inode: u64, offset: u64) -> Result<(), ConnectError> {
        let here = std::fs::metadata(&self.path).ok().map(|m| m.ino());
        let at = if here == Some(inode) { Some(self.path.clone()) } else { self.rotated(inode) };
        match at {
            Some(p) => {
                let mut file = File::open(&p).map_err(|e| io("opening", &p, e))?;
                let len = file.metadata().map_err(|e| io("reading", &p, e))?.len();
                // Truncated below the position while evmesh-connect was away: read it again.
                let offset = if len < offset { 0 } else { offset };
                file.seek(SeekFrom::Start(offset)).map_err(|e| io("seeking", &p, e))?;
                self.open = Some(Reading { file, inode, offset, buf: Vec::new() });
            }
            None => {
                eprintln!(
                    "evmesh-connect: {}: the file of the stored position (inode {inode}) is gone; reading {} from its start (what was after byte {offset} of the old file is lost)",
                    self.uri,
                    self.path.display()
                );
                self.open = None;
            }
        }
        Ok(())
    }

    /// A file beside `path` whose name starts with its name and that has this inode.
    fn rotated(&self, inode: u64) -> Option<PathBuf> {
        let dir = self.path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let name = self.path.file_name()?.to_str()?.to_owned();
        std::fs::read_dir(dir)
            .ok()?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with(&name) && n != name))
            .find(|e| e.metadata().is_ok_and(|m| m.ino() == inode))
            .map(|e| e.path())
    }

    /// Opens `path` from its start, if it exists.
    fn open_new(&mut self) -> Result<bool, ConnectError> {
        match File::open(&self.path) {
            Ok(file) => {
                let inode = file.metadata().map_err(|e| io("reading", &self.path, e))?.ino();
                self.open = Some(Reading { file, inode, offset: 0, buf: Vec::new() });
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io("opening", &self.path, e)),
        }
    }

    /// Takes the complete lines in the buffer, at most `max` records.
    fn take_lines(&mut self, out: &mut Vec<SourceRecord>, max: usize) {
        let Some(r) = &mut self.open else { return };
        let mut used = 0;
        while out.len() < max {
            let Some(n) = r.buf[used..].iter().position(|&b| b == b'\n') else { break };
            let (start, line) = (r.offset + used as u64, &r.buf[used..used + n]);
            used += n + 1;
            let position = json!({ "inode": r.inode, "offset": r.offset + used as u64 });
            if std::mem::take(&mut self.skipping) {
                continue;
            }
            if let Some(event) = line_event(line, &self.uri, r.inode, start) {
                out.push(SourceRecord { event: with_position(event, &position), position });
            }
        }
        r.buf.drain(..used);
        r.offset += used as u64;
        // Over-long: no end of line in more than a line's worth (not a batch cut short).
        if r.buf.len() > self.max_line && !r.buf.contains(&b'\n') {
            eprintln!(
                "evmesh-connect: {}: a line at byte {} is longer than max_line_bytes ({}): skipped",
                self.uri, r.offset, self.max_line
            );
            r.offset += r.buf.len() as u64;
            r.buf.clear();
            self.skipping = true;
        }
    }

    /// At the end of the file: `Some(true)` when `path` names another file now (the old one's
    /// unterminated last line taken, the new one opened) or was truncated (read again).
    fn rotate(&mut self, out: &mut Vec<SourceRecord>) -> Result<bool, ConnectError> {
        let Some(r) = &mut self.open else { return self.open_new() };
        let now = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            Err(_) => return Ok(false),
        };
        if now.ino() != r.inode {
            // Renamed away, maybe after a last write since the end was met: read that first.
            let mut chunk = vec![0; CHUNK];
            let n = r.file.read(&mut chunk).map_err(|e| io("reading", &self.path, e))?;
            if n > 0 {
                r.buf.extend_from_slice(&chunk[..n]);
                return Ok(true);
            }
        }
        if now.ino() == r.inode {
            if now.len() < r.offset + r.buf.len() as u64 {
                eprintln!("evmesh-connect: {}: truncated; reading it again from its start", self.uri);
                r.file.seek(SeekFrom::Start(0)).map_err(|e| io("seeking", &self.path, e))?;
                (r.offset, r.buf) = (0, Vec::new());
                self.skipping = false;
                return Ok(true);
            }
            return Ok(false);
        }
        // Renamed away: its last line is complete even without a newline.
        if !r.buf.is_empty() && !self.skipping {
            let (start, inode) = (r.offset, r.inode);
            let end = r.offset + r.buf.len() as u64;
            let position = json!({ "inode": inode, "offset": end });
            if let Some(event) = line_event(&r.buf, &self.uri, inode, start) {
                out.push(SourceRecord { event: with_position(event, &position), position });
            }
        }
        self.skipping = false;
        self.open_new()
    }

    /// Reads what there is, up to a chunk; `false` at the end.
    fn read_more(&mut self) -> Result<bool, ConnectError> {
        let Some(r) = &mut self.open else { return Ok(false) };
        let mut chunk = vec![0; CHUNK];
        let n = r.file.read(&mut chunk).map_err(|e| io("reading", &self.path, e))?;
        r.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }
}

/// A line's event (see the module doc); `None` for a blank line.
fn line_event(line: &[u8], uri: &str, inode: u64, start: u64) -> Option<Event> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let parsed: Option<Value> = serde_json::from_slice(line).ok();
    if let Some(v) = parsed.as_ref().filter(|v| v.get("specversion").is_some()) {
        if let Ok(e) = serde_json::from_value::<Event>(v.clone()) {
            return Some(e);
        }
    }
    let b = EventBuilderV10::new().id(format!("{inode}-{start}")).source(uri).ty("evmesh.connect.file.line");
    let b = match parsed {
        Some(v) => b.data("application/json", v),
        None => b.data("text/plain", String::from_utf8_lossy(line).into_owned()),
    };
    b.build().ok()
}

#[async_trait]
impl Source for FileSource {
    async fn open(&mut self, from: Option<Position>) -> Result<(), ConnectError> {
        self.open = None;
        self.skipping = false;
        let at = from.as_ref().and_then(|p| Some((p.get("inode")?.as_u64()?, p.get("offset")?.as_u64()?)));
        match (from, at) {
            (None, _) => {
                self.open_new()?;
            }
            (Some(_), Some((inode, offset))) => self.open_at(inode, offset)?,
            (Some(p), None) => return Err(ConnectError::Fatal(format!("position {p}: not {{\"inode\", \"offset\"}}"))),
        }
        Ok(())
    }

    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<SourceRecord>, ConnectError> {
        let until = Instant::now() + wait;
        let mut out = Vec::new();
        loop {
            self.take_lines(&mut out, max);
            if out.len() >= max {
                return Ok(out);
            }
            if self.read_more()? {
                continue;
            }
            if self.rotate(&mut out)? {
                continue;
            }
            if !out.is_empty() || Instant::now() >= until {
                return Ok(out);
            }
            tokio::time::sleep(IDLE).await;
        }
    }
    async fn lag(&mut self) -> Option<Value> {
        // The bytes of the file being read past what was taken, and of the one now at the
        // path when it was rotated.
        let r = self.open.as_ref()?;
        let mut bytes = r.file.metadata().ok()?.len().saturating_sub(r.offset);
        if let Ok(m) = std::fs::metadata(&self.path) {
            if m.ino() != r.inode {
                bytes += m.len();
            }
        }
        Some(json!({ "bytes": bytes }))
    }
}

/// The file sink (see the module doc).
pub struct FileSink {
    path: PathBuf,
    max_line: usize,
    store: Scoped,
    file: Option<File>,
    /// The length the store has as committed.
    committed: u64,
    /// What `put` wrote since: the file's length, and the keys written.
    written: u64,
    pending: HashSet<Vec<u8>>,
}

/// The store's key of the committed length.
const LEN: &[u8] = b"len";

/// The store's key of an event written: `seen/<source>\0<id>`.
fn seen_key(source: &str, id: &str) -> Vec<u8> {
    [b"seen/".as_slice(), source.as_bytes(), b"\0", id.as_bytes()].concat()
}

impl FileSink {
    pub fn new(config: &toml::Table, store: Scoped) -> Result<FileSink, ConnectError> {
        only_keys(config, &["path", "max_line_bytes"])?;
        Ok(FileSink {
            path: path_of(config)?,
            max_line: max_line_of(config)?,
            store,
            file: None,
            committed: 0,
            written: 0,
            pending: HashSet::new(),
        })
    }

    fn store_err(e: crate::store::StoreError) -> ConnectError {
        ConnectError::Transient(e.to_string())
    }

    /// Back to the committed length: what `put` wrote since is forgotten, to be written again.
    fn roll_back(&mut self) {
        if let Some(f) = &self.file {
            if let Err(e) = f.set_len(self.committed) {
                eprintln!("evmesh-connect: {}: cutting back to {}: {e}", self.path.display(), self.committed);
                self.file = None;
            }
        }
        self.written = self.committed;
        self.pending.clear();
    }
}

#[async_trait]
impl Sink for FileSink {
    async fn open(&mut self) -> Result<(), ConnectError> {
        let p = &self.path;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(p)
            .map_err(|e| io("opening", p, e))?;
        let committed = match self.store.get(LEN).map_err(Self::store_err)? {
            Some(v) => String::from_utf8_lossy(&v).parse::<u64>().unwrap_or(0),
            None => 0,
        };
        let len = file.metadata().map_err(|e| io("reading", p, e))?.len();
        let mut keys: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        let mut end = len.min(committed);
        if len > committed {
            // Written but not committed (a crash between the file and the store): its complete
            // lines count as written; a torn last line is cut.
            file.seek(SeekFrom::Start(committed)).map_err(|e| io("reading", p, e))?;
            let mut rest = Vec::new();
            file.read_to_end(&mut rest).map_err(|e| io("reading", p, e))?;
            let complete = rest.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            for line in rest[..complete].split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                let v: Option<Value> = serde_json::from_slice(line).ok();
                let (Some(source), Some(id)) = (
                    v.as_ref().and_then(|v| v.get("source")?.as_str()),
                    v.as_ref().and_then(|v| v.get("id")?.as_str()),
                ) else {
                    continue;
                };
                keys.push((seen_key(source, id), Some(Vec::new())));
            }
            end = committed + complete as u64;
            if end < len {
                file.set_len(end).map_err(|e| io("cutting a torn line of", p, e))?;
            }
        }
        file.sync_data().map_err(|e| io("syncing", p, e))?;
        keys.push((LEN.to_vec(), Some(end.to_string().into_bytes())));
        self.store.write(&keys).map_err(Self::store_err)?;
        (self.file, self.committed, self.written) = (Some(file), end, end);
        self.pending.clear();
        Ok(())
    }

    async fn put(&mut self, events: &[Event]) -> Result<(), SinkError> {
        if self.file.is_none() {
            self.open().await?;
        }
        let mut lines = Vec::new();
        let mut refused = None;
        // Keys of this call's lines: pending only once they are written.
        let mut keys = HashSet::new();
        for (i, e) in events.iter().enumerate() {
            let k = seen_key(&e.source().to_string(), e.id());
            let seen = self.store.contains(&k).map_err(Self::store_err)?;
            if seen || self.pending.contains(&k) || keys.contains(&k) {
                continue;
            }
            let line = serde_json::to_vec(&super::undelivered(e))
                .map_err(|e| ConnectError::Fatal(format!("an event as JSON: {e}")))?;
            if line.len() > self.max_line {
                refused = Some(SinkError::Refused {
                    index: i,
                    reason: format!("{} bytes of JSON, over max_line_bytes ({})", line.len(), self.max_line),
                });
                break;
            }
            lines.extend_from_slice(&line);
            lines.push(b'\n');
            keys.insert(k);
        }
        let file = self.file.as_mut().expect("opened above");
        crate::fault::at_with("file-sink-torn", || {
            let _ = file.write_all(&lines[..lines.len() / 2]).and_then(|()| file.sync_data());
        });
        if let Err(e) = file.write_all(&lines) {
            let e = io("writing", &self.path, e);
            self.roll_back();
            return Err(e.into());
        }
        self.written += lines.len() as u64;
        self.pending.extend(keys);
        refused.map_or(Ok(()), Err)
    }

    async fn flush(&mut self) -> Result<(), ConnectError> {
        let Some(file) = &self.file else { return Ok(()) };
        if self.written == self.committed {
            return Ok(());
        }
        if let Err(e) = file.sync_data() {
            let e = io("syncing", &self.path, e);
            self.roll_back();
            return Err(e);
        }
        crate::fault::at("file-sink-synced");
        let mut keys: Vec<(Vec<u8>, Option<Vec<u8>>)> = self.pending.drain().map(|k| (k, Some(Vec::new()))).collect();
        keys.push((LEN.to_vec(), Some(self.written.to_string().into_bytes())));
        if let Err(e) = self.store.write(&keys) {
            // The file has them; the next open takes their keys from it.
            self.file = None;
            return Err(Self::store_err(e));
        }
        self.committed = self.written;
        Ok(())
    }

    async fn close(&mut self) {
        self.file = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloudevents::event::Data;

    #[tokio::test(flavor = "multi_thread")]
    async fn a_batch_cut_short_is_not_an_over_long_line() {
        let dir = std::env::temp_dir().join(format!("evmesh-connect-fs-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("in.txt");
        let lines: Vec<String> = (0..20).map(|i| format!("{i:03}{}", "x".repeat(77))).collect();
        std::fs::write(&path, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
        let mut config = toml::Table::new();
        config.insert("path".into(), path.display().to_string().into());
        config.insert("max_line_bytes".into(), 100.into());
        let mut s = FileSource::new(&config).unwrap();
        s.open(None).await.unwrap();
        let mut got = Vec::new();
        while got.len() < 20 {
            let batch = s.poll(2, Duration::from_millis(50)).await.unwrap();
            assert!(!batch.is_empty(), "stalled after {}", got.len());
            got.extend(batch);
        }
        let data: Vec<String> = got
            .iter()
            .map(|r| match r.event.data() {
                Some(Data::String(s)) => s.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(data, lines, "every line, in order, none skipped");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_lag_is_the_bytes_not_taken_and_those_of_the_file_rotated_in() {
        let dir = std::env::temp_dir().join(format!("evmesh-connect-fs-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("in.txt");
        std::fs::write(&path, format!("{}\n", "x".repeat(80)).repeat(20)).unwrap();
        let mut config = toml::Table::new();
        config.insert("path".into(), path.display().to_string().into());
        let mut s = FileSource::new(&config).unwrap();
        assert_eq!(s.lag().await, None, "not open");
        s.open(None).await.unwrap();
        assert_eq!(s.poll(2, Duration::from_millis(50)).await.unwrap().len(), 2);
        assert_eq!(s.lag().await, Some(json!({"bytes": 18 * 81})));
        std::fs::rename(&path, dir.join("in.txt.1")).unwrap();
        std::fs::write(&path, "new\n").unwrap();
        assert_eq!(s.lag().await, Some(json!({"bytes": 18 * 81 + 4})));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_plain_line_gets_a_stable_id_and_a_structured_one_keeps_its_own() {
        let e = line_event(b"hello", "file:///x", 7, 42).unwrap();
        assert_eq!((e.id(), e.source().as_str(), e.ty()), ("7-42", "file:///x", "evmesh.connect.file.line"));
        assert_eq!(e.datacontenttype(), Some("text/plain"));
        let e = line_event(br#"{"n":1}"#, "file:///x", 7, 0).unwrap();
        assert_eq!(e.datacontenttype(), Some("application/json"));
        let ce = br#"{"specversion":"1.0","id":"own","source":"/s","type":"t","data":{"k":1}}"#;
        let e = line_event(ce, "file:///x", 7, 0).unwrap();
        assert_eq!((e.id(), e.source().as_str()), ("own", "/s"));
        assert!(line_event(b"  \r", "file:///x", 7, 0).is_none(), "blank lines are skipped");
        // `specversion` but not an event: its line is data.
        let e = line_event(br#"{"specversion":"0.1"}"#, "file:///x", 7, 9).unwrap();
        assert_eq!(e.id(), "7-9");
    }
}
