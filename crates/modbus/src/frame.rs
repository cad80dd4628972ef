//! Modbus/TCP frames: the MBAP header (transaction id, protocol id 0,
//! length, unit id) and the PDU (function code and data), 260 bytes at
//! most.

use tokio::io::{AsyncRead, AsyncReadExt};

/// The MBAP header's bytes.
pub const HEADER: usize = 7;
/// The longest frame (ADU) Modbus/TCP allows.
pub const MAX_ADU: usize = 260;
/// The header's length field counts the unit id and the PDU: a function
/// code at least, 254 bytes at most.
pub const MIN_LENGTH: u16 = 2;
pub const MAX_LENGTH: u16 = (MAX_ADU - 6) as u16;

/// Exception 0x0A: gateway path unavailable (the device cannot be
/// reached, or the queue is full).
pub const GATEWAY_PATH_UNAVAILABLE: u8 = 0x0A;
/// Exception 0x0B: gateway target device failed to respond (a timeout,
/// the device's connection lost or broken).
pub const GATEWAY_TARGET_FAILED: u8 = 0x0B;

/// One frame: a request or a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub tid: u16,
    pub unit: u8,
    /// The function code and its data.
    pub pdu: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("protocol id {0}, not 0: not Modbus/TCP")]
    Protocol(u16),
    #[error("length {0} outside {MIN_LENGTH}..={MAX_LENGTH}")]
    Length(u16),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl Frame {
    /// The function code (0 for an empty PDU, which [`read`] never makes).
    pub fn function(&self) -> u8 {
        self.pdu.first().copied().unwrap_or(0)
    }

    /// The exception response with `code` to this request.
    pub fn exception(&self, code: u8) -> Frame {
        Frame {
            tid: self.tid,
            unit: self.unit,
            pdu: vec![self.function() | 0x80, code],
        }
    }

    /// The exception code of a response, if it is one.
    pub fn exception_code(&self) -> Option<u8> {
        match self.pdu.as_slice() {
            [f, code] if f & 0x80 != 0 => Some(*code),
            _ => None,
        }
    }

    /// The frame's bytes, with transaction id `tid`.
    pub fn encode(&self, tid: u16) -> Vec<u8> {
        let len = (self.pdu.len() + 1) as u16;
        let mut b = Vec::with_capacity(HEADER + self.pdu.len());
        b.extend_from_slice(&tid.to_be_bytes());
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&len.to_be_bytes());
        b.push(self.unit);
        b.extend_from_slice(&self.pdu);
        b
    }
}

/// The next frame from `r`; `None` at end of file between two frames. A
/// header that is not Modbus/TCP's, or a stream that ends inside a frame,
/// is an error: the stream cannot be read on.
pub async fn read<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Frame>, FrameError> {
    let mut head = [0u8; HEADER];
    let mut got = 0;
    while got < HEADER {
        let n = r.read(&mut head[got..]).await?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
        got += n;
    }
    let protocol = u16::from_be_bytes([head[2], head[3]]);
    if protocol != 0 {
        return Err(FrameError::Protocol(protocol));
    }
    let len = u16::from_be_bytes([head[4], head[5]]);
    if !(MIN_LENGTH..=MAX_LENGTH).contains(&len) {
        return Err(FrameError::Length(len));
    }
    let mut pdu = vec![0u8; usize::from(len) - 1];
    r.read_exact(&mut pdu).await?;
    Ok(Some(Frame {
        tid: u16::from_be_bytes([head[0], head[1]]),
        unit: head[6],
        pdu,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn parse(bytes: &[u8]) -> Result<Option<Frame>, FrameError> {
        read(&mut &bytes[..]).await
    }

    #[tokio::test]
    async fn a_frame_reads_back_as_written_and_bad_ones_say_why() {
        let f = Frame {
            tid: 0xBEEF,
            unit: 7,
            pdu: vec![3, 0, 10, 0, 1],
        };
        let b = f.encode(0x1234);
        assert_eq!(b, [0x12, 0x34, 0, 0, 0, 6, 7, 3, 0, 10, 0, 1]);
        let back = parse(&b).await.unwrap().unwrap();
        assert_eq!(
            (back.tid, back.unit, back.pdu.clone()),
            (0x1234, 7, f.pdu.clone())
        );
        assert_eq!(
            parse(&[]).await.unwrap(),
            None,
            "end of file between frames"
        );
        assert!(
            matches!(parse(&b[..9]).await, Err(FrameError::Io(_))),
            "cut short"
        );
        let mut bad = b.clone();
        bad[3] = 1;
        assert!(matches!(parse(&bad).await, Err(FrameError::Protocol(1))));
        let mut long = b.clone();
        long[4..6].copy_from_slice(&255u16.to_be_bytes());
        let e = parse(&long).await.unwrap_err().to_string();
        assert!(e.contains("255") && e.contains("2..=254"), "{e}");
        let mut short = b;
        short[4..6].copy_from_slice(&1u16.to_be_bytes());
        assert!(matches!(parse(&short).await, Err(FrameError::Length(1))));
        let ex = f.exception(GATEWAY_TARGET_FAILED);
        assert_eq!(ex.pdu, [0x83, 0x0B]);
        assert_eq!((ex.tid, ex.exception_code()), (0xBEEF, Some(0x0B)));
        assert_eq!(f.exception_code(), None);
    }
}
