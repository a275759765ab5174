//! What one connection and its stream share with the open ones: the
//! connection itself, why connections end, and the bounds and counts.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use atomic_waker::AtomicWaker;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::ConnectionSettings;

/// Why a connection ended before its client was done, or never started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    HeaderTimeout,
    IdleTimeout,
    WriteStall,
    /// Gave its place to a newcomer at the cap.
    Evicted,
    /// Refused at accept: the process is at its cap with every connection busy.
    RefusedFull,
    /// Refused at accept: its address is at its cap.
    RefusedAddress,
}

impl Ended {
    pub const ALL: [Self; 6] = [
        Self::HeaderTimeout,
        Self::IdleTimeout,
        Self::WriteStall,
        Self::Evicted,
        Self::RefusedFull,
        Self::RefusedAddress,
    ];

    /// The metric's label.
    pub fn label(self) -> &'static str {
        match self {
            Self::HeaderTimeout => "header_timeout",
            Self::IdleTimeout => "idle_timeout",
            Self::WriteStall => "write_stall",
            Self::Evicted => "evicted",
            Self::RefusedFull => "refused_full",
            Self::RefusedAddress => "refused_address",
        }
    }
}

/// One connection as the open ones (`Connections`) and its stream (`Timed`) share it.
pub struct ClientConn {
    pub(super) id: u64,
    pub(super) ip: IpAddr,
    /// Requests being handled (the service counts them).
    pub(super) in_flight: AtomicUsize,
    /// Answers given so far: a change tells the stream an answer went out.
    pub(super) answers: AtomicU64,
    /// When it began waiting on its client (ms since the epoch), while not busy.
    pub(super) waiting_since: AtomicU64,
    pub(super) evict: CancellationToken,
    /// Chosen to give way; closing.
    pub(super) evicting: AtomicBool,
    /// The connection's task, woken when an answer is given: hyper reads
    /// again only when woken, and the idle deadline starts on that read.
    pub(super) reader: AtomicWaker,
}

impl ClientConn {
    /// Marks a request as being handled until the guard is dropped (its
    /// answer given).
    pub fn busy(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Busy(self.clone())
    }
}

/// A request being handled on a connection.
pub struct Busy(Arc<ClientConn>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.answers.fetch_add(1, Ordering::Relaxed);
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.reader.wake();
    }
}

/// What every connection's stream shares with the open ones: the bounds,
/// the clock `Conn::waiting_since` counts from, and why connections ended.
pub(super) struct Tally {
    pub(super) settings: ConnectionSettings,
    epoch: Instant,
    ended: [AtomicU64; Ended::ALL.len()],
}

impl Tally {
    pub(super) fn new(settings: ConnectionSettings) -> Self {
        Self {
            settings,
            epoch: Instant::now(),
            ended: Default::default(),
        }
    }

    pub(super) fn ended(&self, why: Ended) -> u64 {
        self.ended[why as usize].load(Ordering::Relaxed)
    }

    pub(super) fn count(&self, why: Ended) {
        self.ended[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}
