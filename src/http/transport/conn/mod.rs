//! The connections: how many may be open, in all and per client address,
//! and how long each may wait on its client. A connection costs a file
//! descriptor and a task whether or not its client ever sends a request,
//! so without bounds a few hundred clients that connect and send nothing
//! (or half a header block, or nothing after an answer) take the service
//! down for everyone (`Too many open files`).
//!
//! The bounds, per connection ([`Timed`]), as Go's `http.Server` has them:
//! - **header read**: a request head must arrive whole within
//!   `header_read_timeout` of the connection's accept, or of the first byte
//!   after an answer (a client trickling its headers is closed);
//! - **idle**: a kept-alive connection waits at most `idle_timeout` for the
//!   next request's first byte;
//! - **write stall**: an answer whose client stops reading is dropped after
//!   `idle_timeout` without progress;
//! - while a request is handled, `REQUEST_TIMEOUT_MS` bounds it instead.
//!
//! And for all ([`Connections`]): at most `max_per_address` open from one
//! client address (the next is answered 503 and closed); at most `max_open`
//! in all. At that cap a new connection takes the place of the one that
//! has waited longest on its client, among those that never sent a whole
//! request first (silent, or still sending their first head), else among
//! the idle ones: a crowd of slow or idle connections never keeps a
//! well-behaved client (or a health check) out, and a buyer between two
//! requests is the last to go; only when every connection is busy with a
//! request is the newcomer answered 503.

mod shared;
mod timed;

use shared::Tally;
pub use shared::{Busy, ClientConn, Ended};
pub use timed::Timed;

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use atomic_waker::AtomicWaker;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::config::ConnectionSettings;

/// Connections told to give way and not closed yet, at most: beyond, a
/// newcomer is refused rather than the descriptors outgrowing the cap.
const MAX_EVICTING: usize = 64;
/// Refusals being answered at once, at most: beyond, a connection refused
/// is closed without an answer (each holds a descriptor while answered).
const MAX_REFUSING: usize = 64;

/// Every open connection of a listener, and the bounds.
pub struct Connections {
    /// The bounds, the clock and the counts each connection's stream shares.
    tally: Arc<Tally>,
    open: Mutex<Open>,
    /// Refusals being answered now.
    refusing: AtomicUsize,
    /// Told when a connection told to give way has closed.
    closed: tokio::sync::Notify,
}

#[derive(Default)]
struct Open {
    next_id: u64,
    all: HashMap<u64, Arc<ClientConn>>,
    per_address: HashMap<IpAddr, usize>,
    /// Connections in the order they were admitted, for those that never
    /// sent a whole request: the front one that still has not is the one
    /// that has waited longest (entries that left or were answered are
    /// dropped as they reach the front). A crowd at the cap turns over
    /// thousands of connections a second, so the choice must not read them
    /// all.
    fresh: VecDeque<Arc<ClientConn>>,
    /// Connections told to close, not closed yet (still counted in `all`).
    evicting: usize,
}

/// A connection's place among the open ones, given back when dropped.
pub struct Admitted {
    connections: Arc<Connections>,
    conn: Arc<ClientConn>,
}

impl Connections {
    pub fn new(settings: ConnectionSettings) -> Arc<Self> {
        Arc::new(Self {
            tally: Arc::new(Tally::new(settings)),
            open: Mutex::default(),
            refusing: AtomicUsize::new(0),
            closed: tokio::sync::Notify::new(),
        })
    }

    pub fn settings(&self) -> &ConnectionSettings {
        &self.tally.settings
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.lock().all.len()
    }

