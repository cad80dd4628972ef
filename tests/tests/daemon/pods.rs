//! More than the one pod and the one address family: pods side by side
//! (each forward's sockets in its own pod's namespace), dual-stack forwards.

use crate::lab::*;
use edgelink_tests::*;
use std::net::SocketAddr;
use std::time::Duration;

fn echo_via(ns: &Netns, addr: SocketAddr, msg: &[u8]) {
    let mut s = connect_in(ns, addr, Duration::from_secs(3)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(echo(&mut s, msg), msg);
}

#[test]
fn two_pods_are_served_side_by_side_and_del_of_one_leaves_the_other() {
    let mut l = DLab::new();
    // A second proxy pod, its eth0 on the client's eth1.
    let pod2 = l.lab.pod();
    cable(&pod2, &l.client, "eth1", "10.244.2.10/24", "10.244.2.20/24");
    let p2 = pod2.path();
    let call = |cmd: &'static str| Call::new(cmd, "proxy-1-cid", Some(&p2), "net1");
    let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=hil;K8S_POD_NAME=proxy-1";
    let r2 = call("ADD").args(args).run(&l.lab.node, &l.conf).ok();
    let n = l.conf["forwards"].as_array().unwrap().len();
    let both =
        |s: &serde_json::Value| all_listening(s, CID, n) && all_listening(s, "proxy-1-cid", n);
    l.wait_status(Duration::from_secs(5), "both pods served", both);

    let pod2_api: SocketAddr = format!("10.244.2.10:{API}").parse().unwrap();
    echo_via(&l.client, pod_addr(API), b"via pod 1\n");
    echo_via(&l.client, pod2_api, b"via pod 2, a little longer\n");
    let s = l.status();
    let per_pod: Vec<(String, u64)> = s["attachments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let api = a["forwards"]
                .as_array()
                .unwrap()
                .iter()
                .find(|f| f["name"] == "api")
                .unwrap();
            (
                a["podName"].as_str().unwrap().to_string(),
                api["bytesToTarget"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        per_pod,
        vec![("proxy-0".to_string(), 10), ("proxy-1".to_string(), 27)]
    );

    // A restart brings both back.
    l.daemon().kill9();
    l.start_daemon();
    l.wait_status(Duration::from_secs(5), "both pods served again", both);
    echo_via(&l.client, pod2_api, b"pod 2 after the restart\n");

    // DEL of the second pod closes its listeners only.
    call("DEL")
        .args(args)
        .run(&l.lab.node, &with_prev(&l.conf, &r2))
        .ok_empty();
    let refused = || {
        matches!(connect_in(&l.client, pod2_api, Duration::from_secs(1)),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
    };
    assert!(
        wait_until(Duration::from_secs(10), refused),
        "pod 2's listener open 10 s after its DEL"
    );
    l.echo_once(b"pod 1 still served\n");
    let s = l.status();
    assert_eq!(s["attachments"].as_array().unwrap().len(), 1, "{s:#}");
    assert_eq!(s["attachments"][0]["containerId"], CID);
    assert_eq!(l.lab.reserved(NET), vec![l.net1_ip()]);
}

#[test]
fn dual_stack_forwards_relay_to_an_ipv6_target_and_refuse_the_private_side() {
    let l = DLab::with(Opts {
        v6: true,
        ..Default::default()
    });
    // TCP to the device over IPv6, from an IPv6 and from an IPv4 client.
    for addr in [pod_addr6(API6), pod_addr(API6)] {
        let mut s = connect_in(&l.client, addr, Duration::from_secs(3))
            .unwrap_or_else(|e| panic!("{addr}: {e}"));
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let msg = format!("hello over {addr}\n");
        assert_eq!(echo(&mut s, msg.as_bytes()), msg.as_bytes());
    }
    // UDP likewise.
    let got = l.cl.run(async {
        let mut out = Vec::new();
        for (bind, addr) in [("[::]:0", pod_addr6(UDP6)), ("0.0.0.0:0", pod_addr(UDP6))] {
            let s = tokio::net::UdpSocket::bind(bind).await.unwrap();
            s.connect(addr).await.unwrap();
            s.send(format!("to {addr}").as_bytes()).await.unwrap();
            let mut b = [0u8; 128];
            let r = tokio::time::timeout(Duration::from_secs(3), s.recv(&mut b)).await;
            out.push(
                r.ok()
                    .and_then(|r| r.ok())
                    .map(|n| String::from_utf8_lossy(&b[..n]).into_owned()),
            );
        }
        out
    });
    assert_eq!(
        got,
        vec![
            Some(format!("to {}", pod_addr6(UDP6))),
            Some(format!("to {}", pod_addr(UDP6)))
        ]
    );
    let f = l.forward("api6");
    assert_eq!(f["totalConnections"], 2, "{f:#}");
    assert_eq!(f["target"], format!("[{DEVICE_V6}]:{API}"));
    assert_eq!(l.forward("tel6")["udpDatagramsToClient"], 2);

    // The device reaching the pod's IPv6 net1 address is refused.
    let v6 = l.result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|i| i["address"].as_str().filter(|a| a.contains(':')))
        .expect("an IPv6 address on net1")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let net1: SocketAddr = format!("[{v6}]:{API6}").parse().unwrap();
    let (end, _) = connect_and_read(&l.lab.device, net1);
    assert!(matches!(end, Ended::Reset | Ended::Eof), "{end:?}");
    let net1_udp: SocketAddr = format!("[{v6}]:{UDP6}").parse().unwrap();
    let got = l.dev.run(async move {
        let s = tokio::net::UdpSocket::bind("[::]:0").await.unwrap();
        s.connect(net1_udp).await.unwrap();
        s.send(b"let me in").await.unwrap();
        let mut b = [0u8; 64];
        tokio::time::timeout(Duration::from_millis(500), s.recv(&mut b)).await
    });
    assert!(
        !matches!(got, Ok(Ok(_))),
        "the private side got an IPv6 UDP reply: {got:?}"
    );
    let s = l.wait_status(Duration::from_secs(5), "refused counted", |s| {
        forward_of(s, "api6")["refused"] == 1 && forward_of(s, "tel6")["refused"] == 1
    });
    assert_eq!(forward_of(&s, "api6")["totalConnections"], 2);
}
