//! The CNI error object and its codes.

use serde_json::{json, Value};
use std::fmt;

/// Error codes: the spec's (1–11, 50, 51) and edgelink's own (100+).
pub mod codes {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODE_FAILURE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
    pub const NOT_AVAILABLE_DEGRADED: u32 = 51;
    /// A netlink or other kernel operation failed.
    pub const KERNEL: u32 = 100;
    /// CNI_IFNAME already exists in the pod's network namespace.
    pub const INTERFACE_EXISTS: u32 = 101;
    /// No free address left in a range set.
    pub const POOL_EXHAUSTED: u32 = 102;
    /// A requested address is taken or outside the ranges.
    pub const ADDRESS_UNAVAILABLE: u32 = 103;
    /// CHECK found the attachment differs from what ADD made.
    pub const CHECK_FAILED: u32 = 104;
    /// A delegated IPAM plugin failed.
    pub const DELEGATE_FAILED: u32 = 105;
    /// The kernel lacks a feature the config asks for.
    pub const KERNEL_FEATURE_MISSING: u32 = 106;
}

/// A CNI error as printed on stdout: `{cniVersion, code, msg, details}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// The JSON object, stamped with the version the caller asked for.
    pub fn to_json(&self, cni_version: &str) -> Value {
        let mut v = json!({
            "cniVersion": cni_version,
            "code": self.code,
            "msg": self.msg,
        });
        if !self.details.is_empty() {
            v["details"] = Value::String(self.details.clone());
        }
        v
    }

    /// Parse an error a delegated plugin printed.
    pub fn from_json(v: &Value) -> Option<CniError> {
        let code = v.get("code")?.as_u64()?;
        Some(CniError {
            code: u32::try_from(code).ok()?,
            msg: v
                .get("msg")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            details: v
                .get("details")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        })
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CNI error {}: {}", self.code, self.msg)?;
        if !self.details.is_empty() {
            write!(f, " ({})", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for CniError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_omits_empty_details() {
        let e = CniError::new(
            codes::INVALID_CONFIG,
            "mode: \"foo\" is not bridge or macvlan",
        );
        let j = e.to_json("1.0.0");
        assert_eq!(j["code"], 7);
        assert_eq!(j["cniVersion"], "1.0.0");
        assert!(j.get("details").is_none());
        assert_eq!(CniError::from_json(&j).unwrap(), e);
        let d = e.clone().with_details("x");
        assert_eq!(d.to_json("0.4.0")["details"], "x");
    }
}
