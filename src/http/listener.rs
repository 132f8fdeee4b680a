//! The listener faces the internet: no client may slow, stop or restart it for the
//! others. Our own accept loop over hyper, because `axum::serve` has none of the knobs
//! this needs (tokio-rs/axum#3489): HTTP/1 only unless `http.http2`, and per connection:
//!
//! - a **head deadline** (`http.header_timeout`): from a connection's first byte of a
//!   request (or its accept) to the complete head. hyper's own header timeout also runs
//!   while a keep-alive connection waits, which would make it the idle timeout too;
//! - an **idle deadline** (`http.idle_timeout`): no byte read or written for that long;
//! - the body's deadline is the handler's (`http.body_timeout`, 408: `http::receive`);
//! - **caps** (`http.max_connections`, `http.max_connections_per_ip`, a client being an
//!   IPv4 address or an IPv6 /64, what one host usually holds): at a cap, the oldest
//!   connection that is not in a request (idle, or without a complete head) is closed
//!   to admit the new one; at the total cap with none such, the oldest connection still
//!   sending its body, of the client holding the most connections; else the new one is
//!   closed. A client that holds connections thus only ever displaces its own kind or
//!   its own slow bodies, and its cost is bounded to its own share.
//!
//! Senders retry what an outage refused all at once when it ends (the soak saw 5,000
//! connections within a second, about 20 KiB each in hyper): the caps bound that memory.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::config::HttpConfig;

/// Streams one HTTP/2 connection may carry at once (`http.http2 = true`).
const MAX_H2_STREAMS: u32 = 100;

/// What each connection is bounded by.
#[derive(Debug, Clone, Copy)]
struct Deadlines {
    header: Duration,
    idle: Duration,
}

/// Serves `routes` on `listener` until `shutdown` completes, then lets the requests in
/// progress finish (idle connections close at once).
pub async fn serve(
    listener: TcpListener,
    routes: Router,
    http: &HttpConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let registry = Arc::new(Registry::new(
        http.max_connections,
        http.max_connections_per_ip,
    ));
    let deadlines = Deadlines {
        header: http.header_timeout,
        idle: http.idle_timeout,
    };
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors (EMFILE) or a connection reset before accept:
                    // a short pause instead of a busy loop; the caps free descriptors.
                    tracing::warn!(error = %e, "cannot accept a connection; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(slot) = registry.admit(client_of(peer.ip())) else {
            metrics::counter!("http_connections_refused_total").increment(1);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(Tracked::new(stream, slot.conn.clone(), deadlines));
        let service = PerConnection {
            routes: routes.clone(),
            conn: slot.conn.clone(),
        };
        if http.http2 {
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(None)
                .keep_alive(true);
            builder
                .http2()
                .timer(TokioTimer::new())
                .max_concurrent_streams(MAX_H2_STREAMS);
            let conn = graceful.watch(builder.serve_connection(io, service).into_owned());
            tokio::spawn(async move {
                let _ = conn.await;
                drop(slot);
            });
        } else {
            let conn = graceful.watch(
                hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(None)
                    .keep_alive(true)
                    .serve_connection(io, service),
            );
            tokio::spawn(async move {
                let _ = conn.await;
                drop(slot);
            });
        }
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// The client a peer address counts as: an IPv4 address, or an IPv6 address's /64 (a
/// host is usually given a whole /64, so counting single addresses would let one host
/// open as many connections as it has addresses).
fn client_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let net = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(std::net::Ipv6Addr::from(net))
            }
        },
    }
}

/// Open connections, oldest first, and how many each client has.
struct Registry {
    max_total: usize,
    max_per_ip: usize,
    inner: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    next_id: u64,
    conns: BTreeMap<u64, (IpAddr, Arc<Conn>)>,
    per_ip: HashMap<IpAddr, usize>,
}

