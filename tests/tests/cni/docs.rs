//! docs/debugging.md followed literally (issue 21: it used a binary
//! `make demo` does not build, left the pod's `lo` down, and its GC step
//! did nothing without saying why). Its shell and JSON blocks run in
//! order, as a reader would paste them, with three rewrites only: the
//! namespaces `node`, `pod` and `device` get names of this test's own,
//! `/tmp/elk` a temporary directory, and `target/debug/...` the binaries
//! under test. The build step and the wrapper script (not commands to
//! run) are skipped.

use edgelink_tests::*;
use std::process::Command;

/// The fenced blocks of a Markdown text: (language, body, the text before).
fn blocks(md: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut before = String::new();
    let mut lines = md.lines();
    while let Some(l) = lines.next() {
        let Some(lang) = l.strip_prefix("```") else {
            before.push_str(l);
            before.push('\n');
            continue;
        };
        let mut body = String::new();
        for b in lines.by_ref() {
            if b.starts_with("```") {
                break;
            }
            body.push_str(b);
            body.push('\n');
        }
        out.push((lang.trim().to_string(), body, std::mem::take(&mut before)));
    }
    out
}

/// `word` as a namespace name after each of the ways the doc names one.
fn rename(text: &str, word: &str, to: &str) -> String {
    let mut s = text.to_string();
    for prefix in [
        "ip netns add ",
        "ip netns del ",
        "ip netns exec ",
        "ip netns pids ",
        "ip -n ",
        "bridge -n ",
        " netns ",
        "/var/run/netns/",
    ] {
        for end in [" ", ";", "\n", "\\"] {
            s = s.replace(
                &format!("{prefix}{word}{end}"),
                &format!("{prefix}{to}{end}"),
            );
        }
    }
    s
}

/// Deletes the doc's namespaces (and what runs in them) however the test
/// ends.
struct Namespaces(Vec<String>);

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in &self.0 {
            if let Ok(o) = Command::new("ip").args(["netns", "pids", n]).output() {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).output();
                }
            }
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

#[test]
fn debugging_md_runs_as_written() {
    let md = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/debugging.md"),
    )
    .unwrap();
    let tag = format!("elkdoc{}", std::process::id());
    let names = ["node", "pod", "device"].map(|w| (w, format!("{tag}-{w}")));
    let _guard = Namespaces(names.iter().map(|(_, n)| n.clone()).collect());
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("elk");
    let (plugin, daemon) = (plugin_bin(), daemon_bin());

    let mut script = String::from("set -e\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n");
    let mut ran = 0;
    for (lang, body, before) in blocks(&md) {
        if body.contains("cargo build") || body.starts_with("#!") {
            continue;
        }
        let mut text = body.replace("/tmp/elk", state.to_str().unwrap());
        for (w, n) in &names {
            text = rename(&text, w, n);
        }
        // Through placeholders: the daemon's path may hold the plugin's.
        text = text
            .replace("target/debug/edgelinkd", "\u{1}D")
            .replace("target/debug/edgelink", "\u{1}P")
            .replace("\u{1}D", daemon.to_str().unwrap())
            .replace("\u{1}P", plugin.to_str().unwrap());
        match lang.as_str() {
            "sh" => script.push_str(&text),
            "json" => {
                // The file the text before it names: `conf.json`.
                let file = before
                    .rsplit('`')
                    .find(|w| w.ends_with(".json"))
                    .expect("a JSON block names its file before it");
                std::fs::write(dir.path().join(file), text).unwrap();
            }
            _ => continue,
        }
        script.push('\n');
        ran += 1;
    }
    assert!(ran >= 12, "{ran} blocks: the doc lost its steps?");
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the doc's commands failed ({:?}):\n{stdout}\n--- stderr:\n{stderr}\n--- script:\n{script}",
        out.status
    );
    for want in [
        "conf.json: config: OK",
        "healthy",
        "status 0",
        "supportedVersions",
        "hil/proxy-0",
        "device says 200",
        "connections 1",
    ] {
        assert!(
            stdout.contains(want),
            "no {want:?} in:\n{stdout}\n--- stderr:\n{stderr}"
        );
    }
    // The pod got its address, and the last block removed the lab.
    assert!(stdout.contains("172.17.16.200/24"), "{stdout}");
    let left = String::from_utf8_lossy(
        &Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    assert!(!left.contains(&tag), "the doc's last block left {left}");
    assert!(
        !state.exists(),
        "the doc's last block left {}",
        state.display()
    );
}
