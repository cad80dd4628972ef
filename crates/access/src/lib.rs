//! Who may use a device, and who did. The access rules edgelink-operator
//! resolves (a Device's `allowedClients`, the DeviceLease held, the leases
//! waiting) reach edgelinkd as lists of addresses ([`wire`]); edgelinkd
//! keeps them per attachment ([`rules`]) and asks for a verdict on each
//! client. It never talks to the API server and never opens a socket.

pub mod audit;
pub mod rules;
pub mod wire;

pub use audit::{Audit, Ended, Record};
pub use rules::{Access, Refusal, Rule, Slot, Verdict};
pub use wire::{AccessRules, AttachmentAccess, Client, LeaseAccess};
