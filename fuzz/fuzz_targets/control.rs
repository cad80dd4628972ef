//! The daemon's control socket: a request line as edgelinkd reads it
//! (`Request::parse`), and the reply line to `check` as the plugin reads
//! it (`CheckReply::parse`).
//!
//! Checks: a request the daemon accepts, sent again as the plugin writes
//! it (`Request::line`), is read back as the same request, on one line;
//! every request the plugin can send (a valid container ID and interface
//! name, a netns path without a newline) is read back unchanged, never as
//! another one; a `reap` path is absolute; a reply that parses encodes on
//! one line and parses back equal.
#![no_main]

use edgelink_attachment::{CheckReply, Request};
use edgelink_cni_spec::env::{is_valid_ifname, validate_container_id};
use libfuzzer_sys::fuzz_target;

/// What `read_line` hands the parser: up to and including the first `\n`.
fn first_line(s: &str) -> &str {
    match s.find('\n') {
        Some(i) => &s[..=i],
        None => s,
    }
}

fn daemon_side(line: &str) {
    let Ok(req) = Request::parse(line) else {
        return;
    };
    let sent = req.line();
    assert!(!sent.contains('\n'), "{req:?} is sent on two lines");
    assert_eq!(
        Request::parse(&sent).as_ref(),
        Ok(&req),
        "{line:?} → {sent:?}"
    );
    assert_eq!(Request::parse(&format!("{sent}\n")).as_ref(), Ok(&req));
    if let Request::Reap { netns, .. } = &req {
        assert!(netns.starts_with('/'));
    }
}

/// Fields split on NUL bytes, as the plugin would fill a request.
fn plugin_side(s: &str) {
    let mut f = s.split('\0');
    let (Some(kind), Some(a), Some(b)) = (f.next(), f.next(), f.next()) else {
        return;
    };
    let req = match kind {
        "check" => {
            // CNI_CONTAINERID and CNI_IFNAME as Env validates them.
            if validate_container_id(a).is_err() || !is_valid_ifname(b) {
                return;
            }
            Request::Check {
                container_id: a.into(),
                ifname: b.into(),
            }
        }
        "reap" => {
            let Some(netns) = f.next() else { return };
            let Ok(index) = a.parse::<u32>() else { return };
            // The link's name is an interface name; Reaper refuses a path
            // with a newline; CNI_NETNS is absolute.
            if !is_valid_ifname(b) || netns.contains('\n') || !netns.starts_with('/') {
                return;
            }
            Request::Reap {
                index,
                name: b.into(),
                netns: netns.into(),
            }
        }
        _ => return,
    };
    let line = format!("{}\n", req.line());
    assert_eq!(
        Request::parse(first_line(&line)).as_ref(),
        Ok(&req),
        "the daemon reads {line:?} as something else"
    );
}

fn reply_side(line: &str) {
    let Ok(reply) = CheckReply::parse(line) else {
        return;
    };
    let text = serde_json::to_string(&reply).expect("a reply encodes");
    assert!(!text.contains('\n'), "reply on two lines: {text:?}");
    assert_eq!(CheckReply::parse(&text).expect("reparse"), reply);
    if reply.live() {
        assert!(reply.found && reply.forwards.iter().all(|f| f.listening));
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let line = first_line(s);
    daemon_side(line);
    reply_side(line);
    plugin_side(s);
});