    /// Connections ended for `why` so far.
    pub fn ended(&self, why: Ended) -> u64 {
        self.tally.ended(why)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now_ms(&self) -> u64 {
        self.tally.now_ms()
    }

    /// Before the next accept: while [`MAX_EVICTING`] connections are
    /// closing to make room, waits (a few ms at most) for one to close, so
    /// that a burst of newcomers waits in the listen backlog rather than
    /// being refused.
    pub async fn room(&self) {
        if self.lock().evicting < MAX_EVICTING {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_millis(20), self.closed.notified()).await;
    }

    /// A place for a connection from `ip`, or why there is none.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Admitted, Ended> {
        let ip = ip.to_canonical();
        let mut open = self.lock();
        let from_ip = open.per_address.get(&ip).copied().unwrap_or(0);
        if self.settings().max_per_address > 0 && from_ip >= self.settings().max_per_address {
            drop(open);
            self.tally.count(Ended::RefusedAddress);
            return Err(Ended::RefusedAddress);
        }
        if open.all.len() - open.evicting >= self.settings().max_open {
            // The one that has waited longest on its client gives way: of
            // those that never sent a whole request first (a client between
            // two requests has proven itself), then of the idle ones. It
            // stays in the count until its task has closed it (at once), so
            // the descriptors open stay under the cap plus MAX_EVICTING.
            let victim = match open.evicting < MAX_EVICTING {
                true => open.longest_waiting(),
                false => None,
            };
            let Some(victim) = victim else {
                drop(open);
                self.tally.count(Ended::RefusedFull);
                return Err(Ended::RefusedFull);
            };
            victim.evicting.store(true, Ordering::Relaxed);
            open.evicting += 1;
            victim.evict.cancel();
            self.tally.count(Ended::Evicted);
        }
        open.next_id += 1;
        let conn = Arc::new(ClientConn {
            id: open.next_id,
            ip,
            in_flight: AtomicUsize::new(0),
            answers: AtomicU64::new(0),
            waiting_since: AtomicU64::new(self.now_ms()),
            evict: CancellationToken::new(),
            evicting: AtomicBool::new(false),
            reader: AtomicWaker::new(),
        });
        *open.per_address.entry(ip).or_default() += 1;
        open.all.insert(conn.id, conn.clone());
        open.fresh.push_back(conn.clone());
        if open.fresh.len() > 2 * open.all.len() + 64 {
            // Entries stuck behind a long first request: dropped now and then.
            let Open { all, fresh, .. } = &mut *open;
            fresh.retain(|c| all.contains_key(&c.id) && c.answers.load(Ordering::Relaxed) == 0);
        }
        drop(open);
        Ok(Admitted {
            connections: self.clone(),
            conn,
        })
    }
}

impl Open {
    /// The open connection that has waited longest on its client, not busy
    /// with a request: of those never answered (the front of `fresh`, a few
    /// looked at), else of all.
    fn longest_waiting(&mut self) -> Option<Arc<ClientConn>> {
        let gone_or_answered = |all: &HashMap<u64, Arc<ClientConn>>, c: &ClientConn| {
            !all.contains_key(&c.id)
                || c.answers.load(Ordering::Relaxed) > 0
                || c.evicting.load(Ordering::Relaxed)
        };
        while let Some(front) = self.fresh.front() {
            if !gone_or_answered(&self.all, front) {
                break;
            }
            self.fresh.pop_front();
        }
        let idle = |c: &&Arc<ClientConn>| {
            c.in_flight.load(Ordering::Relaxed) == 0 && !c.evicting.load(Ordering::Relaxed)
        };
        if let Some(c) = self
            .fresh
            .iter()
            .take(64)
            .filter(|c| !gone_or_answered(&self.all, c))
            .find(idle)
        {
            return Some(c.clone());
        }
        self.all
            .values()
            .filter(idle)
            .min_by_key(|c| {
                (
                    c.answers.load(Ordering::Relaxed) > 0,
                    c.waiting_since.load(Ordering::Relaxed),
                )
            })
            .cloned()
    }

    /// Takes `conn` out of the count, once.
    fn remove(&mut self, conn: &ClientConn) {
        if self.all.remove(&conn.id).is_none() {
            return;
        }
        if conn.evicting.load(Ordering::Relaxed) {
            self.evicting -= 1;
        }
        if let Some(n) = self.per_address.get_mut(&conn.ip) {
            *n -= 1;
            if *n == 0 {
                self.per_address.remove(&conn.ip);
            }
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.connections.lock().remove(&self.conn);
        if self.conn.evicting.load(Ordering::Relaxed) {
            self.connections.closed.notify_one();
        }
    }
}

impl Admitted {
    /// The stream, bounded in time.
    pub fn stream(&self, stream: TcpStream) -> Timed {
        Timed::new(stream, self.connections.tally.clone(), self.conn.clone())
    }

