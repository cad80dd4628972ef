//! UDP forwards: sessions per client, replies to the right client.

use crate::lab::*;
use std::time::{Duration, Instant};

/// `clients` sockets at once, each sending `each` datagrams (one in flight
/// at a time) and checking every reply is its own. Returns the errors.
pub fn udp_clients(l: &DLab, clients: usize, each: usize) -> Vec<String> {
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(clients));
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let barrier = barrier.clone();
            l.cl.spawn(async move {
                let run = async {
                    let s = tokio::net::UdpSocket::bind("0.0.0.0:0")
                        .await
                        .map_err(|e| e.to_string())?;
                    s.connect(pod_addr(UDP)).await.map_err(|e| e.to_string())?;
                    barrier.wait().await;
                    let mut buf = vec![0u8; 2048];
                    for k in 0..each {
                        // Distinct per client and datagram, of varying size.
                        let msg =
                            format!("client {c} datagram {k} {}", "u".repeat((c * 7 + k) % 500));
                        s.send(msg.as_bytes())
                            .await
                            .map_err(|e| format!("client {c}: {e}"))?;
                        let n = tokio::time::timeout(Duration::from_secs(3), s.recv(&mut buf))
                            .await
                            .map_err(|_| format!("client {c}: no reply to datagram {k}"))?
                            .map_err(|e| format!("client {c}: {e}"))?;
                        if &buf[..n] != msg.as_bytes() {
                            return Err(format!(
                                "client {c} datagram {k}: got {:?}",
                                String::from_utf8_lossy(&buf[..n.min(40)])
                            ));
                        }
                    }
                    // Nothing else arrives for this client.
                    match tokio::time::timeout(Duration::from_millis(100), s.recv(&mut buf)).await {
                        Ok(Ok(n)) => Err(format!(
                            "client {c}: stray datagram {:?}",
                            String::from_utf8_lossy(&buf[..n.min(40)])
                        )),
                        _ => Ok(()),
                    }
                };
                tokio::time::timeout(Duration::from_secs(30), run)
                    .await
                    .unwrap_or_else(|_| Err(format!("client {c}: not done within 30 s")))
            })
        })
        .collect();
    handles
        .into_iter()
        .filter_map(|h| l.cl.join(h).err())
        .collect()
}

#[test]
fn udp_echo_with_fifty_clients_at_once_each_gets_only_its_own_replies() {
    const CLIENTS: usize = 50;
    const EACH: usize = 20;
    let l = DLab::new();
    let t = Instant::now();
    let errors = udp_clients(&l, CLIENTS, EACH);
    assert!(
        errors.is_empty(),
        "{} clients failed: {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    eprintln!(
        "{CLIENTS} UDP clients x {EACH} round trips in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    let f = l.forward("telemetry");
    let n = (CLIENTS * EACH) as u64;
    assert_eq!(f["udpSessionsTotal"], CLIENTS as u64, "{f:#}");
    assert_eq!(f["udpSessions"], CLIENTS as u64, "{f:#}");
    assert_eq!(f["udpDatagramsToTarget"], n, "{f:#}");
    assert_eq!(f["udpDatagramsToClient"], n, "{f:#}");
    assert_eq!(f["udpDrops"], 0, "{f:#}");
    assert_eq!(f["udpEvictions"], 0, "{f:#}");
    assert_eq!(f["reachability"]["state"], "reachable", "{f:#}");
}

#[test]
fn udp_sessions_are_bounded_and_evict_the_oldest() {
    // No session idles out while the six clients take their turns, however
    // slow the machine (idling out has its own test below).
    let l = DLab::with(Opts {
        flags: &["--udp-max-sessions", "4", "--udp-idle-timeout", "3600"],
        ..Default::default()
    });
    // Six clients one after the other, each keeping its socket: the table
    // holds four, the two oldest are evicted.
    let (sockets, errors) = l.cl.run(async {
        let mut sockets = Vec::new();
        let mut errors = Vec::new();
        for c in 0..6 {
            let s = tokio::net::UdpSocket::bind("0.0.0.0:0").await.unwrap();
            s.connect(pod_addr(UDP)).await.unwrap();
            let msg = format!("client {c}");
            s.send(msg.as_bytes()).await.unwrap();
            let mut b = [0u8; 64];
            match tokio::time::timeout(Duration::from_secs(3), s.recv(&mut b)).await {
                Ok(Ok(n)) if &b[..n] == msg.as_bytes() => {}
                other => errors.push(format!("client {c}: {other:?}")),
            }
            sockets.push(s);
        }
        (sockets, errors)
    });
    assert!(errors.is_empty(), "{errors:?}");
    let f = l.forward("telemetry");
    assert_eq!(f["udpSessionsTotal"], 6, "{f:#}");
    assert_eq!(f["udpSessions"], 4, "{f:#}");
    assert_eq!(f["udpEvictions"], 2, "{f:#}");
    // An evicted client that speaks again gets a new session and its reply.
    let again = l.cl.run(async move {
        let s = &sockets[0];
        s.send(b"client 0 again").await.unwrap();
        let mut b = [0u8; 64];
        let r = tokio::time::timeout(Duration::from_secs(3), s.recv(&mut b)).await;
        r.ok().and_then(|r| r.ok()).map(|n| b[..n].to_vec())
    });
    assert_eq!(again.as_deref(), Some(&b"client 0 again"[..]));
    let f = l.forward("telemetry");
    assert_eq!(f["udpSessions"], 4, "{f:#}");
    assert_eq!(f["udpSessionsTotal"], 7, "{f:#}");
    assert_eq!(f["udpEvictions"], 3, "{f:#}");
    assert_eq!(f["udpDatagramsToTarget"], 7, "{f:#}");
    assert_eq!(f["udpDatagramsToClient"], 7, "{f:#}");
    assert_eq!(l.metric("edgelink_udp_evictions_total", "telemetry"), 3.0);
    assert_eq!(l.metric("edgelink_active_udp_sessions", "telemetry"), 4.0);
}

#[test]
fn udp_sessions_idle_out_after_the_timeout_and_not_before() {
    let l = DLab::with(Opts {
        flags: &["--udp-idle-timeout", "1"],
        ..Default::default()
    });
    // Taken before the send: the session's last activity is later, so it
    // cannot be closed before `t` + 1 s, however the threads are scheduled.
    let t = Instant::now();
    let errors = udp_clients(&l, 2, 1);
    assert!(errors.is_empty(), "{errors:?}");
    // Closed after the timeout plus a sweep period; the deadline is
    // generous for a loaded machine.
    let s = l.wait_status(Duration::from_secs(30), "sessions idled out", |s| {
        forward_of(s, "telemetry")["udpSessions"] == 0
    });
    assert!(
        t.elapsed() >= Duration::from_secs(1),
        "closed before the idle timeout: {:?}",
        t.elapsed()
    );
    let f = forward_of(&s, "telemetry");
    assert_eq!(f["udpSessionsTotal"], 2, "{f:#}");
    assert_eq!(f["udpEvictions"], 0, "{f:#}");
    assert_eq!(l.metric("edgelink_active_udp_sessions", "telemetry"), 0.0);
    // A client that speaks after that gets a new session.
    assert!(udp_clients(&l, 1, 1).is_empty());
    assert_eq!(l.forward("telemetry")["udpSessionsTotal"], 3);
}
