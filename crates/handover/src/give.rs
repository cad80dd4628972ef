//! The running daemon's half of the conversation, once its tasks parked
//! and [`crate::pack::pack`] wrote the inventory: send it, wait for the
//! new daemon's Confirm, acknowledge it.

use crate::{Channel, Error, FdList, Message, RefusalCode, State};
use std::time::Duration;

/// Send the inventory and the descriptors, then wait for the new daemon's
/// Confirm, Abort or end, `wait` at most. `Ok` once the new daemon has it
/// all: it confirmed and (protocol 2) the Ack is written; the old daemon
/// must exit then, serving nothing more. Any error: the new daemon will
/// not serve (it was told, when it can still hear it).
pub fn send_and_commit(
    mut ch: Channel,
    state: State,
    fds: FdList,
    wait: Duration,
    protocol: u32,
) -> Result<(), Error> {
    ch.send(&Message::Inventory {
        fds: fds.len() as u32,
        state,
    })?;
    ch.send_fds(fds.as_slice())?;
    ch.set_read_timeout(Some(wait))?;
    let answer = ch.expect("Confirm");
    match answer {
        Ok(Message::Confirm {}) if protocol < 2 => Ok(()),
        // Written, or this daemon serves on: the new one serves only once
        // it has read this.
        Ok(Message::Confirm {}) => ch.send(&Message::Ack {}),
        Ok(m) => Err(Error::Unexpected {
            expected: "Confirm",
            got: m.name().into(),
        }),
        Err(Error::Io(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ) =>
        {
            // A Confirm that comes later is answered by this refusal (or,
            // once this daemon's end is closed, by nothing): the new daemon
            // gives up without serving.
            let reason = format!("no Confirm within {wait:?}: the old edgelinkd serves on");
            let _ = ch.send(&Message::Refused {
                reason: reason.clone(),
                code: RefusalCode::Failed,
            });
            Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                reason,
            )))
        }
        Err(e) => Err(e),
    }
}
