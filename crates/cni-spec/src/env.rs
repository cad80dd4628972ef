//! The environment contract: CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS,
//! CNI_IFNAME, CNI_ARGS, CNI_PATH.

use crate::args::CniArgs;
use crate::error::{codes, CniError};
use std::path::PathBuf;

/// The operation the runtime asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

impl Command {
    pub fn parse(s: &str) -> Result<Command, CniError> {
        Ok(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            "VERSION" => Command::Version,
            other => {
                return Err(CniError::new(
                    codes::INVALID_ENV,
                    format!(
                        "CNI_COMMAND {other:?} is not one of ADD, DEL, CHECK, STATUS, GC, VERSION"
                    ),
                ))
            }
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Status => "STATUS",
            Command::Gc => "GC",
            Command::Version => "VERSION",
        }
    }
}

/// The validated environment of one invocation.
#[derive(Debug, Clone)]
pub struct Env {
    pub command: Command,
    /// Required for ADD, DEL, CHECK; empty otherwise.
    pub container_id: String,
    /// Required for ADD and CHECK; may be empty (netns gone) for DEL.
    pub netns: Option<PathBuf>,
    /// Required for ADD, DEL, CHECK.
    pub ifname: String,
    pub args: CniArgs,
    /// CNI_PATH split on ':' with duplicates removed (Multus repeats entries).
    pub path: Vec<PathBuf>,
}

impl Env {
    /// Read and validate the environment from a lookup function (the
    /// process environment in production, a map in tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Env, CniError> {
        let command = match get("CNI_COMMAND") {
            Some(c) if !c.is_empty() => Command::parse(&c)?,
            _ => return Err(CniError::new(codes::INVALID_ENV, "CNI_COMMAND is not set")),
        };
        let nonempty = |k: &str| get(k).filter(|v| !v.is_empty());
        let per_container = matches!(command, Command::Add | Command::Del | Command::Check);

        let container_id = nonempty("CNI_CONTAINERID").unwrap_or_default();
        let ifname = nonempty("CNI_IFNAME").unwrap_or_default();
        let netns = nonempty("CNI_NETNS").map(PathBuf::from);
        if per_container {
            if container_id.is_empty() {
                return Err(missing(command, "CNI_CONTAINERID"));
            }
            validate_container_id(&container_id)?;
            if ifname.is_empty() {
                return Err(missing(command, "CNI_IFNAME"));
            }
            validate_ifname(&ifname)?;
            if netns.is_none() && command != Command::Del {
                return Err(missing(command, "CNI_NETNS"));
            }
        }
        let mut path: Vec<PathBuf> = Vec::new();
        for p in get("CNI_PATH").unwrap_or_default().split(':') {
            let p = PathBuf::from(p);
            if !p.as_os_str().is_empty() && !path.contains(&p) {
                path.push(p);
            }
        }
        Ok(Env {
            command,
            container_id,
            netns,
            ifname,
            args: CniArgs::parse(&get("CNI_ARGS").unwrap_or_default()),
            path,
        })
    }

    pub fn from_process() -> Result<Env, CniError> {
        Env::from_lookup(|k| std::env::var(k).ok())
    }
}

fn missing(command: Command, var: &str) -> CniError {
    CniError::new(
        codes::INVALID_ENV,
        format!("{var} is required for {} but is not set", command.as_str()),
    )
}

/// Container IDs are opaque: the spec allows alphanumerics plus `_`, `.`
/// and `-`. Up to 256 characters are accepted, which is longer than a file
/// name may be once escaped: every file named after a container ID (records,
/// IPAM owner indexes) escapes it and cuts long names with a hash suffix.
pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    let ok = id.len() <= 256
        && id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(CniError::new(
            codes::INVALID_ENV,
            format!("CNI_CONTAINERID {id:?} is invalid: it must match [a-zA-Z0-9][a-zA-Z0-9_.-]*"),
        ))
    }
}

/// A Linux interface name: 1..=15 bytes, no '/', ':' or whitespace, not "." or "..".
pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    if is_valid_ifname(name) {
        Ok(())
    } else {
        Err(CniError::new(
            codes::INVALID_ENV,
            format!(
                "CNI_IFNAME {name:?} is not a valid interface name (1 to 15 characters, no '/', ':' or spaces)"
            ),
        ))
    }
}

pub fn is_valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<Env, CniError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn add_needs_container_netns_and_ifname() {
        let e = env(&[("CNI_COMMAND", "ADD")]).unwrap_err();
        assert_eq!(e.code, 4);
        assert!(e.msg.contains("CNI_CONTAINERID"));
        let e = env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "net1"),
        ])
        .unwrap_err();
        assert!(e.msg.contains("CNI_NETNS"), "{e}");
        let ok = env(&[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "net1"),
            ("CNI_NETNS", "/run/netns/x"),
            ("CNI_PATH", "/opt/cni/bin:/opt/cni/bin::/usr/lib/cni"),
        ])
        .unwrap();
        assert_eq!(ok.path.len(), 2);
    }

    #[test]
    fn del_tolerates_empty_netns() {
        let ok = env(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "net1"),
            ("CNI_NETNS", ""),
        ])
        .unwrap();
        assert!(ok.netns.is_none());
    }

    #[test]
    fn rejects_bad_command_ifname_and_container_id() {
        assert_eq!(env(&[("CNI_COMMAND", "FOO")]).unwrap_err().code, 4);
        assert_eq!(env(&[]).unwrap_err().code, 4);
        let e = env(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_IFNAME", "waytoolonginterfacename"),
        ])
        .unwrap_err();
        assert!(e.msg.contains("waytoolonginterfacename"));
        let e = env(&[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "../etc"),
            ("CNI_IFNAME", "net1"),
        ])
        .unwrap_err();
        assert!(e.msg.contains("CNI_CONTAINERID"));
    }

    #[test]
    fn status_and_version_need_no_container() {
        assert!(env(&[("CNI_COMMAND", "STATUS")]).is_ok());
        assert!(env(&[("CNI_COMMAND", "VERSION")]).is_ok());
        assert!(env(&[("CNI_COMMAND", "GC"), ("CNI_PATH", "/x")]).is_ok());
    }
}
