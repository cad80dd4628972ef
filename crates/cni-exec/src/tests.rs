use super::*;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;

#[test]
fn plugin_names() {
    for ok in [
        "host-local",
        "dhcp",
        "static",
        "whereabouts",
        "my_ipam.v2",
        "a",
    ] {
        assert!(is_plugin_name(ok), "{ok}");
    }
    for bad in [
        "",
        ".",
        "..",
        "../x",
        "a/../b",
        "/tmp/x.sh",
        "bin/sh",
        "x..y",
        ".hidden",
        "a b",
        "a\0b",
        "a\\b",
    ] {
        assert!(!is_plugin_name(bad), "{bad:?}");
        let e = validate_plugin_name(bad).unwrap_err();
        assert!(e.to_string().starts_with("ipam.type"), "{e}");
    }
}

/// A directory with one executable shell script `name`.
fn plugin(name: &str, script: &str) -> (tempfile::TempDir, Vec<PathBuf>) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{script}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    let dirs = vec![d.path().to_path_buf()];
    (d, dirs)
}

/// Run the script `fake` of `dirs`. A script just written may still be
/// open for writing in a child another test thread forked before the
/// write was closed (until that child's exec closes it): exec(2) then
/// fails with ETXTBSY, and is tried again (review item 24).
fn run(
    dirs: &[PathBuf],
    env: Environment,
    timeout: Option<Duration>,
) -> Result<Option<Value>, ExecError> {
    let mut tries = 0;
    loop {
        let r = exec(
            &Invocation {
                plugin: "fake",
                dirs,
                command: Command::Del,
                env: env.clone(),
                timeout,
            },
            &json!({"cniVersion": "1.0.0", "name": "n"}),
        );
        match r {
            Err(ExecError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 100 =>
            {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            r => return r,
        }
    }
}

#[test]
fn answers_are_read_as_the_spec_says() {
    // The configuration on stdin, CNI_COMMAND and the variables set.
    let (_d, dirs) = plugin(
        "fake",
        r#"cfg=$(cat); printf '{"cmd":"%s","cid":"%s","netns":"%s","cfg":%s}' "$CNI_COMMAND" "$CNI_CONTAINERID" "$CNI_NETNS" "$cfg""#,
    );
    let env = Environment::Only(vec![
        ("CNI_CONTAINERID", "c1".into()),
        ("CNI_NETNS", String::new()),
    ]);
    for timeout in [None, Some(Duration::from_secs(10))] {
        let v = run(&dirs, env.clone(), timeout).unwrap().unwrap();
        assert_eq!(v["cmd"], "DEL");
        assert_eq!(v["cid"], "c1");
        assert_eq!(v["netns"], "");
        assert_eq!(v["cfg"]["name"], "n");
    }

    let (_d, dirs) = plugin("fake", "cat >/dev/null");
    assert!(run(&dirs, Environment::Only(vec![]), None)
        .unwrap()
        .is_none());

    let (_d, dirs) = plugin(
        "fake",
        r#"echo '{"cniVersion":"1.0.0","code":11,"msg":"busy","details":"try later"}'; exit 1"#,
    );
    let e = run(&dirs, Environment::Only(vec![]), None).unwrap_err();
    assert!(matches!(e, ExecError::Failed { code: 11, .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with("ipam plugin fake failed on DEL: busy try later (its code 11"),
        "{e}"
    );

    let (_d, dirs) = plugin("fake", "echo not json");
    let e = run(&dirs, Environment::Only(vec![]), None).unwrap_err();
    assert!(matches!(e, ExecError::NotJson { .. }), "{e:?}");
}

#[test]
fn only_the_given_environment_reaches_the_plugin() {
    let (_d, dirs) = plugin(
        "fake",
        r#"printf '{"home":"%s","path":"%s"}' "${HOME-unset}" "$PATH""#,
    );
    let v = run(&dirs, Environment::Only(vec![]), None)
        .unwrap()
        .unwrap();
    assert_eq!(v["home"], "unset");
    assert!(v["path"].as_str().unwrap().contains("/usr/bin"));
}

#[test]
fn a_missing_plugin_names_the_directories_and_a_slow_one_is_killed() {
    let d = tempfile::tempdir().unwrap();
    let dirs = vec![d.path().to_path_buf()];
    let e = run(&dirs, Environment::Only(vec![]), None).unwrap_err();
    assert!(matches!(e, ExecError::NotFound { .. }), "{e:?}");
    assert!(
        e.to_string().contains(&d.path().display().to_string()),
        "{e}"
    );

    let (_d, dirs) = plugin("fake", "exec sleep 30");
    let t = Instant::now();
    let e = run(
        &dirs,
        Environment::Only(vec![]),
        Some(Duration::from_millis(300)),
    )
    .unwrap_err();
    assert!(matches!(e, ExecError::TimedOut { .. }), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
}

/// What another test's fork does to a script just written: it holds it
/// open for writing a moment. exec(2) fails with ETXTBSY meanwhile, which
/// `run` tries again; the script runs once the writer is gone.
#[test]
fn a_script_held_open_for_writing_runs_once_it_is_closed() {
    let (d, dirs) = plugin("fake", "cat >/dev/null");
    let writer = std::fs::OpenOptions::new()
        .append(true)
        .open(d.path().join("fake"))
        .unwrap();
    let direct = std::process::Command::new(d.path().join("fake")).status();
    assert_eq!(
        direct.map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::ExecutableFileBusy),
        "exec while open for writing"
    );
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(writer);
    });
    assert!(run(&dirs, Environment::Only(vec![]), None)
        .unwrap()
        .is_none());
    closer.join().unwrap();
}
