//! The records directory.

use crate::{Record, RecordError};
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// One entry of [`RecordStore::list`]: the file and its record, or why it
/// could not be read.
pub type Listed = (PathBuf, Result<Record, RecordError>);

/// `<stateDir>/attachments/`.
#[derive(Debug, Clone)]
pub struct RecordStore {
    dir: PathBuf,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RecordError + '_ {
    move |source| RecordError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl RecordStore {
    /// The store under `state_dir`; nothing is created until a write.
    pub fn new(state_dir: &Path) -> RecordStore {
        RecordStore {
            dir: state_dir.join("attachments"),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the record of (container ID, ifname) lives. Container IDs are
    /// validated by the plugin (`[A-Za-z0-9][A-Za-z0-9_.-]*`), interface
    /// names contain no '/'; the record itself names both exactly.
    pub fn path(&self, container_id: &str, ifname: &str) -> PathBuf {
        self.dir.join(format!("{container_id}_{ifname}.json"))
    }

    /// Write a record atomically: a temp file in the same directory, fsync'd
    /// content, then rename over the final name.
    pub fn write(&self, rec: &Record) -> Result<PathBuf, RecordError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(io(&self.dir))?;
        let path = self.path(&rec.container_id, &rec.ifname);
        let tmp = self.dir.join(format!(
            ".{}_{}.{}.tmp",
            rec.container_id,
            rec.ifname,
            std::process::id()
        ));
        let body = serde_json::to_vec_pretty(rec).map_err(|e| RecordError::Malformed {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let result = (|| {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&body)?;
            f.write_all(b"\n")?;
            fs::rename(&tmp, &path)
        })();
        if let Err(e) = result {
            let _ = fs::remove_file(&tmp);
            return Err(RecordError::Io { path, source: e });
        }
        Ok(path)
    }

    /// Read the record of (container ID, ifname), if any.
    pub fn read(&self, container_id: &str, ifname: &str) -> Result<Option<Record>, RecordError> {
        let path = self.path(container_id, ifname);
        match fs::read(&path) {
            Ok(bytes) => {
                let rec = parse(&path, &bytes)?;
                if rec.container_id == container_id && rec.ifname == ifname {
                    Ok(Some(rec))
                } else {
                    Ok(None)
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(RecordError::Io { path, source: e }),
        }
    }

    /// Remove the record of (container ID, ifname). Absent is fine: returns false.
    pub fn remove(&self, container_id: &str, ifname: &str) -> Result<bool, RecordError> {
        let path = self.path(container_id, ifname);
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(RecordError::Io { path, source: e }),
        }
    }

    /// Every record file, parsed or with the reason it could not be.
    /// Temp files of writes in progress are skipped.
    pub fn list(&self) -> Result<Vec<Listed>, RecordError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(RecordError::Io {
                    path: self.dir.clone(),
                    source: e,
                })
            }
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io(&self.dir))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            let path = entry.path();
            let rec = fs::read(&path)
                .map_err(|e| RecordError::Io {
                    path: path.clone(),
                    source: e,
                })
                .and_then(|b| parse(&path, &b));
            out.push((path, rec));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

fn parse(path: &Path, bytes: &[u8]) -> Result<Record, RecordError> {
    serde_json::from_slice(bytes).map_err(|e| RecordError::Malformed {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Forward, Protocol, RecordInterface, RECORD_VERSION};
    use std::os::unix::fs::PermissionsExt;

    fn rec(cid: &str) -> Record {
        Record {
            pid_namespace: None,
            version: RECORD_VERSION,
            container_id: cid.into(),
            ifname: "net1".into(),
            netns: "/var/run/netns/pod".into(),
            network: "plant-floor".into(),
            mode: "bridge".into(),
            pod_namespace: Some("hil".into()),
            pod_name: Some("proxy-0".into()),
            pod_uid: None,
            interface: RecordInterface {
                name: "net1".into(),
                mac: "02:00:00:00:00:01".into(),
                ips: vec!["172.17.16.200/24".parse().unwrap()],
            },
            forwards: vec![Forward {
                name: "api".into(),
                protocol: Protocol::Tcp,
                port: 8080,
                target: "172.17.16.120:8080".parse().unwrap(),
                connect_timeout_ms: 5000,
                idle_timeout_ms: None,
                max_connections: None,
            }],
            allowed_targets: vec!["172.17.16.0/24".parse().unwrap()],
            created_at: 1,
            cni_config: None,
        }
    }

    #[test]
    fn write_read_list_remove() {
        let d = tempfile::tempdir().unwrap();
        let s = RecordStore::new(d.path());
        assert!(s.list().unwrap().is_empty());
        let p = s.write(&rec("c1")).unwrap();
        assert_eq!(
            fs::metadata(s.dir()).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(s.read("c1", "net1").unwrap().unwrap(), rec("c1"));
        s.write(&rec("c2")).unwrap();
        fs::write(s.dir().join("junk.json"), b"{").unwrap();
        fs::write(s.dir().join(".c3_net1.json.123.tmp"), b"{").unwrap();
        let all = s.list().unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(all.iter().filter(|(_, r)| r.is_err()).count(), 1);
        assert!(s.remove("c1", "net1").unwrap());
        assert!(!s.remove("c1", "net1").unwrap());
        assert!(s.read("c1", "net1").unwrap().is_none());
    }

    #[test]
    fn nudge_and_query_without_daemon_are_harmless() {
        let d = tempfile::tempdir().unwrap();
        crate::nudge_daemon(d.path());
        let q = crate::query_daemon(
            d.path(),
            "c1",
            "net1",
            std::time::Duration::from_millis(100),
        );
        assert!(q.unwrap().is_none());
        let sock =
            std::os::unix::net::UnixListener::bind(d.path().join(crate::DAEMON_SOCKET)).unwrap();
        crate::nudge_daemon(d.path());
        let (s, _) = sock.accept().unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(s), &mut line).unwrap();
        assert_eq!(line, "rescan\n");
    }
}
