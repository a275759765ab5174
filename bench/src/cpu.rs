//! CPU time from `/proc` (Linux; `None` elsewhere): of this whole process,
//! to put a cost on each request of a load run, and of the calling thread,
//! to time a tight loop.

use std::time::Duration;

/// User + system time of this process so far, every thread included (exited
/// ones too), in steps of 10 ms.
pub fn process() -> Option<Duration> {
    of("self")
}

/// User + system time of process `pid` so far (Linux; `None` when it is not
/// readable).
pub fn of(pid: &str) -> Option<Duration> {
    flashsale::metrics::ProcessStats::of(pid).map(|p| p.cpu)
}

/// Time the calling thread has spent on a CPU, to the nanosecond: the first
/// field of `/proc/thread-self/schedstat`.
pub fn thread() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = stat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_grows_with_work() {
        let (Some(p0), Some(t0)) = (process(), thread()) else {
            return; // not Linux
        };
        // Work until this thread's clock shows 30 ms (on a shared machine
        // that takes longer by the wall clock), for at most 5 s.
        let mut x = 0u64;
        let started = std::time::Instant::now();
        while thread().unwrap() - t0 < Duration::from_millis(30)
            && started.elapsed() < Duration::from_secs(5)
        {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        }
        let (p1, t1) = (process().unwrap(), thread().unwrap());
        assert!(t1 - t0 >= Duration::from_millis(30), "{:?}", t1 - t0);
        // The process's clock counts in 10 ms steps.
        assert!(
            p1 - p0 + Duration::from_millis(20) >= t1 - t0,
            "the process's time holds its thread's: {:?} vs {:?}",
            p1 - p0,
            t1 - t0
        );
        assert!(p1 - p0 <= Duration::from_secs(10));
    }
}

/// Threads whose CPU time is summed: a runtime's, registered as each starts
/// (`on_thread_start`), so that a server in this process can be measured
/// apart from the load generator beside it. A thread that exits takes its
/// time with it (tokio's blocking threads do after 10 s idle), so measure
/// spans shorter than that or keep the threads busy.
#[derive(Debug, Clone, Default)]
pub struct ThreadGroup {
    tids: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
}

impl ThreadGroup {
    /// Adds the calling thread.
    pub fn register_current(&self) {
        let tid = std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name()?.to_str()?.parse().ok());
        if let Some(tid) = tid {
            self.tids
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(tid);
        }
    }

    /// Time the group's living threads have spent on a CPU (`None`: not
    /// Linux). Zero while no thread has registered yet (a runtime just started).
    pub fn cpu(&self) -> Option<Duration> {
        if !std::path::Path::new("/proc/thread-self").exists() {
            return None;
        }
        let tids = self.tids.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let ns: u64 = tids
            .iter()
            .filter_map(|tid| {
                let stat =
                    std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
                stat.split_whitespace().next()?.parse::<u64>().ok()
            })
            .sum();
        Some(Duration::from_nanos(ns))
    }
}

#[cfg(test)]
mod group_tests {
    use super::*;

    #[test]
    fn a_group_counts_its_threads_and_not_the_others() {
        // Burns until the calling thread's own clock shows `ms` (however
        // long that takes by the wall clock on a shared machine; 10 s at most).
        fn burn(ms: u64) {
            let Some(t0) = thread() else { return };
            let started = std::time::Instant::now();
            let mut x = 0u64;
            while thread().unwrap_or(t0) - t0 < Duration::from_millis(ms)
                && started.elapsed() < Duration::from_secs(10)
            {
                for _ in 0..10_000 {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            }
        }
        let group = ThreadGroup::default();
        let g = group.clone();
        let (burnt, done) = std::sync::mpsc::channel();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let busy = std::thread::spawn(move || {
            g.register_current();
            burn(60);
            let _ = burnt.send(());
            // Alive (and idle) while measured: a thread's time goes with it.
            let _ = stopped.recv_timeout(Duration::from_secs(30));
        });
        let _ = done.recv_timeout(Duration::from_secs(30));
        // This thread's own work is not the group's.
        burn(100);
        let Some(spent) = group.cpu() else {
            let _ = stop.send(());
            return; // not Linux
        };
        let _ = stop.send(());
        let _ = busy.join();
        assert!(spent >= Duration::from_millis(60), "{spent:?}");
        assert!(spent < Duration::from_millis(140), "{spent:?}");
    }
}
