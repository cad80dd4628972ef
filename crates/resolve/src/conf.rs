//! The resolver configuration: resolv.conf text, or the CNI `dns`
//! dictionary, parsed into a [`ResolvConf`]; and the names a lookup tries
//! (search list and ndots, as glibc does).
//!
//! Pure parsing: it reads no file and opens no socket.

use crate::ResolveError;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// At most this many nameservers are used (glibc's MAXNS).
pub const MAX_NAMESERVERS: usize = 3;
/// glibc's caps on the options.
const MAX_NDOTS: u8 = 15;
const MAX_TIMEOUT_SECS: u64 = 30;
const MAX_ATTEMPTS: u8 = 5;

/// resolv.conf semantics: nameserver (max 3, port 53, IPv4/IPv6), search
/// (list), options ndots:N timeout:N attempts:N (defaults as glibc: ndots
/// 1, timeout 5 s, attempts 2); `domain` as a one-entry search; comments
/// `#` and `;`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvConf {
    pub nameservers: Vec<SocketAddr>,
    pub search: Vec<String>,
    pub ndots: u8,
    pub timeout: Duration,
    pub attempts: u8,
}

impl ResolvConf {
    /// Parse resolv.conf text. Unknown keywords and options are ignored
    /// (as glibc does); a nameserver that is no IP address, or an option
    /// value that is no number, is an error naming its line; so is a text
    /// with no nameserver at all.
    pub fn parse(text: &str) -> Result<ResolvConf, ResolveError> {
        let mut b = Builder::default();
        for (i, raw) in text.lines().enumerate() {
            let line = match raw.find(['#', ';']) {
                Some(at) => &raw[..at],
                None => raw,
            };
            let mut words = line.split_whitespace();
            let Some(keyword) = words.next() else {
                continue;
            };
            let bad = |reason: String| ResolveError::Conf {
                line: i + 1,
                text: raw.trim().to_string(),
                reason,
            };
            match keyword {
                "nameserver" => {
                    let Some(addr) = words.next() else {
                        return Err(bad("a nameserver line without an address".into()));
                    };
                    b.nameserver(addr).map_err(bad)?;
                }
                "domain" => {
                    b.search = words.next().map(domain).into_iter().flatten().collect();
                }
                "search" => {
                    b.search = words.filter_map(domain).collect();
                }
                "options" => {
                    for opt in words {
                        b.option(opt).map_err(bad)?;
                    }
                }
                _ => {}
            }
        }
        b.finish()
    }

    /// From the CNI "dns" dictionary (runtimeConfig.dns capability or the
    /// netconf's `dns`): nameservers (IP addresses, or "ip:port"), search
    /// (domains), options (strings like "ndots:5"). An error names the
    /// value at fault.
    pub fn from_parts(
        nameservers: &[String],
        search: &[String],
        options: &[String],
    ) -> Result<ResolvConf, ResolveError> {
        let mut b = Builder::default();
        for ns in nameservers {
            b.nameserver(ns).map_err(|reason| ResolveError::ConfValue {
                value: ns.clone(),
                reason,
            })?;
        }
        b.search = search.iter().filter_map(|s| domain(s)).collect();
        for opt in options {
            b.option(opt).map_err(|reason| ResolveError::ConfValue {
                value: opt.clone(),
                reason,
            })?;
        }
        b.finish()
    }

    /// The absolute names (with the trailing dot) a lookup of `host` tries,
    /// in order, as glibc's res_nsearch: "name." only itself; a name with
    /// at least `ndots` dots first as given, then with each search domain;
    /// one with fewer, with each search domain first and as given last.
    pub fn candidates(&self, host: &str) -> Vec<String> {
        if host.ends_with('.') {
            return vec![host.to_string()];
        }
        let as_given = format!("{host}.");
        let searched = self.search.iter().map(|d| format!("{host}.{d}."));
        let dots = host.matches('.').count();
        let mut out: Vec<String> = if dots >= usize::from(self.ndots) {
            std::iter::once(as_given).chain(searched).collect()
        } else {
            searched.chain(std::iter::once(as_given)).collect()
        };
        let mut seen = std::collections::HashSet::new();
        out.retain(|n| seen.insert(n.to_ascii_lowercase()));
        out
    }
}

