//! Sysctls in the pod's namespace, and errors that name what failed.

use crate::lab::*;
use crate::{full_plan, TABLE};
use edgelink_kernel_path::{counters, ensure, list_table, remove, Error, Options};
use std::path::PathBuf;
use std::time::Duration;

const TIME_WAIT: &str = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_time_wait";
const UDP: &str = "/proc/sys/net/netfilter/nf_conntrack_udp_timeout";
const UDP_STREAM: &str = "/proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream";

fn host(path: &str) -> String {
    std::fs::read_to_string(path).unwrap().trim().to_string()
}

#[test]
fn conntrack_timeouts_and_forwarding_are_set_in_the_pod_only() {
    let Some(nft) = nft_or_skip("conntrack_timeouts_and_forwarding") else {
        return;
    };
    let lab = Lab::new();
    let host_before: Vec<String> = [TIME_WAIT, UDP, UDP_STREAM].map(host).to_vec();
    let opts = Options {
        nft,
        tcp_time_wait: Duration::from_secs(17),
        udp_timeout: Duration::from_secs(23),
        udp_stream_timeout: Duration::from_secs(41),
        ..Options::default()
    };
    ensure(&lab.pod.netns, &full_plan(), &opts).unwrap();
    assert_eq!(lab.pod.read(TIME_WAIT), "17");
    assert_eq!(lab.pod.read(UDP), "23");
    assert_eq!(lab.pod.read(UDP_STREAM), "41");
    assert_eq!(lab.pod.read("/proc/sys/net/ipv4/ip_forward"), "1");
    assert_eq!(lab.pod.read("/proc/sys/net/ipv6/conf/all/forwarding"), "1");
    // The other namespaces keep theirs.
    let host_after: Vec<String> = [TIME_WAIT, UDP, UDP_STREAM].map(host).to_vec();
    assert_eq!(host_before, host_after);
    assert_eq!(lab.client.read("/proc/sys/net/ipv4/ip_forward"), "0");

    // IPv4 targets only: IPv6 forwarding goes back off.
    let mut v4 = full_plan();
    v4.forwards.retain(|f| f.target.is_ipv4());
    ensure(&lab.pod.netns, &v4, &Options::default_with(&opts)).unwrap();
    assert_eq!(lab.pod.read("/proc/sys/net/ipv6/conf/all/forwarding"), "0");
    assert_eq!(lab.pod.read("/proc/sys/net/ipv4/ip_forward"), "1");
    assert_eq!(lab.pod.read(UDP), "30");
}

/// A bind mount of /proc/sys/net in a temporary directory, unmounted on
/// drop: what the DaemonSet gives edgelinkd (its own /proc/sys is
/// read-only in a container).
struct BindMount(tempfile::TempDir);

impl BindMount {
    fn of_proc_sys_net() -> BindMount {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("mount")
            .args(["--bind", "/proc/sys/net"])
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        BindMount(dir)
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

#[test]
fn sysctls_are_written_through_a_bind_mount_of_proc_sys_net_into_the_pod_only() {
    let Some(nft) = nft_or_skip("sysctls_through_a_bind_mount") else {
        return;
    };
    let lab = Lab::new();
    let mount = BindMount::of_proc_sys_net();
    let host_before = host(TIME_WAIT);
    let opts = Options {
        nft,
        tcp_time_wait: Duration::from_secs(19),
        proc_sys_net: mount.0.path().to_path_buf(),
        ..Options::default()
    };
    ensure(&lab.pod.netns, &full_plan(), &opts).unwrap();
    assert_eq!(lab.pod.read(TIME_WAIT), "19");
    assert_eq!(lab.pod.read("/proc/sys/net/ipv4/ip_forward"), "1");
    assert_eq!(host(TIME_WAIT), host_before);
    assert!(remove(&lab.pod.netns, TABLE, &opts).unwrap());
    assert_eq!(lab.pod.read("/proc/sys/net/ipv4/ip_forward"), "0");

    // A root that is not there: the error names the file.
    let bad = Options {
        proc_sys_net: PathBuf::from("/nonexistent/proc/sys/net"),
        ..opts
    };
    let e = ensure(&lab.pod.netns, &full_plan(), &bad).unwrap_err();
    assert!(
        e.to_string()
            .contains("/nonexistent/proc/sys/net/ipv4/ip_forward"),
        "{e}"
    );
}

trait DefaultWith {
    fn default_with(o: &Options) -> Options;
}

impl DefaultWith for Options {
    /// The defaults, with `o`'s nft.
    fn default_with(o: &Options) -> Options {
        Options {
            nft: o.nft.clone(),
            ..Options::default()
        }
    }
}

#[test]
fn a_bad_nft_path_is_named_and_nothing_changes() {
    let Some(nft) = nft_or_skip("a_bad_nft_path_is_named") else {
        return;
    };
    let lab = Lab::new();
    let bad = Options {
        nft: PathBuf::from("/nonexistent/edgelink-test-nft"),
        ..Options::default()
    };
    let e = ensure(&lab.pod.netns, &full_plan(), &bad).unwrap_err();
    assert!(matches!(e, Error::Spawn { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("/nonexistent/edgelink-test-nft"), "{text}");
    assert!(text.contains(&lab.pod.name), "{text}");
    for e in [
        remove(&lab.pod.netns, TABLE, &bad).unwrap_err(),
        counters(&lab.pod.netns, TABLE, &bad).unwrap_err(),
    ] {
        assert!(
            e.to_string().contains("/nonexistent/edgelink-test-nft"),
            "{e}"
        );
    }
    // Nothing was applied: no table, forwarding still off.
    assert_eq!(
        list_table(&lab.pod.netns, TABLE, &options(nft)).unwrap(),
        None
    );
    assert_eq!(lab.pod.read("/proc/sys/net/ipv4/ip_forward"), "0");
}

#[test]
fn nft_failures_carry_its_stderr() {
    let Some(_) = nft_or_skip("nft_failures_carry_its_stderr") else {
        return;
    };
    let lab = Lab::new();
    let dir = std::env::temp_dir().join(format!("elkk-fake-nft-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("nft");
    std::fs::write(
        &script,
        "#!/bin/sh\necho 'Error: kernel says no' >&2\nexit 1\n",
    )
    .unwrap();
    std::process::Command::new("chmod")
        .args(["+x"])
        .arg(&script)
        .status()
        .unwrap();
    let fake = Options {
        nft: script,
        ..Options::default()
    };
    let e = ensure(&lab.pod.netns, &full_plan(), &fake).unwrap_err();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(matches!(e, Error::Nft { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("kernel says no") && text.contains("table inet edgelink"),
        "{text}"
    );
    assert_eq!(lab.pod.read("/proc/sys/net/ipv4/ip_forward"), "0");
}

#[test]
fn a_target_outside_the_allowed_networks_installs_nothing() {
    let Some(nft) = nft_or_skip("a_target_outside_the_allowed_networks") else {
        return;
    };
    let lab = Lab::new();
    let opts = options(nft);
    let mut plan = full_plan();
    plan.forwards[0].target = addr(CLIENT, 22);
    let e = ensure(&lab.pod.netns, &plan, &opts).unwrap_err();
    assert!(matches!(e, Error::TargetNotAllowed { .. }), "{e:?}");
    assert!(e.to_string().contains("10.99.0.1:22"), "{e}");
    assert_eq!(list_table(&lab.pod.netns, TABLE, &opts).unwrap(), None);
}