    /// What the service holds while it handles one request.
    pub fn conn(&self) -> &Arc<ClientConn> {
        &self.conn
    }
}

/// The answer to a connection refused at accept.
impl Connections {
    /// Answers `stream` 503 (if its socket takes the answer at once) and
    /// closes it, in a task of its own; beyond [`MAX_REFUSING`] at once,
    /// closes it without an answer. Never waits on the client for long.
    pub fn refuse(self: &Arc<Self>, stream: TcpStream, why: Ended) {
        if self.refusing.fetch_add(1, Ordering::Relaxed) >= MAX_REFUSING {
            self.refusing.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        let connections = self.clone();
        tokio::spawn(async move {
            answer_refused(stream, why).await;
            connections.refusing.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

async fn answer_refused(stream: TcpStream, why: Ended) {
    let message = match why {
        Ended::RefusedAddress => "too many open connections from this address; close some",
        _ => "the service is at its connection limit; retry shortly",
    };
    let body = format!(r#"{{"error":"overloaded","message":"{message}"}}"#);
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(answer.as_bytes());
    // Closing with the client's request unread would reset the connection
    // and could discard the answer: stop writing, read what came, briefly.
    let mut stream = stream;
    let _ = tokio::io::AsyncWriteExt::shutdown(&mut stream).await;
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(
        Duration::from_millis(100),
        tokio::io::AsyncReadExt::read(&mut stream, &mut sink),
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(max_open: usize, max_per_address: usize) -> ConnectionSettings {
        ConnectionSettings {
            header_read_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(60),
            max_open,
            max_per_address,
        }
    }

    #[test]
    fn an_address_gets_its_share_and_no_more() {
        let c = Connections::new(settings(100, 2));
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = c.admit(a).unwrap();
        let _second = c.admit(a).unwrap();
        assert_eq!(c.admit(a).err(), Some(Ended::RefusedAddress));
        assert!(c.admit(b).is_ok(), "another address is not held back");
        drop(first);
        assert!(
            c.admit(a).is_ok(),
            "a closed connection gives its place back"
        );
        assert_eq!(c.ended(Ended::RefusedAddress), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_cap_the_longest_waiting_connection_gives_way_and_busy_ones_stay() {
        let c = Connections::new(settings(2, 0));
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let oldest = c.admit(ip).unwrap();
        tokio::time::advance(Duration::from_millis(5)).await;
        let newer = c.admit(ip).unwrap();
        let third = c.admit(ip).unwrap();
        assert!(
            oldest.conn.evict.is_cancelled(),
            "the longest waiting gave way"
        );
        assert!(!newer.conn.evict.is_cancelled());
        assert_eq!(c.open(), 3, "counted until it has closed");
        drop(oldest);
        assert_eq!(c.open(), 2);
        // `newer` has waited longer than `third`, but between two requests:
        // one that was answered outlives one that never was.
        drop(newer.conn.busy());
        let fourth = c.admit(ip).unwrap();
        assert!(
            !newer.conn.evict.is_cancelled(),
            "a client between requests gave way"
        );
        assert!(third.conn.evict.is_cancelled());
        drop(third);
        // Every connection busy: the next is refused, nobody is evicted.
        let _busy = (newer.conn.busy(), fourth.conn.busy());
        assert_eq!(c.admit(ip).err(), Some(Ended::RefusedFull));
        assert_eq!(
            (c.ended(Ended::Evicted), c.ended(Ended::RefusedFull)),
            (2, 1)
        );
    }

    #[test]
    fn evictions_in_progress_are_bounded() {
        let c = Connections::new(settings(1, 0));
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let mut held = vec![c.admit(ip).unwrap()];
        for _ in 0..MAX_EVICTING {
            held.push(c.admit(ip).unwrap());
        }
        // Every one but the newest told to close, none closed yet.
        assert_eq!(c.admit(ip).err(), Some(Ended::RefusedFull));
        assert_eq!(c.open(), MAX_EVICTING + 1);
        held.remove(0);
        assert!(c.admit(ip).is_ok(), "a closed one makes room");
    }
}
