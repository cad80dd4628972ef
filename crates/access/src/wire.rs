//! The access rules as they travel from edgelink-operator to edgelinkd:
//! in the answer to a heartbeat (`POST /v1/heartbeat`), beside the
//! virtual-address grants.
//!
//! The heartbeat says which rules the node has (`"access": <generation>`,
//! `""` for none); the answer carries the node's whole [`AccessRules`]
//! only when the operator's differ from that generation, and leaves the
//! field out otherwise. edgelinkd replaces what it has with what it is
//! given: an attachment absent from the rules is open to every client
//! (a Device without `access` and without a lease).
//!
//! The operator resolves everything (selectors, leases, their queues) to
//! addresses; edgelinkd only compares a client's address with lists. It
//! needs no API rights for it, and the operator needs no way into the
//! node: the rules are data that can only narrow who reaches a proxy pod.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// A node's access rules: per attachment of a proxy pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AccessRules {
    /// Names this content (the operator's choice: a hash of it). The next
    /// heartbeat sends it back; `""` is never a generation of rules.
    pub generation: String,
    /// Per attachment, `namespace/pod` of the proxy pod (the key of the
    /// virtual-address grants). Absent: open to every client.
    #[serde(default)]
    pub attachments: BTreeMap<String, AttachmentAccess>,
}

/// Who may connect through one proxy pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentAccess {
    /// The Device, `namespace/name`: what the audit lines name.
    pub device: String,
    /// The pods `spec.access.allowedClients` selects, now. Absent: every
    /// client (the Device has no `access`); empty: nobody.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed: Option<Vec<Client>>,
    /// The DeviceLease held now, if any: only its holders are let through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseAccess>,
}

/// A client pod: one of its addresses, and its name for the audit.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Client {
    pub address: IpAddr,
    /// `namespace/name`.
    pub pod: String,
}

/// The lease a device is held under.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseAccess {
    /// `namespace/name` of the DeviceLease. A new name is a lease taken:
    /// the connections of clients that are not its holders are reset.
    pub name: String,
    /// The holder's pods.
    #[serde(default)]
    pub holders: Vec<Client>,
    /// The pods of leases that wait for this device with `wait: true`:
    /// their connections wait (up to the queue's bound) until their lease
    /// is held, instead of being refused.
    #[serde(default)]
    pub waiting: Vec<Client>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_read_as_the_operator_writes_them() {
        let text = r#"{"generation": "g1", "attachments": {
            "lab/device01-01-0": {"device": "lab/device01-01",
              "allowed": [{"address": "10.244.1.5", "pod": "ci/runner-1"}],
              "lease": {"name": "ci/hil-1", "holders": [{"address": "10.244.1.5", "pod": "ci/runner-1"}],
                        "waiting": [{"address": "fd00::7", "pod": "ci/runner-2"}]}},
            "lab/open-0": {"device": "lab/open"}}}"#;
        let r: AccessRules = serde_json::from_str(text).unwrap();
        assert_eq!(r.generation, "g1");
        let a = &r.attachments["lab/device01-01-0"];
        assert_eq!(a.allowed.as_ref().unwrap()[0].pod, "ci/runner-1");
        let lease = a.lease.as_ref().unwrap();
        assert_eq!(
            lease.waiting[0].address,
            "fd00::7".parse::<IpAddr>().unwrap()
        );
        let open = &r.attachments["lab/open-0"];
        assert!(open.allowed.is_none() && open.lease.is_none());
        let back: AccessRules = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }
}
