//! The audit trail: one line per relayed connection (and UDP session) with
//! who it was, to which device, how much moved and how it ended; refusals
//! too. The relay hands an [`End`] over (numbers and a shared [`Origin`]:
//! no string is made on its thread) and goes on: a thread of its own
//! makes the [`Record`], wakes at most ten times a second and writes the
//! lines in batches (JSON on stdout, rotated files under a
//! directory if one is configured) and keeps the latest in memory for
//! `edgelinkd audit` and the status webhook. A full hand-over channel
//! drops the line and counts it; it never holds a connection back.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// How a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ended {
    /// Both sides closed.
    Closed,
    /// A reset (either side, an error, the attachment gone).
    Reset,
    /// No byte moved for the idle timeout.
    IdleTimeout,
    /// Not among the clients `allowedClients` selects.
    RefusedByPolicy,
    /// The device is leased to someone else (refused at once, or reset
    /// when the lease was taken).
    RefusedByLease,
    /// It waited for its lease, or for a place under `maxConnections`,
    /// longer than the queue allows.
    QueueTimeout,
    /// The device could not be reached.
    ConnectFailed,
    /// A UDP session the full session table made room for a new one with.
    Evicted,
}

/// One audit line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// When it ended, RFC 3339 (UTC, milliseconds).
    pub time: String,
    /// Always `"audit"`: tells these lines from the daemon's logs.
    pub kind: String,
    /// `namespace/name` of the Device; the attachment's key when no rule
    /// names it.
    pub device: String,
    pub forward: String,
    /// `tcp` or `udp`.
    pub protocol: String,
    /// `to-device` (a client of the cluster to the device) or
    /// `from-device` (a reverse forward: the device calling the cluster).
    pub direction: String,
    /// The client pod, `namespace/name`, when the rules know its address;
    /// else its address.
    pub client: String,
    pub client_address: String,
    pub bytes_to_device: u64,
    pub bytes_to_client: u64,
    pub duration_ms: u64,
    pub ended: Ended,
    /// The lease the device was held under, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// A multiplexed Modbus/TCP client: the requests it made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<u64>,
    #[serde(skip)]
    pub at: Option<SystemTime>,
}

impl Record {
    /// `time` from `at`.
    pub fn stamp(mut self, at: SystemTime) -> Record {
        self.time = humantime::format_rfc3339_millis(at).to_string();
        self.at = Some(at);
        self
    }
}

/// Where a forward's lines come from: one per forward, shared by them.
#[derive(Debug)]
pub struct Origin {
    /// The attachment's rules: the Device's name, the client's pod, the
    /// lease, as they are when the line is written.
    pub slot: Arc<crate::Slot>,
    pub forward: String,
    /// `tcp` or `udp`.
    pub protocol: &'static str,
    /// `to-device` or `from-device`.
    pub direction: &'static str,
}

/// One connection's end, as the relay hands it over.
#[derive(Debug)]
pub struct End {
    pub origin: Arc<Origin>,
    pub client: std::net::IpAddr,
    pub duration_ms: u64,
    /// To the device, to the client.
    pub bytes: (u64, u64),
    pub ended: Ended,
    /// A multiplexed Modbus/TCP client's requests.
    pub requests: Option<u64>,
    pub at: SystemTime,
}

impl End {
    /// Its line, with the names the rules give now.
    pub fn record(&self) -> Record {
        let o = &self.origin;
        let rule = o.slot.rule();
        let ip = crate::rules::canonical(self.client);
        Record {
            time: String::new(),
            kind: "audit".into(),
            device: rule
                .as_ref()
                .map_or_else(|| o.slot.key.clone(), |r| r.device.clone()),
            forward: o.forward.clone(),
            protocol: o.protocol.into(),
            direction: o.direction.into(),
            client: rule
                .as_ref()
                .and_then(|r| r.pod_of(ip))
                .map_or_else(|| ip.to_string(), str::to_string),
            client_address: ip.to_string(),
            bytes_to_device: self.bytes.0,
            bytes_to_client: self.bytes.1,
            duration_ms: self.duration_ms,
            ended: self.ended,
            lease: rule.as_ref().and_then(|r| r.lease()).map(str::to_string),
            requests: self.requests,
            at: None,
        }
        .stamp(self.at)
    }
}

