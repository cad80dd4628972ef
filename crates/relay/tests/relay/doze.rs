//! An idle connection's directions are given up while neither holds
//! anything (`tcp/doze.rs`), and started again by whichever side speaks
//! next: bytes from either side after a pause, a half-close during one,
//! the other side going on after it, and no spinning on a source that
//! stays readable at its end of file.

use crate::harness::*;
use crate::tcp_edges::relayed_pair;
use edgelink_relay::TcpRelayConfig;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout};

/// Long enough for both directions to be waiting with nothing in flight.
const PAUSE: Duration = Duration::from_millis(30);

async fn read_exactly(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    timeout(Duration::from_secs(10), s.read_exact(&mut b))
        .await
        .expect("bytes through the relay")
        .unwrap();
    b
}

/// This process's CPU time (user + system), in clock ticks.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn an_idle_connection_wakes_on_either_side_and_goes_on_after_a_half_close() {
    runtime().block_on(async {
        let (mut client, mut server, relay) = relayed_pair(TcpRelayConfig::default()).await;
        for i in 0..5u8 {
            // The client speaks after a pause, then the server on its own.
            sleep(PAUSE).await;
            client.write_all(&[b'c', i]).await.unwrap();
            assert_eq!(read_exactly(&mut server, 2).await, [b'c', i]);
            sleep(PAUSE).await;
            server.write_all(&[b's', i, i]).await.unwrap();
            assert_eq!(read_exactly(&mut client, 3).await, [b's', i, i]);
        }
        // The client half-closes while the connection is idle.
        sleep(PAUSE).await;
        client.shutdown().await.unwrap();
        let mut b = [0u8; 1];
        let n = timeout(Duration::from_secs(10), server.read(&mut b))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n, 0, "the client's end of file passed on");
        // Idle with the client's side at its end of file, readable for
        // good: the relay must wait for the server alone, not spin.
        let ticks = cpu_ticks();
        sleep(Duration::from_millis(500)).await;
        let spent = cpu_ticks() - ticks;
        assert!(
            spent < 20,
            "{spent} ticks of CPU in 0.5 s of an idle connection: spinning"
        );
        // The server goes on, after the pause, and ends.
        server.write_all(b"after the half-close").await.unwrap();
        assert_eq!(read_exactly(&mut client, 20).await, b"after the half-close");
        drop(server);
        let mut rest = Vec::new();
        timeout(Duration::from_secs(10), client.read_to_end(&mut rest))
            .await
            .unwrap()
            .unwrap();
        assert!(rest.is_empty(), "{rest:?}");
        relay.wait_finished(1, Duration::from_secs(10)).await;
    });
}
