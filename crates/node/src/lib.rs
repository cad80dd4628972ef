//! The set of attachments a node serves, kept equal to the records the
//! plugin writes under `<stateDir>/attachments/`: new records start their
//! forwards (edgelink-forward serves them), removed ones stop, attachments
//! whose netns is gone are reclaimed (listeners closed, IPAM reservation
//! released, record removed), the GC Multus never sends to a secondary
//! plugin. It installs the kernel path's tables and adds up the status.
//!
//! It never touches a socket of a forward itself, never speaks HTTP, and
//! knows nothing of hand-overs beyond the lot the forwards park in.
//!
//! - [`Node`] (node.rs): the set, and what acts on all of it.
//! - pass.rs: one reconcile pass ([`Node::reconcile`]).
//! - asked.rs: what the next pass looks at (every record, or those that
//!   changed: [`Node::reconcile_records`]).
//! - start.rs: starting an attachment, retrying what failed.
//! - attachment.rs: one served [`Attachment`].
//! - provenance.rs: whether a record's netns path still names its pod's.
//! - relisten.rs: forwards that lost their sockets start again.
//! - reap.rs: deleting the pod interfaces a DEL retired.
//! - [`reclaim::Reclaimer`]: releasing what a pod left without a DEL;
//!   delegate.rs runs a delegated IPAM plugin's DEL for it.
//! - [`kernel::KernelForwards`]: one attachment's kernel-path table.
//! - [`vip`]: holding an attachment's virtual addresses while granted.
//! - report.rs: /status, the plugin's CHECK, and the
//!   [`edgelink_status::Source`] the status surface reads.
//! - [`watch`]: inotify on the records, to reconcile at once.

mod asked;
mod attachment;
pub mod delegate;
pub mod kernel;
mod node;
mod pass;
mod provenance;
mod reap;
pub mod reclaim;
mod relisten;
mod report;
mod start;
pub mod vip;
pub mod watch;

pub use attachment::{Attachment, Key};
pub use node::{Node, Settings};
