//! The leader's current access rules per node, and the answer to a
//! heartbeat: the node's rules when their generation differs from the one
//! the heartbeat says edgelinkd has, nothing otherwise. Until the rules
//! were made once from caches that had all listed, nothing is sent: an
//! empty set of rules would open every Device.

use crate::access::{generation, Attachments};
use edgelink_access::wire::AccessRules;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Per node, its rules.
#[derive(Debug, Default)]
pub struct Book {
    nodes: HashMap<String, Arc<AccessRules>>,
    /// The rules of a node with no restricted attachment.
    empty: Option<Arc<AccessRules>>,
}

impl Book {
    pub fn new() -> Book {
        Book::default()
    }

    /// The rules of every node from now (a node absent has none).
    pub fn set(&mut self, nodes: BTreeMap<String, AccessRules>) {
        self.nodes = nodes.into_iter().map(|(n, r)| (n, Arc::new(r))).collect();
        let none = Attachments::new();
        self.empty = Some(Arc::new(AccessRules {
            generation: generation(&none),
            attachments: none,
        }));
    }

    /// Whether the rules were made once.
    pub fn ready(&self) -> bool {
        self.empty.is_some()
    }

    /// What the answer to `node`'s heartbeat carries, given the generation
    /// edgelinkd has (`""` or absent: none).
    pub fn answer(&self, node: &str, have: Option<&str>) -> Option<Arc<AccessRules>> {
        let empty = self.empty.as_ref()?;
        let rules = self.nodes.get(node).unwrap_or(empty);
        (rules.generation != have.unwrap_or("")).then(|| rules.clone())
    }

    /// The generation of `node`'s rules now.
    pub fn generation(&self, node: &str) -> Option<&str> {
        let r = self.nodes.get(node).or(self.empty.as_ref())?;
        Some(&r.generation)
    }
}
