//! The rules edgelinkd holds: per attachment (`namespace/pod` of the proxy
//! pod), who may connect, and the verdict on a client's address.
//!
//! A forward asks its attachment's [`Slot`] on every accepted connection
//! (and every UDP datagram): one read lock and a hash lookup. A new set of
//! rules ([`Access::replace`]) bumps the slots whose rule changed; the
//! attachment then checks its live connections again (a lease taken resets
//! the others', a client dropped from `allowedClients` is cut) and the
//! connections waiting for their lease look again.

use crate::wire::{AccessRules, AttachmentAccess, Client};
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::watch;

/// Why a client is not let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not among the pods `allowedClients` selects.
    Policy,
    /// The device is leased to someone else.
    Lease,
}

/// The verdict on one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// Its lease waits for the device (`wait: true`): the connection waits
    /// until the lease is held, or its wait runs out.
    Wait,
    Refused(Refusal),
}

/// One attachment's rule, ready for lookups.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Rule {
    pub device: String,
    /// None: every client.
    allowed: Option<HashMap<IpAddr, String>>,
    lease: Option<LeaseRule>,
}

#[derive(Debug, Default, PartialEq, Eq)]
struct LeaseRule {
    name: String,
    holders: HashMap<IpAddr, String>,
    waiting: HashMap<IpAddr, String>,
}

fn table(clients: &[Client]) -> HashMap<IpAddr, String> {
    clients
        .iter()
        .map(|c| (canonical(c.address), c.pod.clone()))
        .collect()
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is (a dual-stack
/// listener sees IPv4 clients so).
pub fn canonical(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
        v4 => v4,
    }
}

impl Rule {
    pub fn from_wire(a: &AttachmentAccess) -> Rule {
        Rule {
            device: a.device.clone(),
            allowed: a.allowed.as_deref().map(table),
            lease: a.lease.as_ref().map(|l| LeaseRule {
                name: l.name.clone(),
                holders: table(&l.holders),
                waiting: table(&l.waiting),
            }),
        }
    }

    /// The allowed list first, then the lease.
    pub fn verdict(&self, client: IpAddr) -> Verdict {
        let client = canonical(client);
        if self
            .allowed
            .as_ref()
            .is_some_and(|a| !a.contains_key(&client))
        {
            return Verdict::Refused(Refusal::Policy);
        }
        match &self.lease {
            None => Verdict::Allowed,
            Some(l) if l.holders.contains_key(&client) => Verdict::Allowed,
            Some(l) if l.waiting.contains_key(&client) => Verdict::Wait,
            Some(_) => Verdict::Refused(Refusal::Lease),
        }
    }

    /// The client's pod (`namespace/name`) as the rule knows it.
    pub fn pod_of(&self, client: IpAddr) -> Option<&str> {
        let client = canonical(client);
        let lease = self.lease.as_ref();
        [
            self.allowed.as_ref(),
            lease.map(|l| &l.holders),
            lease.map(|l| &l.waiting),
        ]
        .into_iter()
        .flatten()
        .find_map(|t| t.get(&client))
        .map(String::as_str)
    }

    /// The lease held now (`namespace/name`).
    pub fn lease(&self) -> Option<&str> {
        self.lease.as_ref().map(|l| l.name.as_str())
    }

    /// Whether going from `old` to `new` may refuse a client `old` let
    /// through (a connection must then be checked again); a rule that
    /// only lets more in (a new client pod, a lease ended) never does.
    pub fn narrows(old: Option<&Rule>, new: Option<&Rule>) -> bool {
        let Some(new) = new else { return false };
        let Some(old) = old else { return true };
        let allowed_narrows = match (&old.allowed, &new.allowed) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(o), Some(n)) => o.keys().any(|a| !n.contains_key(a)),
        };
        let lease_narrows = match (&old.lease, &new.lease) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(o), Some(n)) => {
                o.name != n.name || o.holders.keys().any(|a| !n.holders.contains_key(a))
            }
        };
        allowed_narrows || lease_narrows
    }
}

/// One attachment's place in the rules: what its forwards ask.
#[derive(Debug)]
pub struct Slot {
    /// The attachment's key, `namespace/pod`.
    pub key: String,
    rule: RwLock<Option<Arc<Rule>>>,
    /// Bumped when the rule changes.
    changed: watch::Sender<u64>,
    /// Bumped when it may refuse a client it let through before
    /// ([`Rule::narrows`]).
    narrowed: watch::Sender<u64>,
}