/// A search domain without its trailing dot; None for an empty one or ".".
fn domain(s: &str) -> Option<String> {
    let d = s.trim().trim_end_matches('.');
    (!d.is_empty()).then(|| d.to_string())
}

struct Builder {
    nameservers: Vec<SocketAddr>,
    search: Vec<String>,
    ndots: u8,
    timeout: Duration,
    attempts: u8,
}

impl Default for Builder {
    fn default() -> Builder {
        Builder {
            nameservers: Vec::new(),
            search: Vec::new(),
            ndots: 1,
            timeout: Duration::from_secs(5),
            attempts: 2,
        }
    }
}

impl Builder {
    /// An IP address (port 53), or "ip:port" / "[ipv6]:port". Past the
    /// third, nameservers are ignored, as glibc does.
    fn nameserver(&mut self, s: &str) -> Result<(), String> {
        let addr = match s.parse::<IpAddr>() {
            Ok(ip) => SocketAddr::new(ip, 53),
            Err(_) => match s.parse::<SocketAddr>() {
                Ok(sa) => sa,
                Err(_) if s.contains('%') => {
                    return Err(format!(
                        "nameserver {s:?}: a scoped (link-local) IPv6 address is not supported"
                    ))
                }
                Err(_) => return Err(format!("nameserver {s:?} is no IP address")),
            },
        };
        if self.nameservers.len() < MAX_NAMESERVERS {
            self.nameservers.push(addr);
        }
        Ok(())
    }

    /// One option word; unknown options (edns0, rotate, trust-ad, ...) are
    /// ignored.
    fn option(&mut self, opt: &str) -> Result<(), String> {
        let Some((key, value)) = opt.split_once(':') else {
            return Ok(());
        };
        let num = || -> Result<u64, String> {
            value
                .parse::<u64>()
                .map_err(|_| format!("option {key}: {value:?} is no number"))
        };
        match key {
            "ndots" => self.ndots = num()?.min(u64::from(MAX_NDOTS)) as u8,
            "timeout" => self.timeout = Duration::from_secs(num()?.clamp(1, MAX_TIMEOUT_SECS)),
            "attempts" => self.attempts = num()?.clamp(1, u64::from(MAX_ATTEMPTS)) as u8,
            _ => {}
        }
        Ok(())
    }

