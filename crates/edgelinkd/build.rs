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
    // HEAD, the branch it names and packed-refs (where a branch lives
    // after `git pack-refs`) move with each commit. Only files that exist:
    // cargo reruns the script on every build for one that does not.
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for path in ["HEAD", "packed-refs"]
        .into_iter()
        .map(str::to_string)
        .chain(branch)
    {
        if let Some(p) = git(&["rev-parse", "--path-format=absolute", "--git-path", &path]) {
            if std::path::Path::new(&p).exists() {
                println!("cargo:rerun-if-changed={p}");
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
