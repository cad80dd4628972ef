//! Running the nft program. Every method here must run on a thread that is
//! inside the target namespace: the child inherits the thread's namespace.

use crate::{Error, Options};
use edgelink_netns::Netns;
use nftables::schema::Nftables;
use std::io::{self, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// nft aimed at one table of one namespace.
pub(crate) struct Nft<'a> {
    program: &'a Path,
    netns: &'a Path,
    table: &'a str,
}

impl<'a> Nft<'a> {
    pub(crate) fn new(opts: &'a Options, netns: &'a Netns, table: &'a str) -> Nft<'a> {
        Nft {
            program: &opts.nft,
            netns: netns.path(),
            table,
        }
    }

    /// Apply `doc` as one transaction (`nft -j -f -`).
    pub(crate) fn apply(&self, doc: &Nftables, action: &'static str) -> Result<(), Error> {
        let json = serde_json::to_vec(doc).map_err(|e| self.failed(action, e.to_string()))?;
        let out = self.run(&["-j", "-f", "-"], Some(&json))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(self.failed(action, stderr_of(&out)))
        }
    }

    /// `nft list table` as text, or None when the table does not exist.
    pub(crate) fn list_table(&self) -> Result<Option<String>, Error> {
        let out = self.run(&["list", "table", "inet", self.table], None)?;
        if out.status.success() {
            return Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned()));
        }
        let stderr = stderr_of(&out);
        if is_no_such_table(&stderr) {
            Ok(None)
        } else {
            Err(self.failed("list", stderr))
        }
    }

    /// `nft -j list counters table inet <table>`, as nft printed it.
    pub(crate) fn list_counters(&self) -> Result<Vec<u8>, Error> {
        let out = self.run(
            &["-j", "list", "counters", "table", "inet", self.table],
            None,
        )?;
        if out.status.success() {
            return Ok(out.stdout);
        }
        let stderr = stderr_of(&out);
        if is_no_such_table(&stderr) {
            Err(Error::NoTable {
                netns: self.netns.to_path_buf(),
                table: self.table.to_string(),
            })
        } else {
            Err(self.failed("list the counters of", stderr))
        }
    }

    pub(crate) fn parse_error(&self, reason: String) -> Error {
        Error::Parse {
            nft: self.program.to_path_buf(),
            netns: self.netns.to_path_buf(),
            table: self.table.to_string(),
            reason,
        }
    }

    fn failed(&self, action: &'static str, stderr: String) -> Error {
        Error::Nft {
            nft: self.program.to_path_buf(),
            netns: self.netns.to_path_buf(),
            table: self.table.to_string(),
            action,
            stderr,
        }
    }

    fn run(&self, args: &[&str], stdin: Option<&[u8]>) -> Result<Output, Error> {
        let spawn_error = |source: io::Error| Error::Spawn {
            nft: self.program.to_path_buf(),
            netns: self.netns.to_path_buf(),
            source,
        };
        let mut child = Command::new(self.program)
            .args(args)
            // nft's messages (strerror) are matched below: keep them English.
            .env("LC_ALL", "C")
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_error)?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // nft reads all of its input before it writes anything, so
            // writing first cannot deadlock; a write error (nft gone early)
            // shows in its exit status and stderr.
            let _ = pipe.write_all(input);
        }
        child.wait_with_output().map_err(spawn_error)
    }
}

fn stderr_of(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if text.is_empty() {
        format!("{} with nothing on stderr", out.status)
    } else {
        text
    }
}

/// nft reports a missing table as ENOENT.
fn is_no_such_table(stderr: &str) -> bool {
    stderr.contains("No such file or directory")
}
