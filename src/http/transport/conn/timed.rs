//! A client's stream with its connection's deadlines: the head's, the
//! idle keep-alive's, a stalled write's, and an eviction.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::shared::{ClientConn, Ended, Tally};

/// What a connection waits on its client for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The rest of a request head.
    Head,
    /// The first byte of the next request.
    Idle,
}

/// A client's stream with the connection's deadlines (module docs): a read
/// past its deadline, a write stalled too long, or an eviction fails with
/// `TimedOut`, and hyper closes the connection.
pub struct Timed {
    inner: TcpStream,
    tally: Arc<Tally>,
    conn: Arc<ClientConn>,
    phase: Phase,
    /// `conn.answers` when this stream last looked.
    seen_answers: u64,
    deadline: Pin<Box<Sleep>>,
    write_stall: Option<Pin<Box<Sleep>>>,
    evicted: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl Timed {
    pub(super) fn new(inner: TcpStream, tally: Arc<Tally>, conn: Arc<ClientConn>) -> Self {
        let deadline = tokio::time::Instant::now() + tally.settings.header_read_timeout;
        Self {
            inner,
            phase: Phase::Head,
            seen_answers: 0,
            deadline: Box::pin(tokio::time::sleep_until(deadline)),
            write_stall: None,
            evicted: Box::pin(conn.evict.clone().cancelled_owned()),
            tally,
            conn,
        }
    }

    fn wait(&mut self, phase: Phase, timeout: Duration) {
        self.phase = phase;
        self.deadline
            .as_mut()
            .reset(tokio::time::Instant::now() + timeout);
    }

    fn ended(&self, why: Ended) -> io::Error {
        self.tally.count(why);
        io::Error::new(io::ErrorKind::TimedOut, why.label())
    }
}

impl AsyncRead for Timed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.evicted.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                Ended::Evicted.label(),
            )));
        }
        this.conn.reader.register(cx.waker());
        let busy = this.conn.in_flight.load(Ordering::Relaxed) > 0;
        let answers = this.conn.answers.load(Ordering::Relaxed);
        if answers != this.seen_answers && !busy {
            // An answer went out: the connection waits for the next request.
            this.seen_answers = answers;
            this.conn
                .waiting_since
                .store(this.tally.now_ms(), Ordering::Relaxed);
            let idle = this.tally.settings.idle_timeout;
            this.wait(Phase::Idle, idle);
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if !busy && this.phase == Phase::Idle && buf.filled().len() > before {
                    let header = this.tally.settings.header_read_timeout;
                    this.wait(Phase::Head, header);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if !busy && this.deadline.as_mut().poll(cx).is_ready() => {
                Poll::Ready(Err(this.ended(match this.phase {
                    Phase::Head => Ended::HeaderTimeout,
                    Phase::Idle => Ended::IdleTimeout,
                })))
            }
            other => other,
        }
    }
}

impl Timed {
    /// A write's outcome, with the stall bound: pending writes may wait at
    /// most `idle_timeout` for the client to read.
    fn stalled<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending => {
                let idle = self.tally.settings.idle_timeout;
                let stall = self
                    .write_stall
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                if stall.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(self.ended(Ended::WriteStall)));
                }
                Poll::Pending
            }
            ready => {
                self.write_stall = None;
                ready
            }
        }
    }
}

impl AsyncWrite for Timed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.stalled(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.stalled(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.stalled(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
