//! The commit edgelinkd is built from, for `--version` and
//! `edgelink_build_info`: `EDGELINK_COMMIT` when set (an image build
//! without .git passes it), else `git rev-parse --short=12 HEAD`, else
//! "unknown". Rebuilt when HEAD moves.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=EDGELINK_COMMIT");
    let commit = std::env::var("EDGELINK_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=EDGELINK_COMMIT={commit}");
    // HEAD, and the branch it names, move with each commit.
    for path in [
        Some("HEAD".to_string()),
        git(&["symbolic-ref", "-q", "HEAD"]),
    ]
    .into_iter()
    .flatten()
    {
        if let Some(p) = git(&["rev-parse", "--path-format=absolute", "--git-path", &path]) {
            println!("cargo:rerun-if-changed={p}");
        }
    }
}
