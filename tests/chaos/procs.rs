//! Child processes the test owns. Each writes its stdout and stderr to a log
//! file of its own (appended across restarts, with a marker line per start),
//! and is killed (SIGKILL) when dropped: a panicking test leaves nothing
//! running. Signals go through the `kill` command (no libc/nix dependency).

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;

/// A free loopback port below the kernel's ephemeral range: a process is
/// restarted on the same port after a kill, and a port from that range could
/// meanwhile be taken as the local port of some outgoing connection.
/// (Never 6379 or 3306, the shared servers', nor 7000-7005, the test cluster's.)
pub fn free_port() -> u16 {
    const FIRST: u16 = 20_000;
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    assert!(low > FIRST + 1000, "ephemeral ports start at {low}");
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..1000 {
        let port = FIRST + (random() % u64::from(low - FIRST)) as u16;
        // Not handed out already (its process may not have bound it yet).
        if !given.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return port;
        }
    }
    panic!("no free port in {FIRST}..{low}");
}

/// A random number (std's per-instance hasher keys are random).
fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// The test's directory: removed at the end of a passing run, kept (and its
/// path printed) when the test panics, for inspection.
pub struct ScratchDir {
    pub path: PathBuf,
}

impl ScratchDir {
    pub fn new(tag: &str) -> Self {
        let unique = uuid::Uuid::now_v7().simple().to_string();
        let path = std::env::temp_dir().join(format!("{tag}-{}", &unique[20..]));
        std::fs::create_dir_all(&path).expect("create the scratch dir");
        Self { path }
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("chaos: kept for inspection: {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The line written to a log before each start.
const START_MARKER: &str = "--- chaos: start";

/// How to start a process.
#[derive(Debug, Clone)]
pub struct Spec {
    pub program: OsString,
    pub args: Vec<OsString>,
    pub env: Vec<(String, String)>,
}

impl Spec {
    pub fn new(program: impl Into<OsString>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
        }
    }

    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Sets (or replaces) one environment variable.
    pub fn set_env(&mut self, key: &str, value: impl Into<String>) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.into()));
    }
}

/// One supervised process: `api-0`, `worker-1`, `redis`, `mariadb`.
pub struct Proc {
    pub name: String,
    pub spec: Spec,
    pub log: PathBuf,
    child: Option<Child>,
    starts: u32,
}

impl Proc {
    pub fn new(name: &str, spec: Spec, dir: &Path) -> Self {
        Self {
            name: name.to_owned(),
            spec,
            log: dir.join(format!("{name}.log")),
            child: None,
            starts: 0,
        }
    }

    /// Spawns the process (the previous incarnation must be gone).
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        self.starts += 1;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open the log");
        let _ = writeln!(log, "{START_MARKER} #{} of {} ---", self.starts, self.name);
        let child = Command::new(&self.spec.program)
            .args(&self.spec.args)
            .envs(self.spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(clone(&log)))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.name));
        self.child = Some(child);
    }

    /// SIGKILL (works on a stopped process too) and reap.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `kill -9`, then a fresh start with the current spec.
    pub fn restart(&mut self) {
        self.kill9();
        self.start();
    }

    /// Sends `STOP` or `CONT` (or any signal name) with the `kill` command.
    pub fn signal(&self, signal: &str) {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("{} is not running", self.name));
        let ok = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} {pid} ({}) failed", self.name);
    }

    /// Started and not reaped (it may have exited since: see `exited`).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// How the process ended, if it has (None while it runs or was never started).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Forgets an exited process, so it can be started again.
    pub fn reap(&mut self) -> Option<ExitStatus> {
        let status = self.exited();
        if status.is_some() {
            self.child = None;
        }
        status
    }

    /// The last `n` lines its current (or last) incarnation logged.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read(&self.log).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        let lines: Vec<&str> = text.lines().collect();
        let since = lines
            .iter()
            .rposition(|l| l.starts_with(START_MARKER))
            .map_or(0, |i| i + 1);
        let lines = &lines[since..];
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn clone(file: &File) -> File {
    file.try_clone().expect("clone the log handle")
}
