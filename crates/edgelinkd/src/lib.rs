//! The command line of `edgelinkd`: its flags, their environment
//! variables and its config file ([`config`]). A library target so that
//! the manifest tests (tests/tests/manifests.rs) hold daemonset/ against
//! the flags the daemon really accepts; the process itself is the binary
//! (main.rs), which nothing imports.

pub mod config;

/// The commit this binary was built from (build.rs: `git rev-parse`, or
/// `EDGELINK_COMMIT` where the build has no .git; else "unknown").
pub const COMMIT: &str = env!("EDGELINK_COMMIT");
/// What `--version` prints after the name.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("EDGELINK_COMMIT"),
    ")"
);
