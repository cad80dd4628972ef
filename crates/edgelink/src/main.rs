//! `edgelink`, the CNI plugin: reads the environment and the network
//! configuration, runs one command, prints the Result (or the CNI error
//! JSON) on stdout. Logs go to stderr or to `logFile`, never to stdout.
//! The commands, the configuration and the rest live in the library
//! (src/lib.rs).

use edgelink::config::{self, Config};
use edgelink::error::PluginError;
use edgelink::{commands, logfile};
use edgelink_cni_spec::{codes, CniError, Command, Env, NetConf};
use serde_json::Value;
use std::io::{Read, Write};

/// Set up logging: stderr, or `logFile` when it is allowed
/// ([`logfile`]). A `logFile` that breaks the rules or cannot be opened for
/// writing is returned as the command's error (code 7); nothing was created
/// for it, and the message also goes to stderr.
fn init_logging(raw: Option<&Value>) -> Option<CniError> {
    let b = raw.map(config::basics);
    let level = b
        .as_ref()
        .and_then(|b| b.log_level.clone())
        .unwrap_or_else(|| "warn".into());
    // A plain level filter: EnvFilter's directive parsing costs start-up
    // time on every ADD, and the plugin has no targets worth filtering.
    let filter = level
        .parse::<tracing_subscriber::filter::LevelFilter>()
        .unwrap_or(tracing_subscriber::filter::LevelFilter::WARN);
    let builder = tracing_subscriber::fmt()
        .with_max_level(filter)
        .with_ansi(false)
        .with_target(false);
    let Some(value) = b.and_then(|b| b.log_file) else {
        let _ = builder.with_writer(std::io::stderr).try_init();
        return None;
    };
    match logfile::open_log_file(&value, &logfile::allowed_dir()) {
        Ok(f) => {
            let _ = builder.with_writer(std::sync::Mutex::new(f)).try_init();
            None
        }
        Err(e) => {
            let _ = builder.with_writer(std::io::stderr).try_init();
            eprintln!("edgelink: {}", e.msg);
            Some(e)
        }
    }
}

fn dispatch(env: &Env, stdin: &[u8]) -> Result<Option<Value>, PluginError> {
    if env.command == Command::Version {
        return Ok(Some(commands::version::run(stdin)));
    }
    if env.command == Command::Del {
        // DEL must work from whatever it gets: only bad JSON stops it.
        let raw: Value = serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(
                codes::DECODE_FAILURE,
                format!("the network configuration on stdin is not valid JSON: {e}"),
            )
        })?;
        if !raw.is_object() {
            return Err(CniError::new(
                codes::DECODE_FAILURE,
                "the network configuration on stdin is not a JSON object",
            )
            .into());
        }
        if let Some(v) = raw.get("cniVersion").and_then(Value::as_str) {
            v.parse::<edgelink_cni_spec::CniVersion>()
                .map_err(|e| CniError::new(codes::INCOMPATIBLE_VERSION, e.to_string()))?;
        }
        commands::del::run(&raw, env)?;
        return Ok(None);
    }
    let net = NetConf::parse(stdin)?;
    let cfg = Config::parse(net, env)?;
    tracing::debug!(command = env.command.as_str(), container = %env.container_id, ifname = %env.ifname, "start");
    match env.command {
        Command::Add => commands::add::run(&cfg, env).map(Some),
        Command::Check => commands::check::run(&cfg, env).map(|_| None),
        Command::Status => commands::status::run(&cfg, env).map(|_| None),
        Command::Gc => commands::gc::run(&cfg, env).map(|_| None),
        Command::Del | Command::Version => unreachable!("handled above"),
    }
}

fn main() {
    // `edgelink validate ...` is a user's command; a runtime passes no
    // arguments (CNI speaks through the environment).
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("validate") {
        let code = edgelink::validate::main(&args[1..], &mut std::io::stdout().lock());
        std::process::exit(code);
    }
    let mut stdin = Vec::new();
    let env = Env::from_process();
    // VERSION may come without stdin; everything else needs it.
    if !matches!(&env, Ok(e) if e.command == Command::Version) || !is_tty_stdin() {
        let _ = std::io::stdin().read_to_end(&mut stdin);
    }
    let raw: Option<Value> = serde_json::from_slice(&stdin).ok();
    let bad_log_file = init_logging(raw.as_ref());
    let version = edgelink_cni_spec::netconf::raw_version(&stdin)
        .unwrap_or_else(|| edgelink_cni_spec::CniVersion::LATEST.as_str().to_string());

    let outcome = env.map_err(PluginError::from).and_then(|env| {
        match (bad_log_file, env.command) {
            (None, _) | (Some(_), Command::Version) => dispatch(&env, &stdin),
            // DEL still tears down (it must work from whatever it gets),
            // then reports the bad logFile.
            (Some(bad), Command::Del) => match dispatch(&env, &stdin) {
                Ok(_) => Err(bad.into()),
                Err(e) => {
                    let e = e.into_cni();
                    Err(CniError::new(bad.code, format!("{}; {}", bad.msg, e.msg)).into())
                }
            },
            // Everything else: refused before anything is touched.
            (Some(bad), _) => Err(bad.into()),
        }
    });
    let mut out = std::io::stdout().lock();
    let code = match outcome {
        Ok(Some(v)) => {
            let _ = writeln!(out, "{v}");
            0
        }
        Ok(None) => 0,
        Err(e) => {
            let e = e.into_cni();
            tracing::error!(code = e.code, "{}", e.msg);
            let _ = writeln!(out, "{}", e.to_json(&version));
            1
        }
    };
    let _ = out.flush();
    std::process::exit(code);
}

fn is_tty_stdin() -> bool {
    nix::unistd::isatty(std::io::stdin()).unwrap_or(false)
}
