//! DeviceLease: one holder (a pod, a Job's pods, or the pods a selector
//! matches) uses a Device at a time, the others wait in a queue, first
//! come first served. The operator decides the states (`crate::lease`)
//! and sends the holder's and the waiters' addresses to edgelinkd
//! (`crate::access`); edgelinkd lets only the holder through.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// `durationSeconds` at most: a week.
pub const MAX_DURATION_SECONDS: u32 = 7 * 24 * 3600;

fn state_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "description": "Waiting, Held, Expired, Released or Refused.",
        "enum": ["Waiting", "Held", "Expired", "Released", "Refused"]
    })
}

/// A lease of a Device for one holder at a time, in the holder's namespace.
#[allow(clippy::duplicated_attributes)] // printcolumn(...), as Device's
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "edgelink.io",
    version = "v1alpha1",
    kind = "DeviceLease",
    namespaced,
    status = "DeviceLeaseStatus",
    shortname = "dls",
    category = "edgelink",
    doc = "A Device used by one holder at a time: the others wait their turn, first come first served.",
    printcolumn(name = "Device", type_ = "string", json_path = ".spec.device"),
    printcolumn(name = "Holder", type_ = "string", json_path = ".status.holder"),
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "Since", type_ = "date", json_path = ".status.since"),
    printcolumn(name = "Expires", type_ = "date", json_path = ".status.expires")
)]
#[serde(rename_all = "camelCase")]
pub struct DeviceLeaseSpec {
    /// The Device's name.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    )]
    pub device: String,
    /// The Device's namespace (default: the lease's). A lease from another
    /// namespace is admitted only if the Device's allowedClients selects
    /// the lease's namespace (a namespaceSelector that matches it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub device_namespace: Option<String>,
    /// Whose pods hold the lease: exactly one of podSelector, job, pod.
    pub holder: LeaseHolder,
    /// The lease ends (Expired) this long after it was Held (default: it
    /// ends when its holder's pods have all finished, or it is deleted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_DURATION_SECONDS))]
    pub duration_seconds: Option<u32>,
    /// While Waiting, the holder's connections wait (edgelinkd's queue
    /// bound) instead of being refused at once (default false).
    #[serde(default)]
    pub wait: bool,
}

/// The holder's pods, in the lease's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("oneOf" = [{"required": ["podSelector"]}, {"required": ["job"]}, {"required": ["pod"]}]))]
pub struct LeaseHolder {
    /// The pods this selector matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// The pods of this Job (label batch.kubernetes.io/job-name, or the
    /// older job-name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub job: Option<String>,
    /// One pod, by name (what the pod annotation edgelink.io/lease makes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub pod: Option<String>,
}

/// Where a lease is.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum LeaseState {
    /// Behind another lease of the Device (`position`), or its Device
    /// does not exist (yet).
    Waiting,
    /// Its holder's pods alone may use the Device.
    Held,
    /// durationSeconds ran out since it was Held (final).
    Expired,
    /// Its holder had pods and none is left that has not finished (final).
    Released,
    /// Not admitted: the Device is in another namespace whose
    /// allowedClients does not select the lease's.
    Refused,
}

impl LeaseState {
    /// Expired and Released are final.
    pub fn ended(self) -> bool {
        matches!(self, LeaseState::Expired | LeaseState::Released)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Waiting => "Waiting",
            LeaseState::Held => "Held",
            LeaseState::Expired => "Expired",
            LeaseState::Released => "Released",
            LeaseState::Refused => "Refused",
        }
    }
}

/// What the operator decided.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceLeaseStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "state_schema")]
    pub state: Option<LeaseState>,
    /// When it entered its state (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Held with a durationSeconds: when it ends (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// Waiting: 1 is next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<u32>,
    /// The holder as the HOLDER column shows it (`pod/runner-1`,
    /// `job/hil-42`, `selector app=ci`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// Whether the holder has had pods that had not finished: once it has
    /// none left, the lease is Released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_seen: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl DeviceLeaseSpec {
    /// The Device's namespace, given the lease's.
    pub fn device_namespace<'a>(&'a self, lease_ns: &'a str) -> &'a str {
        self.device_namespace.as_deref().unwrap_or(lease_ns)
    }
}
