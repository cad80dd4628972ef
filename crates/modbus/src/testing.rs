//! For tests and benchmarks: a PLC as the ones multiplexing is for. It
//! serves one Modbus/TCP connection at a time (a second one is reset and
//! counted) and one request at a time, each taking `service` (function 3,
//! Read Holding Registers: register `a` holds `a` itself, so every answer
//! says which address it is for). Registers of `SILENT` and up never answer;
//! `GARBAGE` answers with a frame that is not Modbus/TCP.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

pub const SILENT: u16 = 60_000;
pub const GARBAGE: u16 = 50_000;

#[derive(Default)]
pub struct Seen {
    pub connections: AtomicU64,
    pub second_connections: AtomicU64,
    pub served: AtomicU64,
}

pub struct Plc {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
    conns: Arc<std::sync::Mutex<Vec<JoinHandle<()>>>>,
}

/// Dropped: the PLC is gone, its listener and its connection with it.
impl Drop for Plc {
    fn drop(&mut self) {
        self.task.abort();
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }
}

impl Plc {
    /// On `addr` (port 0: any), serving each request in `service`.
    /// What it sees goes to `seen`.
    pub async fn start(addr: SocketAddr, service: Duration, seen: Arc<Seen>) -> Plc {
        let l = TcpListener::bind(addr).await.expect("bind the PLC");
        let addr = l.local_addr().unwrap();
        let s = seen.clone();
        let conns: Arc<std::sync::Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let cs = conns.clone();
        let task = tokio::spawn(async move {
            let busy = Arc::new(tokio::sync::Mutex::new(()));
            loop {
                let Ok((c, _)) = l.accept().await else { return };
                let Ok(guard) = busy.clone().try_lock_owned() else {
                    Seen::inc(&s.second_connections);
                    let _ = socket2::SockRef::from(&c).set_linger(Some(Duration::ZERO));
                    continue;
                };
                Seen::inc(&s.connections);
                let s = s.clone();
                cs.lock().unwrap().push(tokio::spawn(async move {
                    let _ = serve(c, service, &s).await;
                    drop(guard);
                }));
            }
        });
        Plc { addr, task, conns }
    }
}

impl Seen {
    fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

async fn serve(mut c: TcpStream, service: Duration, seen: &Seen) -> std::io::Result<()> {
    loop {
        let mut head = [0u8; 7];
        c.read_exact(&mut head).await?;
        let len = usize::from(u16::from_be_bytes([head[4], head[5]]));
        let mut pdu = vec![0u8; len - 1];
        c.read_exact(&mut pdu).await?;
        tokio::time::sleep(service).await;
        let addr = u16::from_be_bytes([pdu[1], pdu[2]]);
        let qty = u16::from_be_bytes([pdu[3], pdu[4]]);
        if addr >= SILENT {
            continue;
        }
        Seen::inc(&seen.served);
        if addr >= GARBAGE {
            c.write_all(&[head[0], head[1], 0, 7, 0, 3, head[6], 3, 0])
                .await?;
            continue;
        }
        let mut out = vec![head[0], head[1], 0, 0, 0, 0, head[6], 3, (2 * qty) as u8];
        for i in 0..qty {
            out.extend_from_slice(&(addr + i).to_be_bytes());
        }
        let l = (out.len() - 6) as u16;
        out[4..6].copy_from_slice(&l.to_be_bytes());
        c.write_all(&out).await?;
    }
}

/// A Modbus/TCP client: Read Holding Registers `addr`, quantity 1, as
/// transaction `tid` of unit `unit`; the register's value, or the
/// exception code (`Err`).
pub async fn read_register(
    c: &mut TcpStream,
    tid: u16,
    unit: u8,
    addr: u16,
) -> std::io::Result<Result<u16, u8>> {
    let [t0, t1] = tid.to_be_bytes();
    let [a0, a1] = addr.to_be_bytes();
    c.write_all(&[t0, t1, 0, 0, 0, 6, unit, 3, a0, a1, 0, 1])
        .await?;
    let mut head = [0u8; 7];
    c.read_exact(&mut head).await?;
    assert_eq!(
        [head[0], head[1]],
        [t0, t1],
        "the answer to another transaction"
    );
    assert_eq!(head[6], unit, "the unit id changed");
    let len = usize::from(u16::from_be_bytes([head[4], head[5]]));
    let mut pdu = vec![0u8; len - 1];
    c.read_exact(&mut pdu).await?;
    Ok(match pdu.as_slice() {
        [3, 2, v0, v1] => Ok(u16::from_be_bytes([*v0, *v1])),
        [0x83, code] => Err(*code),
        other => panic!("an answer that is neither: {other:?}"),
    })
}
