//! The standard `process_*` metrics (as Prometheus' own clients export
//! them, so the usual dashboards and alerts work), read from /proc/self at
//! each scrape.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// The figures of one scrape; a figure /proc did not give is left out.
#[derive(Debug, Default, PartialEq)]
pub struct Process {
    pub cpu_seconds: Option<f64>,
    pub open_fds: Option<i64>,
    pub max_fds: Option<i64>,
    pub virtual_memory_bytes: Option<i64>,
    pub resident_memory_bytes: Option<i64>,
    pub start_time_seconds: Option<f64>,
    pub threads: Option<i64>,
}

/// sysconf(2)'s `name`, or `default` where it gives none.
fn sysconf(name: libc::c_int, default: i64) -> i64 {
    // SAFETY: sysconf only reads a value.
    let v = unsafe { libc::sysconf(name) };
    if v > 0 {
        v
    } else {
        default
    }
}

impl Process {
    pub fn read() -> Process {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let btime = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<f64>().ok())
        });
        let mut p = Process::from_stat(
            &stat,
            btime,
            sysconf(libc::_SC_CLK_TCK, 100) as f64,
            sysconf(libc::_SC_PAGESIZE, 4096),
        );
        p.open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as i64);
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we own.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
            p.max_fds = i64::try_from(lim.rlim_cur).ok();
        }
        p
    }

    /// The figures of a /proc/PID/stat line: fields after the command
    /// (which may hold spaces and parentheses) counted from its last ')'.
    pub fn from_stat(stat: &str, btime: Option<f64>, ticks: f64, page: i64) -> Process {
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            return Process::default();
        };
        // rest[0] is field 3 (state).
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |field: usize| f.get(field - 3).and_then(|v| v.parse::<f64>().ok());
        let cpu = match (num(14), num(15)) {
            (Some(u), Some(s)) => Some((u + s) / ticks),
            _ => None,
        };
        Process {
            cpu_seconds: cpu,
            threads: num(20).map(|v| v as i64),
            start_time_seconds: num(22).zip(btime).map(|(st, b)| b + st / ticks),
            virtual_memory_bytes: num(23).map(|v| v as i64),
            resident_memory_bytes: num(24).map(|v| v as i64 * page),
            ..Process::default()
        }
    }

    pub fn register(&self, reg: &mut Registry) {
        if let Some(v) = self.cpu_seconds {
            let c: Counter<f64, AtomicU64> = Counter::default();
            c.inc_by(v);
            reg.register(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                c,
            );
        }
        let gauges = [
            (
                "process_open_fds",
                "Number of open file descriptors",
                self.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                self.max_fds,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                self.virtual_memory_bytes,
            ),
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                self.resident_memory_bytes,
            ),
            (
                "process_threads",
                "Number of OS threads in the process",
                self.threads,
            ),
        ];
        for (name, help, v) in gauges {
            if let Some(v) = v {
                let g: Gauge = Gauge::default();
                g.set(v);
                reg.register(name, help, g);
            }
        }
        if let Some(v) = self.start_time_seconds {
            let g: Gauge<f64, AtomicU64> = Gauge::default();
            g.set(v);
            reg.register(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                g,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_spaces_in_the_command_is_read() {
        // Fields 3.. of a real line; the command holds ") (".
        let line = "4242 (edge) (linkd) S 1 4242 4242 0 -1 4194560 1234 0 0 0 \
                    250 150 0 0 20 0 7 0 5000 104857600 2560 18446744073709551615";
        let p = Process::from_stat(line, Some(1_700_000_000.0), 100.0, 4096);
        assert_eq!(p.cpu_seconds, Some(4.0));
        assert_eq!(p.threads, Some(7));
        assert_eq!(p.start_time_seconds, Some(1_700_000_050.0));
        assert_eq!(p.virtual_memory_bytes, Some(104_857_600));
        assert_eq!(p.resident_memory_bytes, Some(2560 * 4096));
    }

    #[test]
    fn this_process_is_read() {
        let p = Process::read();
        assert!(p.cpu_seconds.is_some() && p.resident_memory_bytes.unwrap_or(0) > 0);
        assert!(p.open_fds.unwrap_or(0) > 0 && p.max_fds.unwrap_or(0) > 0);
        assert!(p.start_time_seconds.unwrap_or(0.0) > 1e9);
    }
}
