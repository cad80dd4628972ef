//! Reading the named counters back from `nft -j list counters`.
//!
//! The nftables crate's `schema::Counter` holds packets and bytes as u32,
//! so a forward past 4 GiB would not parse: the counter objects are read
//! with a type of their own, u64 as the kernel keeps them.

use crate::render::{CONN, DOWN, UP};
use crate::FlowCounters;
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Deserialize)]
struct Listing {
    nftables: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct NamedCounter {
    name: String,
    packets: u64,
    bytes: u64,
}

/// Counters by forward name; objects that are not counters (metainfo) and
/// counters not named by [`crate::render`] are skipped.
pub(crate) fn parse(json: &[u8]) -> Result<BTreeMap<String, FlowCounters>, String> {
    let listing: Listing = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    let mut out = BTreeMap::<String, FlowCounters>::new();
    for object in listing.nftables {
        let Some(value) = object.get("counter") else {
            continue;
        };
        let c = NamedCounter::deserialize(value).map_err(|e| format!("{value}: {e}"))?;
        if let Some(fwd) = c.name.strip_suffix(CONN) {
            out.entry(fwd.to_string()).or_default().connections = c.packets;
        } else if let Some(fwd) = c.name.strip_suffix(UP) {
            let e = out.entry(fwd.to_string()).or_default();
            e.packets_to_target = c.packets;
            e.bytes_to_target = c.bytes;
        } else if let Some(fwd) = c.name.strip_suffix(DOWN) {
            let e = out.entry(fwd.to_string()).or_default();
            e.packets_to_client = c.packets;
            e.bytes_to_client = c.bytes;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_group_by_forward_and_keep_64_bits() {
        let json = br#"{"nftables": [
            {"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
            {"counter": {"family": "inet", "name": "my-api-conn", "table": "edgelink", "handle": 4, "packets": 3, "bytes": 180}},
            {"counter": {"family": "inet", "name": "my-api-up", "table": "edgelink", "handle": 5, "packets": 7, "bytes": 5000000000}},
            {"counter": {"family": "inet", "name": "my-api-down", "table": "edgelink", "handle": 6, "packets": 9, "bytes": 123}},
            {"counter": {"family": "inet", "name": "dns-conn", "table": "edgelink", "handle": 7, "packets": 1, "bytes": 60}}
        ]}"#;
        let c = parse(json).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(
            c["my-api"],
            FlowCounters {
                connections: 3,
                packets_to_target: 7,
                bytes_to_target: 5_000_000_000,
                packets_to_client: 9,
                bytes_to_client: 123,
            }
        );
        assert_eq!(c["dns"].connections, 1);
        assert_eq!(c["dns"].bytes_to_client, 0);
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(parse(b"not json").is_err());
        assert!(parse(br#"{"nftables": [{"counter": {"name": "x-up"}}]}"#).is_err());
    }
}
