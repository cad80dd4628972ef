//! VERSION: which spec versions this plugin speaks.

use edgelink_cni_spec::CniVersion;
use serde_json::{json, Value};

pub fn run(stdin: &[u8]) -> Value {
    let asked = edgelink_cni_spec::netconf::raw_version(stdin)
        .filter(|v| v.parse::<CniVersion>().is_ok())
        .unwrap_or_else(|| CniVersion::LATEST.as_str().to_string());
    let all: Vec<&str> = CniVersion::ALL.iter().map(|v| v.as_str()).collect();
    json!({"cniVersion": asked, "supportedVersions": all})
}
