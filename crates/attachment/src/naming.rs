//! File names of attachment records: (container ID, ifname) escaped so that
//! two attachments never share a name, and bounded so that every container
//! ID the plugin accepts (up to 256 bytes) fits in a file name (255 bytes,
//! temp names included).
//!
//! The escaping is the one `edgelink-ipam` uses for its owner files: bytes
//! other than ASCII letters, digits and `-` become `%XX`, so `_` joins the
//! two components unambiguously and a name never contains `/` or `.` (nor
//! starts with `.`, which marks temp files). It is not shared with that
//! crate: neither should depend on the other, and the IPAM store's cut names
//! carry a 64-bit FNV-1a hash that its existing stores depend on, whereas
//! records use SHA-256 (a name chosen to collide must not make one pod's DEL
//! remove another pod's record).
//!
//! Until this naming, records were `{cid}_{ifname}.json`, where (`a_b`, `c`)
//! and (`a`, `b_c`) collide. [`legacy_name`] gives that name, so that the
//! store can still find, migrate and remove such records.

use sha2::{Digest, Sha256};
use std::fmt::Write as _;

/// Linux's limit on one path component (NAME_MAX).
pub(crate) const NAME_MAX: usize = 255;
/// Escaped keys longer than this are cut and suffixed with a hash.
const MAX_KEY_LEN: usize = 200;
/// What is kept of a cut key, before `~` and the hash.
const KEPT_KEY_LEN: usize = 160;
/// Hex digits of SHA-256 kept in a cut key (128 bits).
const HASH_HEX_LEN: usize = 32;

pub(crate) const RECORD_SUFFIX: &str = ".json";
pub(crate) const TEMP_SUFFIX: &str = ".tmp";

/// The escaped, bounded key of (container ID, ifname): at most
/// [`MAX_KEY_LEN`] bytes of `[A-Za-z0-9%_~-]`.
pub(crate) fn key(container_id: &str, ifname: &str) -> String {
    let mut out = String::with_capacity(container_id.len() + ifname.len() + 1);
    for (i, part) in [container_id, ifname].iter().enumerate() {
        if i > 0 {
            out.push('_');
        }
        for b in part.bytes() {
            if b.is_ascii_alphanumeric() || b == b'-' {
                out.push(char::from(b));
            } else {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    if out.len() > MAX_KEY_LEN {
        let digest = Sha256::digest(out.as_bytes());
        // The escaped key is ASCII: any cut is on a character boundary.
        out.truncate(KEPT_KEY_LEN);
        out.push('~');
        for b in &digest[..HASH_HEX_LEN / 2] {
            let _ = write!(out, "{b:02x}");
        }
    }
    out
}

/// `<key>.json`.
pub(crate) fn record_name(container_id: &str, ifname: &str) -> String {
    format!("{}{RECORD_SUFFIX}", key(container_id, ifname))
}

/// `.<key>.<pid>.<n>.tmp`: a temp file of a write in progress.
pub(crate) fn temp_name(container_id: &str, ifname: &str, pid: u32, n: u64) -> String {
    format!(".{}.{pid}.{n}{TEMP_SUFFIX}", key(container_id, ifname))
}

/// The name records had before [`record_name`]: `{cid}_{ifname}.json`, when
/// it differs from the current name and can exist at all (no `/`, not
/// longer than [`NAME_MAX`]).
pub(crate) fn legacy_name(container_id: &str, ifname: &str) -> Option<String> {
    let name = format!("{container_id}_{ifname}{RECORD_SUFFIX}");
    (name.len() <= NAME_MAX
        && !name.contains('/')
        && !name.starts_with('.')
        && name != record_name(container_id, ifname))
    .then_some(name)
}

/// Whether a legacy name splits into (container ID, ifname) in one way only
/// (one `_`), so that a record under it that cannot be read still belongs
/// to the attachment of that split.
pub(crate) fn legacy_is_unambiguous(name: &str) -> bool {
    name.strip_suffix(RECORD_SUFFIX)
        .is_some_and(|stem| stem.matches('_').count() == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unambiguous() {
        assert_eq!(record_name("abc123", "net1"), "abc123_net1.json");
        assert_eq!(record_name("a_b", "c"), "a%5Fb_c.json");
        assert_eq!(record_name("a", "b_c"), "a_b%5Fc.json");
        assert_ne!(record_name("a_b", "c"), record_name("a", "b_c"));
        assert_ne!(record_name("a.b", "c"), record_name("a", "b.c"));
        // Escaped names never carry a path, a dot or a leading dot.
        let n = record_name("..", "../../etc/passwd");
        let stem = n.strip_suffix(RECORD_SUFFIX).unwrap();
        assert!(
            !stem.contains('/') && !stem.contains('.') && !n.starts_with('.'),
            "{n}"
        );
    }

    #[test]
    fn names_are_bounded_for_every_legal_container_id() {
        // Container IDs are 1..=256 bytes of [A-Za-z0-9_.-]; '_' and '.'
        // escape to three bytes each; interface names are 1..=15 bytes.
        for cid in [
            "a".repeat(256),
            "_".repeat(256),
            format!("a{}", ".".repeat(255)),
        ] {
            for ifname in ["net1", "e%%%%%%%%%%%%%%"] {
                let rec = record_name(&cid, ifname);
                let tmp = temp_name(&cid, ifname, u32::MAX, u64::MAX);
                assert!(rec.len() <= NAME_MAX, "{}: {rec}", rec.len());
                assert!(tmp.len() <= NAME_MAX, "{}: {tmp}", tmp.len());
                assert!(key(&cid, ifname).len() <= MAX_KEY_LEN);
            }
        }
        // Long names stay distinct: the hash covers the whole key.
        let long = "a".repeat(256);
        let mut other = long.clone();
        other.replace_range(255.., "b");
        assert_ne!(record_name(&long, "net1"), record_name(&other, "net1"));
        assert_ne!(record_name(&long, "net1"), record_name(&long, "net2"));
        assert_eq!(record_name(&long, "net1"), record_name(&long, "net1"));
        // A key that fits is not hashed.
        assert!(!key(&"a".repeat(190), "net1").contains('~'));
        assert!(key(&"a".repeat(196), "net1").contains('~'));
    }

    #[test]
    fn legacy_names() {
        // Plain IDs had the same name then as now: nothing to migrate.
        assert_eq!(legacy_name("abc123", "net1"), None);
        assert_eq!(legacy_name("a_b", "c").as_deref(), Some("a_b_c.json"));
        assert_eq!(legacy_name("a", "b_c").as_deref(), Some("a_b_c.json"));
        assert_eq!(legacy_name("c.1", "net1").as_deref(), Some("c.1_net1.json"));
        // Too long to have existed.
        assert_eq!(legacy_name(&"a".repeat(250), "net1"), None);
        assert!(legacy_is_unambiguous("c.1_net1.json"));
        assert!(!legacy_is_unambiguous("a_b_c.json"));
    }
}
