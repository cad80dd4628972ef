//! The daemon's control socket, `<stateDir>/edgelinkd.sock` (a unix stream
//! socket, mode 0600): one request line, one reply line, then close.
//!
//! - `rescan` → `ok`: re-read the records now (the plugin sends it after
//!   writing or removing a record; the daemon also watches the directory).
//! - `check <containerID> <ifname>` → a [`CheckReply`] as JSON: whether
//!   the daemon serves the attachment's forwards (the plugin's CHECK).
//! - `reap <ifindex> <name> <netns path>` → `ok` once the link is found
//!   retired ([`RETIRED_ALIAS`]), then deleted in the background (the
//!   plugin's DEL, see [`Reaper`]).

use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// File name of the daemon's unix socket inside the state directory.
pub const DAEMON_SOCKET: &str = "edgelinkd.sock";

/// One forward as the daemon serves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwardLive {
    pub name: String,
    pub listening: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The answer to `check`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckReply {
    /// The daemon knows the attachment.
    pub found: bool,
    #[serde(default)]
    pub forwards: Vec<ForwardLive>,
}

impl CheckReply {
    /// Every forward has its listener up.
    pub fn live(&self) -> bool {
        self.found && self.forwards.iter().all(|f| f.listening)
    }
}

fn exchange(state_dir: &Path, line: &str, timeout: Duration) -> std::io::Result<String> {
    send(
        UnixStream::connect(state_dir.join(DAEMON_SOCKET))?,
        line,
        timeout,
    )
}

/// One request line on `s`, one reply line back.
fn send(mut s: UnixStream, line: &str, timeout: Duration) -> std::io::Result<String> {
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(line.as_bytes())?;
    s.write_all(b"\n")?;
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply)?;
    Ok(reply.trim().to_string())
}

/// The alias (IFLA_IFALIAS) DEL gives a pod interface it hands to the
/// daemon: the only links `reap` deletes, and the ones ADD waits for.
pub const RETIRED_ALIAS: &str = "edgelink: retired by DEL";

/// A connection to a running daemon, made before DEL retires a link: the
/// link is only retired when a daemon is there to delete it.
pub struct Reaper(UnixStream);

impl Reaper {
    /// Connect to the daemon. `None`: no daemon listens.
    pub fn connect(state_dir: &Path) -> Option<Reaper> {
        UnixStream::connect(state_dir.join(DAEMON_SOCKET))
            .ok()
            .map(Reaper)
    }

    /// Hand the retired link `index`, called `name`, in the namespace at
    /// `netns` to the daemon, which deletes it in the background. The
    /// kernel takes 15–40 ms to delete a link (it waits for RCU grace
    /// periods), which DEL need not wait for: the link holds no address
    /// any more and carries [`RETIRED_ALIAS`]. `Err`: the daemon did not
    /// take it (the caller deletes the link itself).
    pub fn reap(self, netns: &Path, index: u32, name: &str) -> std::io::Result<()> {
        let netns = netns
            .to_str()
            .filter(|p| !p.contains('\n'))
            .ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "netns path is not UTF-8")
            })?;
        match send(
            self.0,
            &format!("reap {index} {name} {netns}"),
            Duration::from_secs(1),
        )?
        .as_str()
        {
            "ok" => Ok(()),
            other => Err(std::io::Error::other(format!("daemon answered {other:?}"))),
        }
    }
}

/// Tell a running daemon to re-read the records now. Best effort: no
/// daemon, or a busy one, is not an error (it watches the directory too).
pub fn nudge_daemon(state_dir: &Path) {
    let path = state_dir.join(DAEMON_SOCKET);
    if !path.exists() {
        return;
    }
    if let Ok(mut s) = UnixStream::connect(&path) {
        let _ = s.set_write_timeout(Some(Duration::from_millis(50)));
        let _ = s.write_all(b"rescan\n");
    }
}

/// Ask the daemon about an attachment. `Ok(None)`: no daemon is listening.
pub fn query_daemon(
    state_dir: &Path,
    container_id: &str,
    ifname: &str,
    timeout: Duration,
) -> std::io::Result<Option<CheckReply>> {
    let reply = match exchange(
        state_dir,
        &format!("check {container_id} {ifname}"),
        timeout,
    ) {
        Ok(r) => r,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    serde_json::from_str(&reply).map(Some).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("daemon answered {reply:?}: {e}"),
        )
    })
}
