//! `proxyProtocol`: the target learns the cluster client's address, not
//! the pod's. Real receivers (HAProxy with `accept-proxy`, nginx with
//! `listen ... proxy_protocol`) run in the device namespace and answer with
//! the address the header gave them; a raw server there shows the exact
//! bytes that arrive before the client's, and that a forward without the
//! key sends none.

use crate::lab::*;
use edgelink_tests::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// HAProxy and nginx in the device namespace (both take v1 and v2).
const HAPROXY: u16 = 18101;
const NGINX: u16 = 18102;
/// The raw server: reads to end of file, answers with every byte it got.
const RAW: u16 = 18103;

/// The lab with `extra` forwards added to the plugin's config.
fn lab(extra: Value) -> DLab {
    let mut l = DLab::with(Opts {
        add: false,
        ..Default::default()
    });
    let forwards = l.conf["forwards"].as_array_mut().expect("forwards");
    forwards.extend(extra.as_array().expect("a list").iter().cloned());
    l.add();
    l.wait_serving();
    l
}

fn forward(name: &str, port: u16, device_port: u16, proxy: Option<&str>) -> Value {
    let mut f = json!({
        "name": name, "protocol": "tcp", "port": port,
        "target": format!("{DEVICE_V4}:{device_port}"),
    });
    if let Some(v) = proxy {
        f["proxyProtocol"] = json!(v);
    }
    f
}

/// The installed binary, or `None` with the reason printed (the test then
/// skips: `scripts/install-deps.sh test` installs both).
fn installed(name: &str) -> Option<PathBuf> {
    let found = ["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        eprintln!("skipped: {name} is not installed (scripts/install-deps.sh test installs it)");
    }
    found
}

/// A server process in the device namespace, its config and log in a
/// tempdir; killed and reaped on drop (its log printed if the test fails).
struct Peer {
    name: &'static str,
    log: PathBuf,
    child: ChildGuard,
    _dir: tempfile::TempDir,
}

impl Peer {
    /// Start `bin args` (where `{dir}` stands for the tempdir) with `config`
    /// written to `{dir}/<file>`, and wait (bounded) until `port` accepts.
    fn start(
        l: &DLab,
        name: &'static str,
        bin: &Path,
        file: &str,
        config: &str,
        args: &[&str],
        port: u16,
    ) -> Peer {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().to_str().expect("utf-8 path");
        std::fs::write(dir.path().join(file), config.replace("{dir}", d)).expect("write config");
        let log = dir.path().join(format!("{name}.log"));
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let args: Vec<String> = args.iter().map(|a| a.replace("{dir}", d)).collect();
        let child = Command::new("ip")
            .args(["netns", "exec", &l.lab.device.name])
            .arg(bin)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let mut p = Peer {
            name,
            log,
            child: ChildGuard::new(child),
            _dir: dir,
        };
        let addr = device_addr(port);
        let deadline = Instant::now() + Duration::from_secs(10);
        while connect_in(&l.lab.device, addr, Duration::from_millis(500)).is_err() {
            if let Ok(Some(status)) = p.child.child().try_wait() {
                panic!("{name} exited ({status}):\n{}", p.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "{name} not listening on {addr} within 10 s:\n{}",
                p.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        p
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- {} log ----\n{}", self.name, self.log_text());
        }
    }
}

fn haproxy(l: &DLab, bin: &Path) -> Peer {
    let config = format!(
        r#"global
    nbthread 1
defaults
    mode http
    timeout connect 5s
    timeout client 10s
    timeout server 10s
frontend devices
    bind {DEVICE_V4}:{HAPROXY} accept-proxy
    http-request return status 200 content-type text/plain lf-string "%[src]:%[src_port] %[dst]:%[dst_port]"
"#
    );
    Peer::start(
        l,
        "haproxy",
        bin,
        "haproxy.cfg",
        &config,
        &["-db", "-f", "{dir}/haproxy.cfg"],
        HAPROXY,
    )
}

fn nginx(l: &DLab, bin: &Path) -> Peer {
    let config = format!(
        r#"daemon off;
master_process off;
worker_processes 1;
pid {{dir}}/nginx.pid;
error_log stderr;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {{dir}}/body;
    proxy_temp_path {{dir}}/proxy;
    fastcgi_temp_path {{dir}}/fastcgi;
    uwsgi_temp_path {{dir}}/uwsgi;
    scgi_temp_path {{dir}}/scgi;
    server {{
        listen {DEVICE_V4}:{NGINX} proxy_protocol;
        default_type text/plain;
        location / {{
            return 200 "$proxy_protocol_addr:$proxy_protocol_port $proxy_protocol_server_addr:$proxy_protocol_server_port";
        }}
    }}
}}
"#
    );
    Peer::start(
        l,
        "nginx",
        bin,
        "nginx.conf",
        &config,
        &["-e", "stderr", "-p", "{dir}", "-c", "{dir}/nginx.conf"],
        NGINX,
    )
}

/// A GET from the client namespace through the pod's `port`: the client's
/// own address (as the pod sees it) and the body of the 200 answer.
fn get(l: &DLab, port: u16) -> (SocketAddr, String) {
    let mut s = l
        .connect(port)
        .unwrap_or_else(|e| panic!("connect to the pod's {port}: {e}"));
    let me = s.local_addr().expect("local address");
    s.write_all(b"GET / HTTP/1.1\r\nHost: device\r\nConnection: close\r\n\r\n")
        .expect("send the request");
    let mut raw = String::new();
    s.read_to_string(&mut raw)
        .unwrap_or_else(|e| panic!("answer through {port}: {e} (so far {raw:?})"));
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    assert!(head.starts_with("HTTP/1.1 200"), "through {port}: {raw:?}");
    (me, body.trim().to_string())
}

