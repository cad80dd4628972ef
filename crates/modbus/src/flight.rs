//! The requests outstanding on one connection to the device, by the
//! transaction id the multiplexer gave them there.

use crate::frame::{Frame, GATEWAY_TARGET_FAILED};
use crate::stats::Stats;
use std::collections::HashMap;
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::time::Instant;

/// One request sent to the device.
pub(crate) struct Sent {
    /// The client's own transaction id, unit and function.
    pub client_tid: u16,
    pub unit: u8,
    pub function: u8,
    /// Where the answer goes; `None` once answered by a timeout (a
    /// response that comes after is dropped).
    pub reply: Option<mpsc::Sender<Frame>>,
    pub deadline: Instant,
    /// The client's place among its outstanding requests.
    pub permit: Option<OwnedSemaphorePermit>,
}

impl Sent {
    /// Answer the client with exception `code` (once).
    fn fail(&mut self, stats: &Stats, code: u8) {
        if let Some(reply) = self.reply.take() {
            let f = Frame {
                tid: self.client_tid,
                unit: self.unit,
                pdu: vec![self.function | 0x80, code],
            };
            if reply.try_send(f).is_ok() {
                stats.exception(code);
            }
        }
        self.permit = None;
    }
}

/// What a response did.
pub(crate) enum Answered {
    /// Passed to its client, or dropped because it came late.
    Taken,
    /// It answers no request sent on this connection.
    Unmatched(u16),
}

#[derive(Default)]
pub(crate) struct Flight {
    sent: HashMap<u16, Sent>,
    next: u16,
}

impl Flight {
    pub fn len(&self) -> usize {
        self.sent.len()
    }

    /// A transaction id no outstanding request has.
    pub fn next_tid(&mut self) -> u16 {
        loop {
            self.next = self.next.wrapping_add(1);
            if !self.sent.contains_key(&self.next) {
                return self.next;
            }
        }
    }

    pub fn insert(&mut self, tid: u16, s: Sent) {
        self.sent.insert(tid, s);
    }

    /// A response from the device: to its client, with the client's id.
    pub fn answer(&mut self, stats: &Stats, f: Frame) -> Answered {
        let Some(s) = self.sent.remove(&f.tid) else {
            return Answered::Unmatched(f.tid);
        };
        let back = Frame {
            tid: s.client_tid,
            ..f
        };
        match s.reply {
            Some(reply) if reply.try_send(back).is_ok() => Stats::inc(&stats.responses),
            _ => Stats::inc(&stats.late_responses),
        }
        Answered::Taken
    }

    /// When the next outstanding request times out.
    pub fn deadline(&self) -> Option<Instant> {
        self.sent.values().map(|s| s.deadline).min()
    }

    /// Answer the requests past their deadline with exception 0x0B; their
    /// ids stay taken for one more `grace`, for a late response to be
    /// dropped. False when one is past that too: the device lost it, and
    /// its connection is dropped.
    pub fn expire(&mut self, stats: &Stats, now: Instant, grace: Duration) -> bool {
        for s in self.sent.values_mut().filter(|s| s.deadline <= now) {
            if s.reply.is_none() {
                return false;
            }
            s.fail(stats, GATEWAY_TARGET_FAILED);
            s.deadline = now + grace;
        }
        true
    }

    /// The connection is gone: every outstanding request answered with
    /// exception `code`.
    pub fn fail_all(&mut self, stats: &Stats, code: u8) {
        for (_, mut s) in self.sent.drain() {
            s.fail(stats, code);
        }
    }
}
