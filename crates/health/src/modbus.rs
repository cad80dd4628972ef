//! Modbus/TCP: Read Holding Registers (function 3), quantity 1, and the
//! reply checked against the request (transaction id, protocol, unit,
//! function); an exception reply is a failure naming its code.

use crate::error::ProbeError;
use edgelink_attachment::{HealthKind, HealthTarget};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const READ_HOLDING: u8 = 3;

/// The request frame: the MBAP header (transaction, protocol 0, length,
/// unit) and the PDU (function, address, quantity).
pub fn request(tid: u16, unit: u8, register: u16) -> [u8; 12] {
    let [t0, t1] = tid.to_be_bytes();
    let [r0, r1] = register.to_be_bytes();
    [t0, t1, 0, 0, 0, 6, unit, READ_HOLDING, r0, r1, 0, 1]
}

/// What a reply says.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Registers,
    Exception(u8),
}

/// Check a reply: `head` the 7 bytes of MBAP header, `pdu` the rest.
pub fn check(tid: u16, unit: u8, head: &[u8; 7], pdu: &[u8]) -> Result<Reply, String> {
    let got_tid = u16::from_be_bytes([head[0], head[1]]);
    if got_tid != tid {
        return Err(format!("reply to transaction {got_tid}, expected {tid}"));
    }
    if head[2..4] != [0, 0] {
        return Err("reply is not Modbus (protocol id not 0)".into());
    }
    if head[6] != unit {
        return Err(format!("reply from unit {}, expected {unit}", head[6]));
    }
    match pdu {
        [f, code] if *f == READ_HOLDING | 0x80 => Ok(Reply::Exception(*code)),
        [f, 2, _, _] if *f == READ_HOLDING => Ok(Reply::Registers),
        [f, ..] if *f == READ_HOLDING => Err(format!(
            "malformed reply to function 3 ({} bytes)",
            pdu.len()
        )),
        [f, ..] => Err(format!("reply with function {f}, expected 3")),
        [] => Err("empty reply".into()),
    }
}

/// The exception codes of the Modbus application protocol.
pub fn exception_name(code: u8) -> &'static str {
    match code {
        1 => "illegal function",
        2 => "illegal data address",
        3 => "illegal data value",
        4 => "server device failure",
        5 => "acknowledge",
        6 => "server device busy",
        8 => "memory parity error",
        0x0a => "gateway path unavailable",
        0x0b => "gateway target device failed to respond",
        _ => "unknown exception",
    }
}

pub async fn read(
    mut s: TcpStream,
    a: SocketAddr,
    unit: u8,
    register: u16,
    tid: u16,
) -> Result<(), ProbeError> {
    let target = HealthTarget::Addr(a);
    let io = |source| ProbeError::Io {
        kind: HealthKind::Modbus,
        target,
        source,
    };
    let malformed = |what| ProbeError::Malformed {
        kind: HealthKind::Modbus,
        target,
        what,
    };
    s.write_all(&request(tid, unit, register))
        .await
        .map_err(io)?;
    let mut head = [0u8; 7];
    s.read_exact(&mut head).await.map_err(io)?;
    let len = usize::from(u16::from_be_bytes([head[4], head[5]]));
    if !(2..=254).contains(&len) {
        return Err(malformed(format!("reply length {len} out of range")));
    }
    let mut pdu = vec![0u8; len - 1];
    s.read_exact(&mut pdu).await.map_err(io)?;
    match check(tid, unit, &head, &pdu).map_err(malformed)? {
        Reply::Registers => Ok(()),
        Reply::Exception(code) => Err(ProbeError::Exception {
            target: a,
            unit,
            code,
            name: exception_name(code),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_function_3_for_one_register() {
        assert_eq!(
            request(0x1234, 1, 40),
            [0x12, 0x34, 0, 0, 0, 6, 1, 3, 0, 40, 0, 1]
        );
    }

    #[test]
    fn replies_are_checked_against_the_request() {
        let head = |tid: u16, unit: u8| {
            let [a, b] = tid.to_be_bytes();
            [a, b, 0, 0, 0, 5, unit]
        };
        assert_eq!(
            check(7, 1, &head(7, 1), &[3, 2, 0, 42]),
            Ok(Reply::Registers)
        );
        assert_eq!(
            check(7, 1, &head(7, 1), &[0x83, 2]),
            Ok(Reply::Exception(2))
        );
        assert!(check(7, 1, &head(8, 1), &[3, 2, 0, 42])
            .unwrap_err()
            .contains("transaction 8"));
        assert!(check(7, 1, &head(7, 9), &[3, 2, 0, 42])
            .unwrap_err()
            .contains("unit 9"));
        assert!(check(7, 1, &head(7, 1), &[4, 2, 0, 42])
            .unwrap_err()
            .contains("function 4"));
        assert!(check(7, 1, &head(7, 1), &[3, 4, 0, 42]).is_err());
        let mut other = head(7, 1);
        other[2] = 1;
        assert!(check(7, 1, &other, &[3, 2, 0, 42]).is_err());
        assert_eq!(exception_name(2), "illegal data address");
    }
}
