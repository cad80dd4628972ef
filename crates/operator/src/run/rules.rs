//! The leader's access state, shared by the access loop (`run::access`),
//! which keeps it, the controller, which reads each Device's for its
//! condition AccessEnforced, and the heartbeat endpoint (`run::server`),
//! which answers from the nodes' rules.

use edgelink_access::wire::AccessRules;
use edgelink_operator::access::book::Book;
use edgelink_operator::crd::DeviceLeaseStatus;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// The book of the nodes' rules, shared with the heartbeat endpoint.
pub type SharedBook = Mutex<Book>;

/// What a Device's condition reads: (under a lease, its rules were cut).
pub type DeviceState = (bool, bool);

/// The access state shared by the loop, the controller and the endpoint.
#[derive(Default)]
pub struct Access {
    pub book: Arc<SharedBook>,
    /// A watched object changed: a pass soon.
    pub wake: Notify,
    /// Per Device (namespace, name) whose state is not (false, false).
    pub devices: Mutex<HashMap<(String, String), DeviceState>>,
    /// The statuses this leader wrote, by uid: it is their only writer,
    /// and its cache may not show its last write yet.
    pub(crate) written: Mutex<HashMap<String, DeviceLeaseStatus>>,
    /// Leases created for annotated pods, not in the cache yet.
    pub(crate) created: Mutex<HashSet<(String, String)>>,
}

impl Access {
    pub fn state(&self, ns: &str, name: &str) -> DeviceState {
        let m = self.devices.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&(ns.to_string(), name.to_string()))
            .copied()
            .unwrap_or_default()
    }
}

/// The rules for `node`'s heartbeat, given the generation it has.
pub fn answer(book: &SharedBook, node: &str, have: Option<&str>) -> Option<Arc<AccessRules>> {
    book.lock()
        .unwrap_or_else(|e| e.into_inner())
        .answer(node, have)
}