/// Where the lines go.
#[derive(Debug, Clone)]
pub struct Settings {
    /// JSON lines on stdout.
    pub stdout: bool,
    /// Rotated files `audit.log`, `audit.log.1`, ... here.
    pub dir: Option<PathBuf>,
    /// A file is rotated once it is this long.
    pub max_file_bytes: u64,
    /// Rotated files kept beside the current one.
    pub keep_files: usize,
    /// Lines kept in memory for `edgelinkd audit`.
    pub memory: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            stdout: true,
            dir: None,
            max_file_bytes: 16 << 20,
            keep_files: 4,
            memory: 10_000,
        }
    }
}

/// Lines in flight to the writer at most: beyond, lines are dropped.
const CHANNEL: usize = 65_536;

/// How long the writer gathers lines after the first wakes it.
const BATCH_WAIT: Duration = Duration::from_millis(100);

/// The audit trail of the node (cheap to share: an `Arc` inside).
#[derive(Debug, Clone)]
pub struct Audit {
    tx: Option<SyncSender<End>>,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    recent: Mutex<VecDeque<Arc<Record>>>,
    /// Lines not yet taken by the status webhook.
    unsent: Mutex<Vec<Arc<Record>>>,
    pub written: AtomicU64,
    pub dropped: AtomicU64,
    pub write_errors: AtomicU64,
}

impl Audit {
    /// No trail: lines are dropped without a count (tests, `--audit off`).
    pub fn off() -> Audit {
        Audit {
            tx: None,
            shared: Arc::default(),
        }
    }

    /// Start the writer thread.
    pub fn start(s: Settings) -> std::io::Result<Audit> {
        if let Some(dir) = &s.dir {
            std::fs::create_dir_all(dir)?;
        }
        let (tx, rx) = sync_channel(CHANNEL);
        let shared = Arc::new(Shared::default());
        let writer = Writer::new(s, shared.clone());
        std::thread::Builder::new()
            .name("audit".into())
            .spawn(move || writer.run(rx))?;
        Ok(Audit {
            tx: Some(tx),
            shared,
        })
    }

    pub fn is_on(&self) -> bool {
        self.tx.is_some()
    }

    /// Hand a connection's end over; never blocks.
    pub fn log(&self, e: End) {
        let Some(tx) = &self.tx else { return };
        match tx.try_send(e) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.shared.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The latest lines kept in memory, oldest first: of `device` only
    /// (`namespace/name`, or only the name) if given, ended at `since` or
    /// later.
    pub fn recent(&self, device: Option<&str>, since: Option<SystemTime>) -> Vec<Record> {
        let recent = self.shared.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent
            .iter()
            .filter(|r| {
                device.is_none_or(|d| r.device == d || r.device.rsplit('/').next() == Some(d))
            })
            .filter(|r| since.is_none_or(|s| r.at.is_none_or(|at| at >= s)))
            .map(|r| Record::clone(r))
            .collect()
    }

    /// The lines the status webhook has not sent yet (taken: the next call
    /// has only newer ones), at most `max`; the older ones beyond it are
    /// counted as dropped.
    pub fn take_unsent(&self, max: usize) -> Vec<Arc<Record>> {
        let mut unsent = self.shared.unsent.lock().unwrap_or_else(|e| e.into_inner());
        let all = std::mem::take(&mut *unsent);
        let skip = all.len().saturating_sub(max);
        self.shared
            .dropped
            .fetch_add(skip as u64, Ordering::Relaxed);
        all.into_iter().skip(skip).collect()
    }

    /// Lines written, dropped (channel full, or beyond the webhook's
    /// share), and failed writes.
    pub fn counts(&self) -> (u64, u64, u64) {
        let s = &self.shared;
        (
            s.written.load(Ordering::Relaxed),
            s.dropped.load(Ordering::Relaxed),
            s.write_errors.load(Ordering::Relaxed),
        )
    }
}

/// The writer thread's state.
struct Writer {
    s: Settings,
    shared: Arc<Shared>,
    file: Option<(std::fs::File, u64)>,
}

/// Lines the webhook may have waiting at most (the rest are the files').
const UNSENT: usize = 10_000;

impl Writer {
    fn new(s: Settings, shared: Arc<Shared>) -> Writer {
        Writer {
            s,
            shared,
            file: None,
        }
    }

