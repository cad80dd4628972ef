//! `edgelink validate [--offline] [FILE|-]...`: every problem of network
//! configurations, before a pod finds them.
//!
//! The input is a plain network configuration (JSON), a conflist, or YAML
//! with NetworkAttachmentDefinitions (several documents, as `kubectl
//! apply -f` takes them): each edgelink configuration in it is checked.
//! A configuration is checked as ADD checks it (every key, the targets
//! against the ranges), and each of its keys that edgelink does not know is
//! a problem too (the plugin only warns: CNI wants unknown keys ignored).
//! On a node, it is also checked against the node, as ADD would: the node
//! policy allows the uplink and an existing bridge, the uplink exists, the
//! MTU fits it, a range applies to this node. `--offline` (anywhere else)
//! leaves the node out and checks per-node ranges for each node they name.
//!
//! Exit status 0 when nothing is wrong, 1 with every problem listed.

mod input;
mod problems;

pub use input::{configs, Input};
pub use problems::{problems, Where};

use std::io::{Read, Write};

/// Run the command; `args` are those after `validate`. Returns the exit
/// status.
pub fn main(args: &[String], out: &mut dyn Write) -> i32 {
    let mut offline = false;
    let mut files: Vec<&str> = Vec::new();
    for a in args {
        match a.as_str() {
            "--offline" => offline = true,
            "-h" | "--help" => {
                let _ = writeln!(out, "{}", USAGE);
                return 0;
            }
            s if s.starts_with("--") => {
                let _ = writeln!(out, "edgelink validate: unknown option {s:?}\n{USAGE}");
                return 2;
            }
            s => files.push(s),
        }
    }
    if files.is_empty() {
        files.push("-");
    }
    let place = if offline {
        Where::Offline
    } else {
        Where::ThisNode
    };
    let mut status = 0;
    for f in files {
        status = status.max(file(f, place, out));
    }
    status
}

/// Check one file; its exit status.
fn file(f: &str, place: Where, out: &mut dyn Write) -> i32 {
    let (name, text) = match read(Some(f)) {
        Ok(t) => t,
        Err(e) => {
            let _ = writeln!(out, "edgelink validate: {e}");
            return 1;
        }
    };
    let inputs = match configs(&text) {
        Ok(i) => i,
        Err(e) => {
            let _ = writeln!(out, "{name}: {e}");
            return 1;
        }
    };
    let mut bad = 0;
    let mut checked = 0;
    for input in &inputs {
        match input {
            Input::Skipped { label, why } => {
                let _ = writeln!(out, "{name}: {label}: skipped: {why}");
            }
            Input::Unreadable { label, problem } => {
                checked += 1;
                bad += 1;
                let _ = writeln!(out, "{name}: {label}: 1 problem\n  - {problem}");
            }
            Input::Config { label, conf } => {
                checked += 1;
                let found = problems(conf, place);
                if found.is_empty() {
                    let _ = writeln!(out, "{name}: {label}: OK");
                } else {
                    bad += 1;
                    let _ = writeln!(
                        out,
                        "{name}: {label}: {} problem{}",
                        found.len(),
                        if found.len() == 1 { "" } else { "s" }
                    );
                    for p in found {
                        let _ = writeln!(out, "  - {p}");
                    }
                }
            }
        }
    }
    if checked == 0 {
        let _ = writeln!(out, "{name}: no edgelink configuration found");
        return 1;
    }
    i32::from(bad > 0)
}

const USAGE: &str = "usage: edgelink validate [--offline] [FILE|-]...
  FILE: a network configuration (JSON), a conflist, or YAML with
  NetworkAttachmentDefinitions; - or none: standard input.
  Each edgelink configuration found is checked; other documents are skipped.
  --offline: do not check against this node (policy, uplink, its ranges).
  Exit status: 0 nothing wrong, 1 problems (each listed), 2 bad usage.";

fn read(file: Option<&str>) -> Result<(String, String), String> {
    match file {
        None | Some("-") => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| format!("cannot read standard input: {e}"))?;
            Ok(("<stdin>".into(), s))
        }
        Some(f) => std::fs::read_to_string(f)
            .map(|s| (f.to_string(), s))
            .map_err(|e| format!("cannot read {f}: {e}")),
    }
}
