//! The scenario tests' DNS server: edgelink-resolve's test server (its
//! `testing` feature), so the daemon's tests and the resolver's own unit
//! tests answer from the same code.
//!
//! `DnsServer::start_in(netns_path, addr)` serves UDP and TCP on `addr`
//! inside that namespace (sockets made by a helper thread that entered
//! it; served from std threads); `set(name, addrs, ttl)` replaces a name's
//! A/AAAA records, `queries(name)` counts what arrived; dropping it stops
//! its threads within a fraction of a second. Also: `set_cname`, `remove`,
//! `set_silent`, `set_servfail`, `set_truncate_udp`, `tcp_queries`, `addr`.

pub use edgelink_resolve::testing::DnsServer;
