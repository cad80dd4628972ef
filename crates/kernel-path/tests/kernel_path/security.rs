//! Nothing from the private side is DNATed, and the pod routes nothing but
//! the forwards' own flows although forwarding is on.

use crate::lab::*;
use crate::{full_plan, TABLE};
use edgelink_kernel_path::{ensure, remove};

#[test]
fn the_private_side_cannot_use_the_path_nor_route_through_the_pod() {
    let Some(nft) = nft_or_skip("the_private_side_cannot_use_the_path") else {
        return;
    };
    let lab = Lab::new();
    let opts = options(nft);
    // Something on the cluster side for the device to aim at.
    let client_echo = Echo::start(&lab.client, &[CLIENT]);
    ensure(&lab.pod.netns, &full_plan(), &opts).unwrap();
    assert_eq!(lab.pod.read("/proc/sys/net/ipv4/ip_forward"), "1");

    // The forwards' ports seen from the device: not DNATed (the pod has no
    // listener there, so TCP is refused and UDP gets port-unreachable).
    for to in [addr(POD_NET1, 8080), addr(POD, 8080)] {
        let e = tcp_exchange(&lab.device, to, b"in?").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{to}: {e}");
    }
    assert!(tcp_exchange(&lab.device, addr(POD_NET1_6, 8086), b"in?").is_err());
    assert!(udp_exchange(&lab.device, addr(POD_NET1, 5353), b"in?", 2).is_err());
    assert!(lab.echo.peers().is_empty(), "{:?}", lab.echo.peers());

    // Routed through the pod from the device to the client, and from the
    // client straight to the device: dropped by the forward chain.
    assert!(tcp_exchange(&lab.device, addr(CLIENT, TCP_ECHO), b"route?").is_err());
    assert!(udp_exchange(&lab.device, addr(CLIENT, UDP_ECHO), b"route?", 2).is_err());
    assert!(tcp_exchange(&lab.client, addr(DEVICE, TCP_ECHO), b"route?").is_err());
    assert!(client_echo.peers().is_empty(), "{:?}", client_echo.peers());
    assert!(lab.echo.peers().is_empty(), "{:?}", lab.echo.peers());

    // Control: with the table gone and forwarding forced on, the same
    // routes work, so it was the table's chain that stopped them.
    assert!(remove(&lab.pod.netns, TABLE, &opts).unwrap());
    lab.pod.write("/proc/sys/net/ipv4/ip_forward", "1");
    assert_eq!(
        tcp_exchange(&lab.device, addr(CLIENT, TCP_ECHO), b"routed").unwrap(),
        b"routed"
    );
    assert_eq!(
        tcp_exchange(&lab.client, addr(DEVICE, TCP_ECHO), b"routed").unwrap(),
        b"routed"
    );
}

/// A segment conntrack takes as invalid (SYN and FIN together) to a
/// forward's port never reaches the device: without a conntrack entry it
/// has no DNAT, and the forward hook, which has no rule for it, drops
/// whatever would be routed (kubernetes#74839). A well-formed SYN sent the
/// same way does reach it.
#[test]
fn a_segment_conntrack_takes_as_invalid_never_reaches_the_device() {
    let Some(nft) = nft_or_skip("a_segment_conntrack_takes_as_invalid") else {
        return;
    };
    let lab = Lab::new();
    ensure(&lab.pod.netns, &full_plan(), &options(nft)).unwrap();
    // SYN|FIN (0x03), then a SYN (0x02) as the control.
    assert_eq!(segments_at_the_device(&lab, 0x03), 0, "SYN|FIN passed on");
    assert!(
        segments_at_the_device(&lab, 0x02) > 0,
        "the SYN was not passed on"
    );
}

/// Send three raw TCP segments with `flags` from the client to the pod's
/// api port and count the TCP segments that reach the device's echo port.
fn segments_at_the_device(lab: &Lab, flags: u8) -> u64 {
    let capture = format!(
        "import socket,time\n\
         s=socket.socket(socket.AF_PACKET,socket.SOCK_RAW,socket.htons(0x0800))\n\
         s.settimeout(0.2)\nprint('ready',flush=True)\nn=0\nend=time.time()+2\n\
         while time.time()<end:\n try:\n  d=s.recv(2000)\n except socket.timeout:\n  continue\n \
         ip=d[14:]\n h=(ip[0]&15)*4\n \
         if ip[9]==6 and int.from_bytes(ip[h+2:h+4],'big')=={TCP_ECHO}:\n  n+=1\nprint(n)\n"
    );
    let send = format!(
        "import socket,struct\n\
         src,dst=socket.inet_aton('{CLIENT}'),socket.inet_aton('{POD}')\n\
         t=struct.pack('!HHIIBBHHH',40999,8080,1000,0,5<<4,{flags},64240,0,0)\n\
         p=src+dst+struct.pack('!BBH',0,6,len(t))+t\n\
         c=sum(struct.unpack('!%dH'%(len(p)//2),p))\nc=(c>>16)+(c&0xffff)\nc+=c>>16\n\
         t=t[:16]+struct.pack('!H',~c&0xffff)+t[18:]\n\
         s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_TCP)\n\
         for i in range(3):\n s.sendto(t,('{POD}',0))\n"
    );
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", &lab.device.name, "python3", "-c", &capture])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the capture");
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).expect("the capture starts");
    assert_eq!(line.trim(), "ready");
    let sent = lab.client.exec(&["python3", "-c", &send]);
    assert!(sent.status.success(), "{sent:?}");
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).expect("the capture's count");
    child.wait().expect("the capture ends");
    line.trim().parse().expect("a count")
}
