//! The candidate addresses of one range set: which addresses may ever be
//! handed out, and the round-robin walk over them. Pure logic; whether a
//! candidate is free is asked of the caller.

use std::net::IpAddr;

use crate::addr;
use crate::config::{IpamConfig, Range};

/// The allocatable addresses of range set `set` of a config.
pub(crate) struct Pool<'a> {
    ranges: &'a [Range],
    v4: bool,
    /// Excluded spans of this set's family, as integers.
    excluded: Vec<(u128, u128)>,
    /// Gateways of every range of the config (of this family).
    gateways: Vec<u128>,
}

impl<'a> Pool<'a> {
    pub fn new(cfg: &'a IpamConfig, set: usize) -> Option<Pool<'a>> {
        let ranges = &cfg.range_sets.get(set)?.ranges;
        let v4 = ranges.first()?.start.is_ipv4();
        let excluded = cfg
            .exclude
            .iter()
            .filter(|n| n.is_ipv4() == v4)
            .map(addr::net_span)
            .collect();
        let gateways = cfg
            .range_sets
            .iter()
            .flat_map(|s| s.ranges.iter())
            .filter_map(|r| r.gateway)
            .filter(|g| g.is_ipv4() == v4)
            .map(addr::to_u128)
            .collect();
        Some(Pool {
            ranges,
            v4,
            excluded,
            gateways,
        })
    }

    /// `a-b (subnet), ...`: the ranges, for error messages.
    pub fn describe(&self) -> String {
        self.ranges
            .iter()
            .map(|r| format!("{}-{} ({})", r.start, r.end, r.subnet))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Whether `ip` may be handed out from this set: inside a range's
    /// `start..=end`, not the network or (IPv4) broadcast address of its
    /// subnet, not a gateway, not excluded.
    pub fn allocatable(&self, ip: IpAddr) -> bool {
        if ip.is_ipv4() != self.v4 {
            return false;
        }
        let v = addr::to_u128(ip);
        match self.ranges.iter().find(|r| r.contains(ip)) {
            Some(r) => self.excluded_until(v).is_none() && !self.is_reserved(r, v),
            None => false,
        }
    }

    /// If `v` is excluded, the last address of the exclusion covering it.
    fn excluded_until(&self, v: u128) -> Option<u128> {
        self.excluded
            .iter()
            .filter(|(lo, hi)| *lo <= v && v <= *hi)
            .map(|(_, hi)| *hi)
            .max()
    }

    /// Network, broadcast (IPv4) or a gateway.
    fn is_reserved(&self, range: &Range, v: u128) -> bool {
        if self.gateways.contains(&v) {
            return true;
        }
        if !addr::has_reserved_edges(&range.subnet) {
            return false;
        }
        let (network, broadcast) = addr::net_span(&range.subnet);
        v == network || (self.v4 && v == broadcast)
    }

    /// Walk the allocatable addresses round-robin, starting right after
    /// `cursor` (the last address reserved from this set; from the first
    /// range's start when it is none or not in the set), wrapping around once,
    /// and return the first one `accept` takes. Excluded spans are skipped in
    /// one step, so a large exclusion costs nothing.
    pub fn find<E>(
        &self,
        cursor: Option<IpAddr>,
        mut accept: impl FnMut(IpAddr) -> Result<bool, E>,
    ) -> Result<Option<IpAddr>, E> {
        let n = self.ranges.len();
        let (first_idx, first_val) = self.start_after(cursor);
        // Segments: [first_val, end(first)], the following ranges, then the
        // beginning of the first range up to first_val - 1.
        for step in 0..=n {
            let idx = (first_idx + step) % n;
            let range = &self.ranges[idx];
            let (start, end) = range.span();
            let (lo, hi) = if step == 0 {
                (first_val, end)
            } else if step == n {
                if first_val == start {
                    break;
                }
                (start, first_val - 1)
            } else {
                (start, end)
            };
            let mut cur = lo;
            while cur <= hi {
                if let Some(last) = self.excluded_until(cur) {
                    match last.checked_add(1) {
                        Some(next) => {
                            cur = next;
                            continue;
                        }
                        None => break,
                    }
                }
                if !self.is_reserved(range, cur) && accept(addr::from_u128(cur, self.v4))? {
                    return Ok(Some(addr::from_u128(cur, self.v4)));
                }
                match cur.checked_add(1) {
                    Some(next) => cur = next,
                    None => break,
                }
            }
        }
        Ok(None)
    }

    /// (range index, first candidate) of the walk.
    fn start_after(&self, cursor: Option<IpAddr>) -> (usize, u128) {
        let from_start = (0, self.ranges[0].span().0);
        let Some(ip) = cursor.filter(|ip| ip.is_ipv4() == self.v4) else {
            return from_start;
        };
        let Some(idx) = self.ranges.iter().position(|r| r.contains(ip)) else {
            return from_start;
        };
        let v = addr::to_u128(ip);
        let (_, end) = self.ranges[idx].span();
        if v < end {
            (idx, v + 1)
        } else {
            let next = (idx + 1) % self.ranges.len();
            (next, self.ranges[next].span().0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::HashSet;
    use std::convert::Infallible;

    fn cfg(v: serde_json::Value) -> IpamConfig {
        IpamConfig::from_json(&v, "n").unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Every candidate in walk order.
    fn walk(pool: &Pool, cursor: Option<&str>) -> Vec<IpAddr> {
        let mut seen = Vec::new();
        let r: Result<_, Infallible> = pool.find(cursor.map(ip), |c| {
            seen.push(c);
            Ok(false)
        });
        assert_eq!(r.unwrap(), None);
        seen
    }

    #[test]
    fn walk_skips_network_broadcast_gateway_and_excludes() {
        let c = cfg(json!({
            "ranges": [[{"subnet": "10.0.0.0/29", "rangeStart": "10.0.0.0", "rangeEnd": "10.0.0.7", "gateway": "10.0.0.1"}]],
            "exclude": ["10.0.0.4/31"]
        }));
        let p = Pool::new(&c, 0).unwrap();
        assert_eq!(
            walk(&p, None),
            vec![ip("10.0.0.2"), ip("10.0.0.3"), ip("10.0.0.6")]
        );
        assert!(p.allocatable(ip("10.0.0.6")));
        for bad in [
            "10.0.0.0", "10.0.0.1", "10.0.0.4", "10.0.0.5", "10.0.0.7", "10.0.1.1", "fd00::1",
        ] {
            assert!(!p.allocatable(ip(bad)), "{bad}");
        }
    }

    #[test]
    fn walk_is_round_robin_across_ranges_and_wraps_once() {
        let c = cfg(json!({"ranges": [[
            {"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.10", "rangeEnd": "10.0.0.12"},
            {"subnet": "10.0.1.0/24", "rangeStart": "10.0.1.10", "rangeEnd": "10.0.1.11"}]]}));
        let p = Pool::new(&c, 0).unwrap();
        let all = |v: &[&str]| v.iter().map(|s| ip(s)).collect::<Vec<_>>();
        assert_eq!(
            walk(&p, None),
            all(&[
                "10.0.0.10",
                "10.0.0.11",
                "10.0.0.12",
                "10.0.1.10",
                "10.0.1.11"
            ])
        );
        assert_eq!(
            walk(&p, Some("10.0.0.11")),
            all(&[
                "10.0.0.12",
                "10.0.1.10",
                "10.0.1.11",
                "10.0.0.10",
                "10.0.0.11"
            ])
        );
        assert_eq!(
            walk(&p, Some("10.0.1.11")),
            all(&[
                "10.0.0.10",
                "10.0.0.11",
                "10.0.0.12",
                "10.0.1.10",
                "10.0.1.11"
            ])
        );
        assert_eq!(
            walk(&p, Some("10.0.0.12")),
            all(&[
                "10.0.1.10",
                "10.0.1.11",
                "10.0.0.10",
                "10.0.0.11",
                "10.0.0.12"
            ])
        );
        // A cursor outside the set starts from the beginning.
        assert_eq!(walk(&p, Some("192.168.0.1"))[0], ip("10.0.0.10"));
        assert_eq!(walk(&p, Some("fd00::1"))[0], ip("10.0.0.10"));
    }

    #[test]
    fn huge_ipv6_exclusions_are_skipped_in_one_step() {
        let c = cfg(json!({
            "ranges": [[{"subnet": "fd00::/64"}]],
            "exclude": ["fd00::/65", "fd00::8000:0:0:0/66"]
        }));
        let p = Pool::new(&c, 0).unwrap();
        let mut tried = 0u32;
        let got: Result<_, Infallible> = p.find(None, |_| {
            tried += 1;
            Ok(true)
        });
        assert_eq!(got.unwrap(), Some(ip("fd00::c000:0:0:0")));
        assert_eq!(tried, 1);
    }

    #[test]
    fn ipv6_top_of_space_does_not_overflow() {
        let c =
            cfg(json!({"ranges": [[{"subnet": "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0/124"}]]}));
        let p = Pool::new(&c, 0).unwrap();
        let w = walk(&p, Some("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe"));
        assert_eq!(w.len(), 15, "network excluded, all others once");
        assert_eq!(w.iter().collect::<HashSet<_>>().len(), 15);
        assert_eq!(w[0], ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"));
    }

    #[test]
    fn accept_errors_propagate() {
        let c = cfg(json!({"ranges": [[{"subnet": "10.0.0.0/30"}]]}));
        let p = Pool::new(&c, 0).unwrap();
        assert_eq!(p.find(None, |_| Err::<bool, _>("boom")), Err("boom"));
        assert!(Pool::new(&c, 1).is_none());
        assert_eq!(p.describe(), "10.0.0.1-10.0.0.2 (10.0.0.0/30)");
    }
}
