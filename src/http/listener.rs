//! The listener: at most `http.max_connections` connections open at once. Past that
//! the next one waits in the kernel's accept queue (no memory of ours) until one
//! closes. Senders retry every delivery a database outage refused, all at once when it
//! ends; the soak saw 5,000 connections open within a second and RSS go from 27 to
//! 122 MiB (about 20 KiB a connection in hyper), so this, not `max_in_flight`, is what
//! bounds the memory of a retry storm. (axum has no such limit yet: tokio-rs/axum#3489.)
//!
//! A bound on connections needs a bound on idleness: a client that opens connections and
//! sends nothing would otherwise hold every place for good (axum runs hyper without a
//! timer, so hyper's own header timeout is off), and the systemd watchdog, which asks
//! `/healthz` through this listener, would then restart the daemon. A connection with no
//! bytes read or written for `http.idle_timeout` is closed.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A TCP listener that accepts only while fewer than its limit of connections are open.
pub struct Limited {
    inner: TcpListener,
    open: Arc<Semaphore>,
    idle_timeout: Duration,
}

impl Limited {
    pub fn new(inner: TcpListener, max_connections: usize, idle_timeout: Duration) -> Self {
        Self {
            inner,
            open: Arc::new(Semaphore::new(max_connections)),
            idle_timeout,
        }
    }
}

impl axum::serve::Listener for Limited {
    type Io = Counted;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        // The semaphore is never closed, so this waits until a connection ends.
        let permit = loop {
            if let Ok(p) = self.open.clone().acquire_owned().await {
                break p;
            }
        };
        let (stream, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        crate::observability::connection_opened();
        (
            Counted {
                stream,
                _permit: permit,
                idle_timeout: self.idle_timeout,
                idle: Box::pin(tokio::time::sleep(self.idle_timeout)),
            },
            addr,
        )
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// An accepted connection; its slot is given back when hyper drops it.
pub struct Counted {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    idle_timeout: Duration,
    /// Fires `idle_timeout` after the last byte read or written.
    idle: Pin<Box<tokio::time::Sleep>>,
}

impl Counted {
    fn active(&mut self) {
        let deadline = tokio::time::Instant::now() + self.idle_timeout;
        self.idle.as_mut().reset(deadline);
    }

    /// What a pending read or write returns: still pending, or the idle error once the
    /// deadline has passed (hyper then closes the connection).
    fn pending_or_idle<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match self.idle.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection idle past http.idle_timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn track<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending => self.pending_or_idle(cx),
            ready => {
                self.active();
                ready
            }
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        crate::observability::connection_closed();
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        self.track(cx, polled)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.track(cx, polled)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.track(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
