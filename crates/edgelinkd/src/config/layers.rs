//! Where each setting of `edgelinkd run` comes from, the strongest first:
//! the command line, the environment (`EDGELINKD_<FLAG>`: `--state-dir` is
//! `EDGELINKD_STATE_DIR`), the config file (`--config`, YAML: each key is
//! a flag's long name, `state-dir: /var/lib/edgelink`), and last the
//! built-in defaults. Every value goes through the flag's own check,
//! wherever it came from; a key of the file that names no flag is refused,
//! with the flag it most likely meant.

use super::Cli;
use clap::{ArgMatches, Command, CommandFactory, FromArgMatches};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The environment variable of a flag: `EDGELINKD_` and its long name in
/// upper case, `-` as `_`.
pub fn env_name(long: &str) -> String {
    format!("EDGELINKD_{}", long.to_ascii_uppercase().replace('-', "_"))
}

/// The command line, with every visible flag of `run` settable from the
/// environment and from a config file.
pub fn command(config: Option<&Path>) -> Result<Command, String> {
    let mut cmd = Cli::command();
    cmd = cmd.mut_subcommand("run", with_env);
    if let Some(path) = config {
        let defaults = read(path)?;
        let flags = flags(cmd.find_subcommand("run").expect("run exists"));
        let mut run_defaults = Vec::new();
        for (key, value) in defaults {
            let Some((_, id)) = flags.iter().find(|(long, _)| *long == key) else {
                let longs: Vec<&str> = flags.iter().map(|(l, _)| l.as_str()).collect();
                let hint = closest(&key, &longs)
                    .map(|k| format!(" (did you mean {k:?}?)"))
                    .unwrap_or_default();
                return Err(format!(
                    "config file {}: {key:?} is not a setting of edgelinkd run{hint}",
                    path.display()
                ));
            };
            run_defaults.push((id.clone(), value?));
        }
        cmd = cmd.mut_subcommand("run", |mut run| {
            for (id, value) in run_defaults {
                run = run.mut_arg(id, |a| a.default_value(value));
            }
            run
        });
    }
    Ok(cmd)
}

/// Parse `argv` (the program's name first) through [`command`].
pub fn parse(argv: Vec<OsString>) -> Result<Cli, ParseError> {
    let config = config_path(&argv).map_err(ParseError::Config)?;
    let cmd = command(config.as_deref()).map_err(ParseError::Config)?;
    let matches: ArgMatches = cmd.try_get_matches_from(argv).map_err(ParseError::Clap)?;
    Cli::from_arg_matches(&matches).map_err(ParseError::Clap)
}

#[derive(Debug)]
pub enum ParseError {
    /// The config file cannot be read, or names no flag.
    Config(String),
    /// A flag or a value (from wherever it came) is wrong; or --help.
    Clap(clap::Error),
}

/// A subcommand's visible flags (the file's keys): (long name, arg id).
fn flags(cmd: &Command) -> Vec<(String, String)> {
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| Some((a.get_long()?.to_string(), a.get_id().to_string())))
        .filter(|(l, _)| !matches!(l.as_str(), "config" | "help" | "version"))
        .collect()
}

/// The flag `key` most likely meant: at most a third of it differs.
fn closest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(key, k), *k))
        .filter(|(d, k)| *d <= (k.len().max(key.len()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn with_env(mut cmd: Command) -> Command {
    let ids: Vec<(String, String)> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && a.get_env().is_none())
        .filter_map(|a| Some((a.get_id().to_string(), a.get_long()?.to_string())))
        .filter(|(_, long)| !matches!(long.as_str(), "help" | "version"))
        .collect();
    for (id, long) in ids {
        cmd = cmd.mut_arg(id, |a| a.env(env_name(&long)));
    }
    cmd
}

/// `--config FILE` (or `--config=FILE`) of a `run` command line, else
/// `EDGELINKD_CONFIG`.
fn config_path(argv: &[OsString]) -> Result<Option<PathBuf>, String> {
    if argv.get(1).and_then(|a| a.to_str()) != Some("run") {
        return Ok(None);
    }
    let mut it = argv.iter().skip(2);
    while let Some(a) = it.next() {
        let Some(s) = a.to_str() else { continue };
        if s == "--" {
            break;
        }
        if s == "--config" {
            return match it.next() {
                Some(p) => Ok(Some(PathBuf::from(p))),
                None => Err("--config needs a file".into()),
            };
        }
        if let Some(p) = s.strip_prefix("--config=") {
            return Ok(Some(PathBuf::from(p)));
        }
    }
    Ok(std::env::var_os("EDGELINKD_CONFIG")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from))
}

/// The file's settings as (flag, value) pairs, in the file's order; a
/// value that is not a single one is an error of its own, said only once
/// its key is known to name a flag.
type Setting = (String, Result<String, String>);

fn read(path: &Path) -> Result<Vec<Setting>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("config file {}: {e}", path.display()))?;
    let doc: serde_norway::Value = serde_norway::from_str(&text)
        .map_err(|e| format!("config file {}: not YAML: {e}", path.display()))?;
    let map = match doc {
        serde_norway::Value::Null => return Ok(Vec::new()),
        serde_norway::Value::Mapping(m) => m,
        _ => {
            return Err(format!(
                "config file {}: not a mapping of settings (state-dir: /var/lib/edgelink, ...)",
                path.display()
            ))
        }
    };
    let mut out = Vec::new();
    for (k, v) in map {
        let serde_norway::Value::String(key) = k else {
            return Err(format!(
                "config file {}: a key is {}, not a flag's name",
                path.display(),
                kind(&k)
            ));
        };
        let value = match v {
            serde_norway::Value::String(s) => s,
            serde_norway::Value::Bool(b) => b.to_string(),
            serde_norway::Value::Number(n) => n.to_string(),
            serde_norway::Value::Null => continue,
            other => {
                let e = format!(
                    "config file {}: {key}: {} is not a single value (a string, a number or a boolean)",
                    path.display(),
                    kind(&other)
                );
                out.push((key, Err(e)));
                continue;
            }
        };
        out.push((key, Ok(value)));
    }
    Ok(out)
}

/// What a YAML value is, as a user reads it.
fn kind(v: &serde_norway::Value) -> &'static str {
    match v {
        serde_norway::Value::Null => "empty",
        serde_norway::Value::Bool(_) => "a boolean",
        serde_norway::Value::Number(_) => "a number",
        serde_norway::Value::String(_) => "a string",
        serde_norway::Value::Sequence(_) => "a list",
        serde_norway::Value::Mapping(_) => "a mapping",
        serde_norway::Value::Tagged(_) => "a tagged value",
    }
}
