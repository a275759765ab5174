//! CPU time from `/proc` (Linux; `None` elsewhere): of this whole process,
//! to put a cost on each request of a load run, and of the calling thread,
//! to time a tight loop.

use std::time::Duration;

/// Clock ticks per second of `/proc/<pid>/stat` (the kernel's `USER_HZ`, 100
/// on every Linux architecture this runs on; `sysconf(_SC_CLK_TCK)` would say
/// so, without the `libc` crate).
const TICKS_PER_SECOND: u64 = 100;

/// User + system time of this process so far, every thread included (exited
/// ones too): `utime` + `stime` of `/proc/self/stat` (fields 14 and 15), in
/// steps of 10 ms.
pub fn process() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(11); // field 3 is the first
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis(
        (utime + stime) * 1000 / TICKS_PER_SECOND,
    ))
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
        let mut x = 0u64;
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_millis(60) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let (p1, t1) = (process().unwrap(), thread().unwrap());
        assert!(t1 - t0 >= Duration::from_millis(30), "{:?}", t1 - t0);
        assert!(p1 >= p0);
        assert!(p1 - p0 <= Duration::from_secs(5));
    }
}
