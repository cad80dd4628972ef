//! `logFile`: where the plugin's logs go instead of stderr. The plugin runs
//! as root and the value comes from the network configuration, which
//! whoever may create a NetworkAttachmentDefinition writes. So the file must
//! lie directly inside one directory that only root chooses (the
//! `EDGELINK_LOG_DIR` environment of the plugin process, set by the
//! runtime's service, else [`DEFAULT_LOG_DIR`]), and it is opened without
//! following a symbolic link: the directory with `O_DIRECTORY|O_NOFOLLOW`,
//! the file with `openat(.., O_NOFOLLOW)`, and only a regular file with one
//! link is used. The directory is created (0750) when it is missing.
//!
//! A value that breaks the rule, or a file that cannot be opened for
//! writing (its directory cannot be made, is read-only, is a symbolic link;
//! the file is a directory, a FIFO, immutable), is a config error (code 7)
//! naming the value and why, and nothing is created: a `logFile` the
//! administrator asked for never falls back to stderr, where a runtime
//! throws the logs away.

use edgelink_cni_spec::{codes, CniError};
use nix::fcntl::{open, openat, OFlag};
use nix::sys::stat::Mode;
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

/// The directory `logFile` must name a file in, unless the plugin's
/// environment says otherwise ([`LOG_DIR_ENV`]).
pub const DEFAULT_LOG_DIR: &str = "/var/log/edgelink";
/// The environment variable that moves the allowed directory. It is read
/// from the plugin's process environment (set by the runtime, i.e. root on
/// the node), never from the network configuration.
pub const LOG_DIR_ENV: &str = "EDGELINK_LOG_DIR";

/// Why `logFile` was not opened: code 7, naming the value and the reason.
pub type LogFileError = CniError;

fn invalid(value: &str, reason: String) -> LogFileError {
    CniError::new(
        codes::INVALID_CONFIG,
        format!("logFile: {value:?} {reason}"),
    )
}

/// The allowed directory: `$EDGELINK_LOG_DIR` when it is an absolute path,
/// else [`DEFAULT_LOG_DIR`].
pub fn allowed_dir() -> PathBuf {
    std::env::var_os(LOG_DIR_ENV)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_LOG_DIR))
}

/// The file name `value` gives inside `dir`, if the value is allowed: an
/// absolute path with no `.` or `..` component, directly inside `dir`.
pub fn file_name_in<'a>(value: &'a str, dir: &Path) -> Result<&'a str, LogFileError> {
    if !value.starts_with('/') {
        return Err(invalid(value, "is not an absolute path".into()));
    }
    if value.contains('\0') {
        return Err(invalid(value, "contains a NUL byte".into()));
    }
    if value.split('/').any(|seg| seg == "." || seg == "..") {
        return Err(invalid(value, "has a '.' or '..' component".into()));
    }
    if value.ends_with('/') {
        return Err(invalid(value, "names a directory, not a file".into()));
    }
    let outside = || {
        invalid(
            value,
            format!(
                "is not a file directly inside {} (the only place logFile may name; \
                 {LOG_DIR_ENV} in the plugin's environment moves it)",
                dir.display()
            ),
        )
    };
    let rest = Path::new(value).strip_prefix(dir).map_err(|_| outside())?;
    let mut comps = rest.components();
    match (comps.next(), comps.next()) {
        (Some(Component::Normal(n)), None) => n.to_str().ok_or_else(outside),
        _ => Err(outside()),
    }
}

/// Check `value` against the rules and open it for appending (created 0640
/// if missing), never following a symbolic link.
pub fn open_log_file(value: &str, dir: &Path) -> Result<File, LogFileError> {
    let name = file_name_in(value, dir)?;
    let in_dir = |why: String| {
        invalid(
            value,
            format!("cannot be opened: its directory {} {why}", dir.display()),
        )
    };
    if let Err(e) = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)
    {
        return Err(in_dir(format!("cannot be created: {e}")));
    }
    let dirfd = open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        // O_DIRECTORY|O_NOFOLLOW on a symbolic link gives ENOTDIR.
        nix::Error::ELOOP | nix::Error::ENOTDIR
            if std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) =>
        {
            in_dir("is a symbolic link (refused)".into())
        }
        nix::Error::ENOTDIR => in_dir("is not a directory".into()),
        e => in_dir(format!("cannot be opened: {e}")),
    })?;
    let fd = openat(
        &dirfd,
        name,
        OFlag::O_WRONLY
            | OFlag::O_APPEND
            | OFlag::O_CREAT
            | OFlag::O_NOFOLLOW
            | OFlag::O_NOCTTY
            | OFlag::O_NONBLOCK
            | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o640),
    )
    .map_err(|e| match e {
        nix::Error::ELOOP => invalid(value, "is a symbolic link".into()),
        nix::Error::EISDIR => invalid(value, "is a directory".into()),
        // O_NONBLOCK|O_WRONLY on a FIFO without a reader.
        nix::Error::ENXIO => invalid(value, "is not a regular file (a FIFO or socket)".into()),
        nix::Error::EACCES | nix::Error::EPERM | nix::Error::EROFS => invalid(
            value,
            format!("is not writable (read-only file system, immutable file or directory): {e}"),
        ),
        e => invalid(value, format!("cannot be opened for writing: {e}")),
    })?;
    let file = File::from(fd);
    let meta = file
        .metadata()
        .map_err(|e| invalid(value, format!("cannot be examined (fstat): {e}")))?;
    if !meta.file_type().is_file() {
        return Err(invalid(value, "is not a regular file".into()));
    }
    if meta.nlink() > 1 {
        return Err(invalid(
            value,
            format!("has {} hard links (one is allowed)", meta.nlink()),
        ));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(r: Result<&str, LogFileError>) -> Option<u32> {
        r.err().map(|e| e.code)
    }

    #[test]
    fn only_a_file_directly_inside_the_directory() {
        let d = Path::new("/var/log/edgelink");
        assert_eq!(
            file_name_in("/var/log/edgelink/a.log", d).ok(),
            Some("a.log")
        );
        for bad in [
            "a.log",
            "var/log/edgelink/a.log",
            "/var/log/edgelink",
            "/var/log/edgelink/",
            "/var/log/edgelink/../../../etc/passwd",
            "/var/log/edgelink/./a.log",
            "/var/log/edgelink/sub/a.log",
            "/var/log/edgelink-other/a.log",
            "/etc/cron.d/x",
            "/var/log/edgelink/..",
        ] {
            assert_eq!(code(file_name_in(bad, d)), Some(7), "{bad}");
        }
    }
}