impl Open {
    fn remove(&mut self, id: u64) -> Option<Arc<Conn>> {
        let (ip, conn) = self.conns.remove(&id)?;
        if let Some(n) = self.per_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_ip.remove(&ip);
            }
        }
        Some(conn)
    }

    /// Closes the oldest connection (of `ip`, if given) that is not in a request.
    fn evict_oldest(&mut self, ip: Option<IpAddr>) -> bool {
        let victim = self
            .conns
            .iter()
            .find(|(_, (addr, c))| ip.is_none_or(|ip| ip == *addr) && c.is_evictable())
            .map(|(id, _)| *id);
        self.evict(victim)
    }

    /// Closes the oldest connection still sending its body, of the client holding the
    /// most connections that has one: a few clients' slow bodies cannot fill the
    /// listener, and no client loses a connection to another's.
    fn evict_slow_body(&mut self) -> bool {
        let mut clients: Vec<(usize, IpAddr)> =
            self.per_ip.iter().map(|(ip, n)| (*n, *ip)).collect();
        clients.sort_unstable_by(|a, b| b.cmp(a));
        for (_, ip) in clients {
            let victim = self
                .conns
                .iter()
                .find(|(_, (addr, c))| *addr == ip && c.is_receiving())
                .map(|(id, _)| *id);
            if victim.is_some() {
                return self.evict(victim);
            }
        }
        false
    }

    fn evict(&mut self, victim: Option<u64>) -> bool {
        match victim.and_then(|id| self.remove(id)) {
            Some(conn) => {
                conn.evict.cancel();
                metrics::counter!("http_connections_evicted_total").increment(1);
                true
            }
            None => false,
        }
    }
}

impl Registry {
    fn new(max_total: usize, max_per_ip: usize) -> Self {
        Self {
            max_total,
            max_per_ip,
            inner: Mutex::new(Open::default()),
        }
    }

    /// A place for a new connection from `ip`, made at a cap by closing the oldest
    /// connection that is not in a request; `None` when there is none to close.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let mut open = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if self.max_per_ip > 0
            && open.per_ip.get(&ip).copied().unwrap_or(0) >= self.max_per_ip
            && !open.evict_oldest(Some(ip))
        {
            return None;
        }
        if self.max_total > 0
            && open.conns.len() >= self.max_total
            && !open.evict_oldest(None)
            && !open.evict_slow_body()
        {
            return None;
        }
        let id = open.next_id;
        open.next_id += 1;
        let conn = Arc::new(Conn::default());
        open.conns.insert(id, (ip, conn.clone()));
        *open.per_ip.entry(ip).or_default() += 1;
        crate::observability::connection_opened();
        Some(Slot {
            registry: self.clone(),
            id,
            conn,
        })
    }
}

/// A connection's place in the registry, given back when its task ends.
struct Slot {
    registry: Arc<Registry>,
    id: u64,
    conn: Arc<Conn>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self
            .registry
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        open.remove(self.id);
        crate::observability::connection_closed();
    }
}

/// What the registry and the connection's I/O share with its requests.
#[derive(Default)]
struct Conn {
    /// Requests whose head arrived and whose response is not written yet.
    requests: AtomicUsize,
    /// Requests whose head arrived, ever: a change tells the I/O a head completed.
    heads: AtomicU64,
    /// Requests whose body is still arriving.
    receiving: AtomicUsize,
    /// Cancelled to close the connection (a cap needs its place).
    evict: CancellationToken,
}

impl Conn {
    fn is_evictable(&self) -> bool {
        self.requests.load(Ordering::Acquire) == 0
    }

    fn is_receiving(&self) -> bool {
        self.receiving.load(Ordering::Acquire) > 0
    }
}

/// The router for one connection, marking its requests in and out.
#[derive(Clone)]
struct PerConnection {
    routes: Router,
    conn: Arc<Conn>,
}

impl hyper::service::Service<hyper::Request<Incoming>> for PerConnection {
    type Response = axum::response::Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        self.conn.requests.fetch_add(1, Ordering::AcqRel);
        self.conn.heads.fetch_add(1, Ordering::AcqRel);
        let request =
            request.map(|body| axum::body::Body::new(Receiving::new(body, self.conn.clone())));
        let mut routes = self.routes.clone();
        let done = RequestDone(self.conn.clone());
        Box::pin(async move {
            let response = tower_service::Service::call(&mut routes, request).await;
            drop(done);
            response
        })
    }
}

