//! The daemon's control socket, `<stateDir>/edgelinkd.sock` (a unix stream
//! socket, mode 0600): one request line, one reply line, then close.
//!
//! - `rescan <containerID> <ifname>` → `ok`: re-read that attachment's
//!   record now (the plugin sends it after writing or removing the record;
//!   the daemon also watches the directory). A daemon from before this
//!   form answers an error and goes by its watch of the directory.
//! - `rescan` → `ok`: re-read every record now.
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

/// One request line, as the daemon reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `rescan`: every record.
    Rescan,
    /// `rescan <containerID> <ifname>`: the record of one attachment.
    RescanRecord {
        container_id: String,
        ifname: String,
    },
    /// `check <containerID> <ifname>`.
    Check {
        container_id: String,
        ifname: String,
    },
    /// `reap <ifindex> <name> <netns path>`; the path is absolute and may
    /// hold spaces (it is the rest of the line).
    Reap {
        index: u32,
        name: String,
        netns: String,
    },
}

/// Why the daemon refused a request line; it answers `error: <this>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error(
        "expected `rescan [<containerID> <ifname>]`, `check <containerID> <ifname>`, `reap <ifindex> <name> <netns>` or `handover`"
    )]
    Unknown,
    #[error("expected `reap <ifindex> <name> <netns>`")]
    ReapArguments,
    #[error("{0:?} is not an interface index")]
    Index(String),
    #[error("{0:?} is not an absolute path")]
    NotAbsolute(String),
}

impl Request {
    /// Parse one line as read from the socket (with or without its
    /// trailing `\n`).
    pub fn parse(line: &str) -> Result<Request, RequestError> {
        if let Some(rest) = line.strip_prefix("reap ") {
            let mut parts = rest.trim_end_matches('\n').splitn(3, ' ');
            let (Some(index), Some(name), Some(netns)) = (parts.next(), parts.next(), parts.next())
            else {
                return Err(RequestError::ReapArguments);
            };
            let Ok(index) = index.parse::<u32>() else {
                return Err(RequestError::Index(index.to_string()));
            };
            if !netns.starts_with('/') {
                return Err(RequestError::NotAbsolute(netns.to_string()));
            }
            return Ok(Request::Reap {
                index,
                name: name.to_string(),
                netns: netns.to_string(),
            });
        }
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next(), words.next()) {
            (Some("rescan"), None, None, None) => Ok(Request::Rescan),
            (Some("rescan"), Some(cid), Some(ifname), None) => Ok(Request::RescanRecord {
                container_id: cid.to_string(),
                ifname: ifname.to_string(),
            }),
            (Some("check"), Some(cid), Some(ifname), None) => Ok(Request::Check {
                container_id: cid.to_string(),
                ifname: ifname.to_string(),
            }),
            _ => Err(RequestError::Unknown),
        }
    }

    /// The line the plugin sends (without the `\n`).
    pub fn line(&self) -> String {
        match self {
            Request::Rescan => "rescan".to_string(),
            Request::RescanRecord {
                container_id,
                ifname,
            } => format!("rescan {container_id} {ifname}"),
            Request::Check {
                container_id,
                ifname,
            } => format!("check {container_id} {ifname}"),
            Request::Reap { index, name, netns } => format!("reap {index} {name} {netns}"),
        }
    }
}

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
    /// The daemon's reply line to `check`, as the plugin reads it.
    pub fn parse(reply: &str) -> Result<CheckReply, serde_json::Error> {
        serde_json::from_str(reply.trim())
    }

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
        let request = Request::Reap {
            index,
            name: name.to_string(),
            netns: netns.to_string(),
        };
        match send(self.0, &request.line(), Duration::from_secs(1))?.as_str() {
            "ok" => Ok(()),
            other => Err(std::io::Error::other(format!("daemon answered {other:?}"))),
        }
    }
}