    fn run(mut self, rx: Receiver<End>) {
        while let Ok(first) = rx.recv() {
            // A line wakes the thread; what comes in the next 100 ms goes
            // in the same write: the relay's threads wake this one at most
            // ten times a second, however many connections end.
            std::thread::sleep(BATCH_WAIT);
            let mut batch = vec![Arc::new(first.record())];
            while let Ok(e) = rx.try_recv() {
                batch.push(Arc::new(e.record()));
                if batch.len() == 8192 {
                    self.write(&batch);
                    self.keep(std::mem::take(&mut batch));
                }
            }
            self.write(&batch);
            self.keep(batch);
        }
    }

    fn write(&mut self, batch: &[Arc<Record>]) {
        let mut text = Vec::with_capacity(batch.len() * 320);
        for r in batch {
            if serde_json::to_writer(&mut text, &**r).is_ok() {
                text.push(b'\n');
            }
        }
        if self.s.stdout {
            let out = std::io::stdout();
            let mut out = out.lock();
            if out.write_all(&text).and_then(|()| out.flush()).is_err() {
                self.shared.write_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        if self.s.dir.is_some() && self.append(&text).is_err() {
            self.shared.write_errors.fetch_add(1, Ordering::Relaxed);
        }
        self.shared
            .written
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
    }

    fn keep(&self, batch: Vec<Arc<Record>>) {
        {
            let mut unsent = self.shared.unsent.lock().unwrap_or_else(|e| e.into_inner());
            unsent.extend(batch.iter().cloned());
            let over = unsent.len().saturating_sub(UNSENT);
            if over > 0 {
                unsent.drain(..over);
                self.shared
                    .dropped
                    .fetch_add(over as u64, Ordering::Relaxed);
            }
        }
        let mut recent = self.shared.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.extend(batch);
        while recent.len() > self.s.memory {
            recent.pop_front();
        }
    }

    /// Append to the current file, rotating it first when it is full.
    fn append(&mut self, text: &[u8]) -> std::io::Result<()> {
        let Some(dir) = self.s.dir.clone() else {
            return Ok(());
        };
        let full = self
            .file
            .as_ref()
            .is_some_and(|(_, len)| *len >= self.s.max_file_bytes);
        if full {
            self.file = None;
            rotate(&dir, self.s.keep_files)?;
        }
        if self.file.is_none() {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(FILE))?;
            let len = f.metadata()?.len();
            self.file = Some((f, len));
        }
        let (f, len) = self.file.as_mut().expect("opened above");
        f.write_all(text)?;
        *len += text.len() as u64;
        Ok(())
    }
}

/// The current file's name under the audit directory.
pub const FILE: &str = "audit.log";

/// `audit.log` → `audit.log.1` → ... → `audit.log.<keep>` (the oldest
/// goes).
fn rotate(dir: &Path, keep: usize) -> std::io::Result<()> {
    let name = |i: usize| match i {
        0 => dir.join(FILE),
        i => dir.join(format!("{FILE}.{i}")),
    };
    if keep == 0 {
        return match std::fs::remove_file(name(0)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    for i in (0..keep).rev() {
        match std::fs::rename(name(i), name(i + 1)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// `1h`, `30m`, `90s` as a time that long ago.
pub fn since(ago: &str) -> Result<SystemTime, String> {
    let d: Duration = humantime::parse_duration(ago).map_err(|e| format!("{ago:?}: {e}"))?;
    SystemTime::now()
        .checked_sub(d)
        .ok_or_else(|| format!("{ago:?} is too long ago"))
}

#[cfg(test)]
mod tests;
