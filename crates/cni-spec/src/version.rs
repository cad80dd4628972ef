//! Spec versions this implementation speaks.

use std::fmt;
use std::str::FromStr;

/// A CNI specification version that edgelink supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CniVersion {
    V0_3_0,
    V0_3_1,
    V0_4_0,
    V1_0_0,
    V1_1_0,
}

impl CniVersion {
    /// Every supported version, oldest first (the order VERSION reports).
    pub const ALL: [CniVersion; 5] = [
        CniVersion::V0_3_0,
        CniVersion::V0_3_1,
        CniVersion::V0_4_0,
        CniVersion::V1_0_0,
        CniVersion::V1_1_0,
    ];
    /// The newest supported version.
    pub const LATEST: CniVersion = CniVersion::V1_1_0;

    pub fn as_str(self) -> &'static str {
        match self {
            CniVersion::V0_3_0 => "0.3.0",
            CniVersion::V0_3_1 => "0.3.1",
            CniVersion::V0_4_0 => "0.4.0",
            CniVersion::V1_0_0 => "1.0.0",
            CniVersion::V1_1_0 => "1.1.0",
        }
    }

    /// CHECK exists from 0.4.0 on.
    pub fn has_check(self) -> bool {
        self >= CniVersion::V0_4_0
    }

    /// STATUS and GC exist from 1.1.0 on.
    pub fn has_status_and_gc(self) -> bool {
        self >= CniVersion::V1_1_0
    }

    /// Results before 1.0.0 carry `ips[].version`.
    pub fn result_has_ip_version(self) -> bool {
        self < CniVersion::V1_0_0
    }

    /// Fields added in 1.1.0: interface `mtu`/`socketPath`/`pciID`, route
    /// `mtu`/`advmss`/`priority`/`table`/`scope`.
    pub fn result_has_1_1_fields(self) -> bool {
        self >= CniVersion::V1_1_0
    }
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The version string is not one we speak.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cniVersion {0:?} is not supported (supported: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0)")]
pub struct UnsupportedVersion(pub String);

impl FromStr for CniVersion {
    type Err = UnsupportedVersion;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CniVersion::ALL
            .into_iter()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| UnsupportedVersion(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_supported_version_and_orders_them() {
        for v in CniVersion::ALL {
            assert_eq!(v.as_str().parse::<CniVersion>().unwrap(), v);
        }
        assert!(CniVersion::V0_3_1 < CniVersion::V1_0_0);
        assert!(!CniVersion::V0_3_1.has_check());
        assert!(CniVersion::V0_4_0.has_check());
        assert!(!CniVersion::V1_0_0.has_status_and_gc());
        assert!(CniVersion::V1_1_0.has_status_and_gc());
    }

    #[test]
    fn refuses_unknown_versions() {
        let e = "0.2.0".parse::<CniVersion>().unwrap_err();
        assert!(e.to_string().contains("\"0.2.0\""));
        assert!("1.2.0".parse::<CniVersion>().is_err());
        assert!("".parse::<CniVersion>().is_err());
    }
}