impl Slot {
    /// An open slot, in no [`Access`] (tests, an attachment without a pod).
    pub fn open(key: &str) -> Slot {
        Slot {
            key: key.to_string(),
            rule: RwLock::new(None),
            changed: watch::channel(0).0,
            narrowed: watch::channel(0).0,
        }
    }

    /// The rule now; None: open to every client.
    pub fn rule(&self) -> Option<Arc<Rule>> {
        self.rule.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn verdict(&self, client: IpAddr) -> Verdict {
        let rule = self.rule.read().unwrap_or_else(|e| e.into_inner());
        rule.as_ref()
            .map_or(Verdict::Allowed, |r| r.verdict(client))
    }

    /// Wakes on every change of the rule.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Wakes when the rule may refuse a client it let through before: the
    /// live connections must be checked again.
    pub fn subscribe_narrowed(&self) -> watch::Receiver<u64> {
        self.narrowed.subscribe()
    }

    fn set(&self, new: Option<Arc<Rule>>) -> bool {
        let mut rule = self.rule.write().unwrap_or_else(|e| e.into_inner());
        if *rule == new {
            return false;
        }
        let narrows = Rule::narrows(rule.as_deref(), new.as_deref());
        *rule = new;
        drop(rule);
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
        if narrows {
            self.narrowed.send_modify(|n| *n = n.wrapping_add(1));
        }
        true
    }
}

/// Where the rules live on disk: the next daemon (a restart, a hand-over)
/// starts with them rather than open.
pub const FILE: &str = "access.json";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not access rules: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// The node's rules, shared by the heartbeat (which replaces them) and the
/// forwards (which ask).
#[derive(Debug, Default)]
pub struct Access {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    rules: AccessRules,
    slots: HashMap<String, Arc<Slot>>,
}

impl Access {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The slot of attachment `key` (`namespace/pod`), made on first ask.
    pub fn slot(&self, key: &str) -> Arc<Slot> {
        let mut inner = self.lock();
        if let Some(s) = inner.slots.get(key) {
            return s.clone();
        }
        let s = Arc::new(Slot::open(key));
        let rule = inner
            .rules
            .attachments
            .get(key)
            .map(|a| Arc::new(Rule::from_wire(a)));
        s.set(rule);
        inner.slots.insert(key.to_string(), s.clone());
        s
    }

    /// The generation of the rules held (`""`: none).
    pub fn generation(&self) -> String {
        self.lock().rules.generation.clone()
    }

    /// The rules as held.
    pub fn rules(&self) -> AccessRules {
        self.lock().rules.clone()
    }

    /// Take a new set of rules: every slot gets its attachment's rule (or
    /// none). Returns the attachments whose rule changed.
    pub fn replace(&self, rules: AccessRules) -> Vec<String> {
        let mut inner = self.lock();
        let mut changed = Vec::new();
        for (key, slot) in &inner.slots {
            let rule = rules
                .attachments
                .get(key)
                .map(|a| Arc::new(Rule::from_wire(a)));
            if slot.set(rule) {
                changed.push(key.clone());
            }
        }
        inner.rules = rules;
        changed
    }

    /// Forget the slots no attachment uses any more.
    pub fn prune(&self) {
        self.lock().slots.retain(|_, s| Arc::strong_count(s) > 1);
    }

    /// Write the rules to `dir`/[`FILE`] (atomically: a new file renamed
    /// over the old).
    pub fn save(&self, dir: &Path) -> Result<(), Error> {
        let path = dir.join(FILE);
        let io = |source| Error::Io {
            path: path.clone(),
            source,
        };
        let body = serde_json::to_vec(&self.lock().rules).map_err(|e| io(e.into()))?;
        let tmp = dir.join(format!(".{FILE}.tmp"));
        std::fs::write(&tmp, body).map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)
    }

    /// The rules an earlier daemon saved in `dir`; none if it saved none.
    pub fn load(&self, dir: &Path) -> Result<(), Error> {
        let path = dir.join(FILE);
        let body = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(Error::Io { path, source }),
        };
        let rules = serde_json::from_slice(&body).map_err(|source| Error::Parse {
            path: path.clone(),
            source,
        })?;
        self.replace(rules);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