/// A request's body, marking its connection as receiving one until its end arrives (or
/// it is dropped).
struct Receiving {
    body: Incoming,
    conn: Option<Arc<Conn>>,
}

impl Receiving {
    fn new(body: Incoming, conn: Arc<Conn>) -> Self {
        use hyper::body::Body as _;
        let conn = (!body.is_end_stream()).then(|| {
            conn.receiving.fetch_add(1, Ordering::AcqRel);
            conn
        });
        Self { body, conn }
    }

    fn done(&mut self) {
        if let Some(conn) = self.conn.take() {
            conn.receiving.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        self.done();
    }
}

impl hyper::body::Body for Receiving {
    type Data = hyper::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) || self.body.is_end_stream() {
            self.done();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// Marks a request finished however its future ends (answered, or dropped with the
/// connection).
struct RequestDone(Arc<Conn>);

impl Drop for RequestDone {
    fn drop(&mut self) {
        self.0.requests.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An accepted connection's I/O, failing reads and writes past its deadlines or once
/// evicted; hyper then closes the connection.
struct Tracked {
    stream: TcpStream,
    conn: Arc<Conn>,
    deadlines: Deadlines,
    /// When the current request head began (its first byte, or the accept), while one
    /// is awaited; `None` between a complete head and the next request's first byte.
    head_started: Option<Instant>,
    /// `conn.heads` when the current head began.
    heads_seen: u64,
    last_active: Instant,
    timer: Pin<Box<tokio::time::Sleep>>,
    timer_at: Instant,
    evicted: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl Tracked {
    fn new(stream: TcpStream, conn: Arc<Conn>, deadlines: Deadlines) -> Self {
        let now = Instant::now();
        let timer_at = now + deadlines.header;
        Self {
            stream,
            evicted: Box::pin(conn.evict.clone().cancelled_owned()),
            heads_seen: conn.heads.load(Ordering::Acquire),
            conn,
            deadlines,
            head_started: Some(now),
            last_active: now,
            timer: Box::pin(tokio::time::sleep_until(timer_at)),
            timer_at,
        }
    }

    /// A head completed since it began: no head deadline until the next request's
    /// first byte.
    fn settle_head(&mut self) {
        let heads = self.conn.heads.load(Ordering::Acquire);
        if heads != self.heads_seen {
            self.heads_seen = heads;
            self.head_started = None;
        }
    }

    fn deadline(&self) -> Instant {
        let idle = self.last_active + self.deadlines.idle;
        match self.head_started {
            Some(started) => (started + self.deadlines.header).min(idle),
            None => idle,
        }
    }

    fn read_some(&mut self) {
        let now = Instant::now();
        self.last_active = now;
        self.settle_head();
        if self.head_started.is_none() && self.conn.requests.load(Ordering::Acquire) == 0 {
            self.head_started = Some(now);
        }
    }

    /// What a pending read or write returns: still pending, or an error once a
    /// deadline passed or the connection was evicted.
    fn pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if self.evicted.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make room (http.max_connections / max_connections_per_ip)",
            )));
        }
        self.settle_head();
        let at = self.deadline();
        if at != self.timer_at {
            self.timer_at = at;
            self.timer.as_mut().reset(at);
        }
        match self.timer.as_mut().poll(cx) {
            Poll::Ready(()) => {
                let what = if self
                    .head_started
                    .is_some_and(|s| s + self.deadlines.header <= at)
                {
                    "request head not complete within http.header_timeout"
                } else {
                    "connection idle past http.idle_timeout"
                };
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, what)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Pending => self.pending(cx),
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.read_some();
                }
                Poll::Ready(Ok(()))
            }
            ready => ready,
        }
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.stream).poll_write(cx, buf) {
            Poll::Pending => self.pending(cx),
            ready => {
                self.last_active = Instant::now();
                ready
            }
        }
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
        match Pin::new(&mut self.stream).poll_write_vectored(cx, bufs) {
            Poll::Pending => self.pending(cx),
            ready => {
                self.last_active = Instant::now();
                ready
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
#[path = "listener_tests.rs"]
mod tests;