/// Through each (forward port, version): the receiver names the client's
/// address and port, and the pod address and forward port it dialed.
fn assert_names_the_client(l: &DLab, who: &str, ports: [(u16, &str); 2]) {
    let net1 = l.net1_ip();
    for (port, version) in ports {
        let (me, body) = get(l, port);
        assert_eq!(me.ip().to_string(), CLIENT_IP);
        assert_eq!(
            body,
            format!("{me} {POD_IP}:{port}"),
            "{who} through a {version} forward"
        );
        assert!(
            !body.contains(&net1),
            "{who} saw the pod's net1 address {net1}: {body}"
        );
    }
}

#[test]
fn haproxy_behind_proxy_protocol_v1_and_v2_sees_the_cluster_client() {
    let Some(bin) = installed("haproxy") else {
        return;
    };
    let l = lab(json!([
        forward("hap-v1", 18001, HAPROXY, Some("v1")),
        forward("hap-v2", 18002, HAPROXY, Some("v2")),
    ]));
    let _haproxy = haproxy(&l, &bin);
    assert_names_the_client(&l, "haproxy", [(18001, "v1"), (18002, "v2")]);
}

#[test]
fn nginx_behind_proxy_protocol_v1_and_v2_sees_the_cluster_client() {
    let Some(bin) = installed("nginx") else {
        return;
    };
    let l = lab(json!([
        forward("ngx-v1", 18003, NGINX, Some("v1")),
        forward("ngx-v2", 18004, NGINX, Some("v2")),
    ]));
    let _nginx = nginx(&l, &bin);
    assert_names_the_client(&l, "nginx", [(18003, "v1"), (18004, "v2")]);
}

/// Start the raw server on the device.
fn raw_server(l: &DLab) {
    let listener = l
        .dev
        .run(async { tokio::net::TcpListener::bind(device_addr(RAW)).await })
        .expect("bind the raw server");
    l.dev.spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut got = Vec::new();
                let read = s.read_to_end(&mut got);
                if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(10), read).await {
                    let _ = s.write_all(&got).await;
                    let _ = s.shutdown().await;
                }
            });
        }
    });
}

/// Send `msg` through the pod's `port` and end it: (the client's address,
/// every byte the raw server received).
fn through_raw(l: &DLab, port: u16, msg: &[u8]) -> (SocketAddr, Vec<u8>) {
    let mut s = l.connect(port).expect("connect");
    let me = s.local_addr().expect("local address");
    s.write_all(msg).expect("send");
    s.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let mut seen = Vec::new();
    s.read_to_end(&mut seen).expect("the raw server's answer");
    (me, seen)
}

const MSG: &[u8] = b"first bytes of the client\n";

#[test]
fn proxy_protocol_headers_arrive_whole_before_the_client_bytes_and_are_not_counted() {
    let l = lab(json!([
        forward("raw-v1", 18006, RAW, Some("v1")),
        forward("raw-v2", 18007, RAW, Some("v2")),
    ]));
    raw_server(&l);

    let (me, seen) = through_raw(&l, 18006, MSG);
    let want = format!(
        "PROXY TCP4 {CLIENT_IP} {POD_IP} {} 18006\r\n{}",
        me.port(),
        String::from_utf8_lossy(MSG)
    );
    assert_eq!(String::from_utf8_lossy(&seen), want);

    let (me, seen) = through_raw(&l, 18007, MSG);
    let ip = |s: &str| s.parse::<std::net::Ipv4Addr>().unwrap().octets();
    let mut want = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    // PROXY command, TCP over IPv4, 12 bytes of addresses and ports.
    want.extend([0x21, 0x11, 0, 12]);
    want.extend(ip(CLIENT_IP));
    want.extend(ip(POD_IP));
    want.extend(me.port().to_be_bytes());
    want.extend(18007u16.to_be_bytes());
    want.extend(MSG);
    assert_eq!(seen, want);

    // The counters hold the client's bytes only.
    for name in ["raw-v1", "raw-v2"] {
        let s = l.wait_status(Duration::from_secs(5), "connection ended", |s| {
            forward_of(s, name)["activeConnections"] == 0
        });
        let f = forward_of(&s, name);
        assert_eq!(f["bytesToTarget"], MSG.len() as u64, "{f:#}");
        assert_eq!(f["connectErrors"], 0, "{f:#}");
    }
}

#[test]
fn a_forward_without_proxy_protocol_sends_the_client_first_byte_first() {
    let l = lab(json!([forward("raw-none", 18005, RAW, None)]));
    raw_server(&l);
    let (_, seen) = through_raw(&l, 18005, MSG);
    assert_eq!(String::from_utf8_lossy(&seen), String::from_utf8_lossy(MSG));
    let s = l.wait_status(Duration::from_secs(5), "connection ended", |s| {
        forward_of(s, "raw-none")["activeConnections"] == 0
    });
    let f = forward_of(&s, "raw-none");
    assert_eq!(f["bytesToTarget"], MSG.len() as u64, "{f:#}");
}