    fn finish(self) -> Result<ResolvConf, ResolveError> {
        if self.nameservers.is_empty() {
            return Err(ResolveError::NoNameserver);
        }
        Ok(ResolvConf {
            nameservers: self.nameservers,
            search: self.search,
            ndots: self.ndots,
            timeout: self.timeout,
            attempts: self.attempts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K8S: &str = "\
# generated by the kubelet
search hil.svc.cluster.local svc.cluster.local cluster.local
nameserver 10.96.0.10
options ndots:5 edns0 trust-ad
";

    #[test]
    fn parses_a_kubernetes_resolv_conf() {
        let c = ResolvConf::parse(K8S).unwrap();
        assert_eq!(c.nameservers, vec!["10.96.0.10:53".parse().unwrap()]);
        assert_eq!(
            c.search,
            [
                "hil.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local"
            ]
        );
        assert_eq!(c.ndots, 5);
        assert_eq!(c.timeout, Duration::from_secs(5));
        assert_eq!(c.attempts, 2);
    }

    #[test]
    fn defaults_limits_comments_and_domain() {
        let c = ResolvConf::parse(
            "; a comment\n\
             domain example.org\n\
             nameserver 192.0.2.1 # inline comment\n\
             nameserver 2001:db8::53\n\
             nameserver 192.0.2.3\n\
             nameserver 192.0.2.4\n\
             sortlist 130.155.160.0/255.255.240.0\n\
             options timeout:99 attempts:0 ndots:40 rotate\n",
        )
        .unwrap();
        assert_eq!(
            c.nameservers,
            vec![
                "192.0.2.1:53".parse::<SocketAddr>().unwrap(),
                "[2001:db8::53]:53".parse().unwrap(),
                "192.0.2.3:53".parse().unwrap(),
            ]
        );
        assert_eq!(c.search, ["example.org"]);
        assert_eq!(c.timeout, Duration::from_secs(30));
        assert_eq!(c.attempts, 1);
        assert_eq!(c.ndots, 15);
        let d = ResolvConf::parse("nameserver 192.0.2.1\n").unwrap();
        assert_eq!((d.ndots, d.attempts), (1, 2));
        assert!(d.search.is_empty());
        // The last of search/domain wins.
        let e = ResolvConf::parse("search a.b c.d.\ndomain x.y\nnameserver 192.0.2.1").unwrap();
        assert_eq!(e.search, ["x.y"]);
    }

    #[test]
    fn bad_resolv_conf_names_the_line() {
        let e = ResolvConf::parse("search a\nnameserver dns.example\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && e.contains("dns.example"), "{e}");
        let e = ResolvConf::parse("nameserver 192.0.2.1\n\noptions ndots:five\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3") && e.contains("five"), "{e}");
        let e = ResolvConf::parse("nameserver\n").unwrap_err().to_string();
        assert!(e.contains("line 1"), "{e}");
        let e = ResolvConf::parse("nameserver fe80::1%eth0\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("scoped"), "{e}");
        assert!(matches!(
            ResolvConf::parse("# nothing\nsearch a.b\n"),
            Err(ResolveError::NoNameserver)
        ));
        assert!(matches!(
            ResolvConf::parse(""),
            Err(ResolveError::NoNameserver)
        ));
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn from_parts_good_and_bad() {
        let c = ResolvConf::from_parts(
            &strings(&["10.96.0.10", "[2001:db8::1]:5353"]),
            &strings(&["svc.cluster.local", ""]),
            &strings(&["ndots:5", "attempts:3", "edns0"]),
        )
        .unwrap();
        assert_eq!(
            c.nameservers,
            vec![
                "10.96.0.10:53".parse::<SocketAddr>().unwrap(),
                "[2001:db8::1]:5353".parse().unwrap()
            ]
        );
        assert_eq!(c.search, ["svc.cluster.local"]);
        assert_eq!((c.ndots, c.attempts), (5, 3));

        let e = ResolvConf::from_parts(&strings(&["kube-dns"]), &[], &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("kube-dns"), "{e}");
        let e = ResolvConf::from_parts(&strings(&["10.96.0.10"]), &[], &strings(&["timeout:x"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("timeout:x"), "{e}");
        assert!(matches!(
            ResolvConf::from_parts(&[], &strings(&["a.b"]), &[]),
            Err(ResolveError::NoNameserver)
        ));
    }

    #[test]
    fn candidates_follow_ndots_and_search() {
        let c = ResolvConf::parse(K8S).unwrap();
        // Fewer dots than ndots (5): the search list first.
        assert_eq!(
            c.candidates("mqtt"),
            [
                "mqtt.hil.svc.cluster.local.",
                "mqtt.svc.cluster.local.",
                "mqtt.cluster.local.",
                "mqtt."
            ]
        );
        assert_eq!(
            c.candidates("mqtt.hil.svc.cluster.local")[0],
            "mqtt.hil.svc.cluster.local.hil.svc.cluster.local."
        );
        assert_eq!(
            c.candidates("mqtt.hil.svc.cluster.local").last().unwrap(),
            "mqtt.hil.svc.cluster.local."
        );
        // Absolute: only itself.
        assert_eq!(
            c.candidates("mqtt.hil.svc.cluster.local."),
            ["mqtt.hil.svc.cluster.local."]
        );
        // ndots 1: a dotted name as given first.
        let d = ResolvConf::parse("search lab.example\nnameserver 192.0.2.1").unwrap();
        assert_eq!(
            d.candidates("broker.rig"),
            ["broker.rig.", "broker.rig.lab.example."]
        );
        assert_eq!(d.candidates("broker"), ["broker.lab.example.", "broker."]);
        // No search list: the name alone.
        let e = ResolvConf::parse("nameserver 192.0.2.1").unwrap();
        assert_eq!(e.candidates("broker"), ["broker."]);
    }
}