/// Tell a running daemon to re-read the record of (container ID, ifname)
/// now. Best effort: no daemon, or a busy one, is not an error (it
/// watches the directory too).
pub fn nudge_daemon(state_dir: &Path, container_id: &str, ifname: &str) {
    let path = state_dir.join(DAEMON_SOCKET);
    if !path.exists() {
        return;
    }
    let request = Request::RescanRecord {
        container_id: container_id.to_string(),
        ifname: ifname.to_string(),
    };
    if let Ok(mut s) = UnixStream::connect(&path) {
        let _ = s.set_write_timeout(Some(Duration::from_millis(50)));
        let _ = s.write_all(format!("{}\n", request.line()).as_bytes());
    }
}

/// Ask the daemon about an attachment. `Ok(None)`: no daemon is listening.
pub fn query_daemon(
    state_dir: &Path,
    container_id: &str,
    ifname: &str,
    timeout: Duration,
) -> std::io::Result<Option<CheckReply>> {
    let request = Request::Check {
        container_id: container_id.to_string(),
        ifname: ifname.to_string(),
    };
    let reply = match exchange(state_dir, &request.line(), timeout) {
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
    CheckReply::parse(&reply).map(Some).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("daemon answered {reply:?}: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_requests_as_the_daemon_always_did_and_the_keyed_rescan() {
        assert_eq!(Request::parse("rescan\n"), Ok(Request::Rescan));
        assert_eq!(Request::parse("  rescan \r\n"), Ok(Request::Rescan));
        assert_eq!(
            Request::parse("check c1 net1\n"),
            Ok(Request::Check {
                container_id: "c1".into(),
                ifname: "net1".into()
            })
        );
        // The netns path is the rest of the line: it may hold spaces.
        assert_eq!(
            Request::parse("reap 7 net1 /run/netns/a b\n"),
            Ok(Request::Reap {
                index: 7,
                name: "net1".into(),
                netns: "/run/netns/a b".into()
            })
        );
        assert_eq!(
            Request::parse("rescan c1 net1\n"),
            Ok(Request::RescanRecord {
                container_id: "c1".into(),
                ifname: "net1".into()
            })
        );
        assert_eq!(Request::parse("rescan now"), Err(RequestError::Unknown));
        assert_eq!(
            Request::parse("rescan c1 net1 x"),
            Err(RequestError::Unknown)
        );
        assert_eq!(
            Request::parse("check c1 net1 x"),
            Err(RequestError::Unknown)
        );
        assert_eq!(Request::parse("check c1"), Err(RequestError::Unknown));
        assert_eq!(Request::parse("reap\n"), Err(RequestError::Unknown));
        assert_eq!(
            Request::parse("reap 7 net1"),
            Err(RequestError::ReapArguments)
        );
        assert_eq!(
            Request::parse("reap x net1 /n"),
            Err(RequestError::Index("x".into()))
        );
        assert_eq!(
            Request::parse("reap 7 net1 n\n"),
            Err(RequestError::NotAbsolute("n".into()))
        );
        // The daemon's answers, word for word.
        assert_eq!(
            format!("error: {}", RequestError::Index("x".into())),
            "error: \"x\" is not an interface index"
        );
        assert_eq!(
            format!("error: {}", RequestError::Unknown),
            "error: expected `rescan [<containerID> <ifname>]`, `check <containerID> <ifname>`, `reap <ifindex> <name> <netns>` or `handover`"
        );
    }

    #[test]
    fn what_the_plugin_sends_is_read_back_the_same() {
        for r in [
            Request::Rescan,
            Request::RescanRecord {
                container_id: "0123abc".into(),
                ifname: "net1".into(),
            },
            Request::Check {
                container_id: "0123abc".into(),
                ifname: "net1".into(),
            },
            Request::Reap {
                index: 42,
                name: "net1".into(),
                netns: "/proc/4242/ns/net".into(),
            },
        ] {
            assert_eq!(Request::parse(&format!("{}\n", r.line())), Ok(r));
        }
        let reply = CheckReply::parse("{\"found\":true,\"forwards\":[]}\n").unwrap();
        assert!(reply.live());
    }
}
