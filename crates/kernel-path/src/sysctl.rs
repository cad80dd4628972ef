//! Sysctls. /proc/sys/net shows the namespace of the thread that opens a
//! file there, so the setters must run on a thread inside the pod's
//! namespace; [`conntrack_headroom`] reads the caller's own.

use crate::{Error, Options};
use edgelink_netns::Netns;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

// Under `Options::proc_sys_net` (/proc/sys/net, or a bind mount of it: a
// container's own /proc/sys is read-only, and a thread inside the pod's
// namespace still sees that namespace's values through the mount).
pub(crate) const IPV4_FORWARD: &str = "ipv4/ip_forward";
pub(crate) const IPV6_FORWARDING: &str = "ipv6/conf/all/forwarding";
pub(crate) const TCP_TIME_WAIT: &str = "netfilter/nf_conntrack_tcp_timeout_time_wait";
pub(crate) const UDP_TIMEOUT: &str = "netfilter/nf_conntrack_udp_timeout";
pub(crate) const UDP_STREAM_TIMEOUT: &str = "netfilter/nf_conntrack_udp_timeout_stream";
const CONNTRACK_MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";
const CONNTRACK_COUNT: &str = "/proc/sys/net/netfilter/nf_conntrack_count";

/// The three conntrack timeouts of [`Options`], in seconds, checked.
pub(crate) struct ConntrackTimeouts {
    root: PathBuf,
    values: [(&'static str, u64); 3],
}

impl ConntrackTimeouts {
    pub(crate) fn from_options(opts: &Options) -> Result<ConntrackTimeouts, Error> {
        let secs = |option: &'static str, d: Duration| {
            if d.subsec_nanos() != 0 || d.as_secs() == 0 || d.as_secs() > i32::MAX as u64 {
                Err(Error::InvalidOption {
                    option,
                    reason: format!("{d:?} is not a whole number of seconds from 1 s"),
                })
            } else {
                Ok(d.as_secs())
            }
        };
        Ok(ConntrackTimeouts {
            root: opts.proc_sys_net.clone(),
            values: [
                (TCP_TIME_WAIT, secs("tcp_time_wait", opts.tcp_time_wait)?),
                (UDP_TIMEOUT, secs("udp_timeout", opts.udp_timeout)?),
                (
                    UDP_STREAM_TIMEOUT,
                    secs("udp_stream_timeout", opts.udp_stream_timeout)?,
                ),
            ],
        })
    }

    /// Write them; the calling thread must be inside `netns`.
    pub(crate) fn apply(&self, netns: &Netns) -> Result<(), Error> {
        for (path, secs) in self.values {
            set(netns, &self.root.join(path), &secs.to_string())?;
        }
        Ok(())
    }
}

/// Forwarding on (`Some(private interface)`) or off (`None`). On: IPv4
/// `ip_forward` and the private interface's own IPv4 forwarding (which
/// `ip_forward` changes only when it changes itself), IPv6 forwarding when
/// `ipv6`. Off: `ip_forward` (every interface with it) and IPv6 forwarding
/// where the namespace has IPv6. The calling thread must be inside `netns`.
pub(crate) fn set_forwarding(
    netns: &Netns,
    root: &Path,
    on: Option<&str>,
    ipv6: bool,
) -> Result<(), Error> {
    set(
        netns,
        &root.join(IPV4_FORWARD),
        if on.is_some() { "1" } else { "0" },
    )?;
    if let Some(ifname) = on {
        let conf = root.join("ipv4/conf").join(ifname).join("forwarding");
        set(netns, &conf, "1")?;
    }
    let v6 = on.is_some() && ipv6;
    let v6_path = root.join(IPV6_FORWARDING);
    if v6 || v6_path.exists() {
        set(netns, &v6_path, if v6 { "1" } else { "0" })?;
    }
    Ok(())
}

fn set(netns: &Netns, path: &Path, value: &str) -> Result<(), Error> {
    fs::write(path, value).map_err(|source| Error::SetSysctl {
        netns: netns.path().to_path_buf(),
        path: path.to_path_buf(),
        value: value.to_string(),
        source,
    })
}

/// Whether the conntrack table of the CALLER's namespace has room for
/// `required` more flows: a warning when nf_conntrack_max is below it, or
/// when nf_conntrack_count is above 90% of the max; None when all is well.
///
/// nf_conntrack_max is the node's (a pod's namespace shows it read-only);
/// nf_conntrack_count counts the flows of the namespace that reads it.
pub fn conntrack_headroom(required: u64) -> Result<Option<String>, Error> {
    let Some(max) = read_u64(Path::new(CONNTRACK_MAX))? else {
        return Ok(Some(format!(
            "{CONNTRACK_MAX} is missing: conntrack is not loaded yet, so its table size cannot be checked"
        )));
    };
    let count = read_u64(Path::new(CONNTRACK_COUNT))?.unwrap_or(0);
    Ok(headroom_warning(max, count, required))
}

pub(crate) fn headroom_warning(max: u64, count: u64, required: u64) -> Option<String> {
    if max < required {
        Some(format!(
            "net.netfilter.nf_conntrack_max is {max}, below the {required} flows the kernel path needs"
        ))
    } else if u128::from(count) * 10 > u128::from(max) * 9 {
        Some(format!(
            "net.netfilter.nf_conntrack_count is {count}, over 90% of nf_conntrack_max ({max})"
        ))
    } else {
        None
    }
}

/// The number in a sysctl file, or None when there is no such file.
pub(crate) fn read_u64(path: &Path) -> Result<Option<u64>, Error> {
    let bad = |source: io::Error| Error::ReadSysctl {
        path: PathBuf::from(path),
        source,
    };
    match fs::read_to_string(path) {
        Ok(s) => s.trim().parse().map(Some).map_err(|e| {
            bad(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{s:?}: {e}"),
            ))
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(bad(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headroom_warns_when_max_is_short_or_the_table_nearly_full() {
        assert_eq!(headroom_warning(262_144, 10, 65_536), None);
        let short = headroom_warning(1000, 0, 65_536).unwrap();
        assert!(short.contains("1000") && short.contains("65536"), "{short}");
        assert_eq!(headroom_warning(1000, 900, 10), None);
        let full = headroom_warning(1000, 901, 10).unwrap();
        assert!(full.contains("901") && full.contains("90%"), "{full}");
        assert!(headroom_warning(u64::MAX, u64::MAX, 1).is_some());
    }

    #[test]
    fn headroom_reads_this_namespace() {
        // Whatever the machine's numbers, the call must not fail.
        conntrack_headroom(1).unwrap();
    }

    #[test]
    fn timeouts_must_be_whole_seconds() {
        let mut opts = Options::default();
        assert!(ConntrackTimeouts::from_options(&opts).is_ok());
        opts.udp_timeout = Duration::from_millis(1500);
        let e = ConntrackTimeouts::from_options(&opts).err().unwrap();
        assert!(e.to_string().contains("udp_timeout"), "{e}");
        opts.udp_timeout = Duration::ZERO;
        assert!(ConntrackTimeouts::from_options(&opts).is_err());
    }
}
