//! A process as Linux's `/proc` shows it.

/// A process as Linux's `/proc` shows it (`None` elsewhere, or when it is
/// gone): what the standard `process_*` metrics say, and what the bench
/// reads of the stores' processes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessStats {
    /// User + system time, every thread included (exited ones too).
    pub cpu: std::time::Duration,
    pub resident_bytes: u64,
    pub threads: u64,
    /// When it started, in seconds since the epoch.
    pub start_time_secs: f64,
    pub open_fds: Option<u64>,
}

/// Clock ticks per second of `/proc/<pid>/stat` (the kernel's `USER_HZ`:
/// 100 on every Linux architecture this runs on).
const TICKS_PER_SECOND: u64 = 100;
/// Bytes per page of `/proc/<pid>/stat`'s `rss` (4 KiB on x86-64 and arm64 Linux).
const PAGE_BYTES: u64 = 4096;

impl ProcessStats {
    /// Process `pid` (a number, or `self`).
    pub fn of(pid: &str) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name (field 2) is in parentheses and may hold spaces.
        let (_, rest) = stat.rsplit_once(')')?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // `fields[0]` is field 3 of proc(5).
        let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
        let ticks = field(14)? + field(15)?;
        let boot_secs: u64 = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
        Some(Self {
            cpu: std::time::Duration::from_millis(ticks * 1000 / TICKS_PER_SECOND),
            resident_bytes: field(24)? * PAGE_BYTES,
            threads: field(20)?,
            start_time_secs: boot_secs as f64 + field(22)? as f64 / TICKS_PER_SECOND as f64,
            open_fds: std::fs::read_dir(format!("/proc/{pid}/fd"))
                .ok()
                .map(|d| d.count() as u64),
        })
    }

    /// Appends the standard `process_*` metrics in the text format.
    pub(super) fn render_into(&self, out: &mut String) {
        use std::fmt::Write;
        let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        };
        metric(
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            self.cpu.as_secs_f64(),
        );
        metric(
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            self.resident_bytes as f64,
        );
        metric(
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            self.start_time_secs,
        );
        metric(
            "process_threads",
            "gauge",
            "Number of OS threads in the process.",
            self.threads as f64,
        );
        if let Some(fds) = self.open_fds {
            metric(
                "process_open_fds",
                "gauge",
                "Number of open file descriptors.",
                fds as f64,
            );
        }
    }
}
