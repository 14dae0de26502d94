//! Serving a router on a listener so that no peer can hold the listener.
//!
//! The webhook, metrics and health listeners share these bounds:
//! - accepting never waits: each connection does its TLS handshake in a task
//!   of its own, within [`Limits::handshake`];
//! - at most [`Limits::max_connections`] are open at once. Past that, the
//!   oldest connection that has not yet sent a request is closed to make
//!   room (a silent socket is what a peer holds cheaply; the API server's
//!   pooled connections have sent requests); when every open connection
//!   has, the new one is closed at once;
//! - HTTP/1 request headers must arrive within [`Limits::header_read`]
//!   (hyper's timer, which also bounds a kept-alive connection's wait for
//!   its next request);
//! - a request, its body included, is answered within [`Limits::request`],
//!   with 408 if the router has not answered by then;
//! - a connection with no request in flight for [`Limits::idle`] is shut down
//!   gracefully: this covers HTTP/2, which has no header timeout, and the
//!   moment before the protocol is known;
//! - HTTP/2 allows [`Limits::max_streams`] concurrent streams and header
//!   lists of [`MAX_HEADER_BYTES`], and pings find dead peers.
//!
//! Stopping closes the socket, shuts every connection down gracefully and
//! waits for them for at most `drain`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::IntoResponse;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{sleep, sleep_until, timeout};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::{debug, info, warn};

/// The largest HTTP/2 header list, and HTTP/1 read buffer, accepted.
pub const MAX_HEADER_BYTES: u32 = 64 * 1024;

/// How long a peer may take at each step.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub handshake: Duration,
    pub header_read: Duration,
    pub request: Duration,
    pub idle: Duration,
    pub max_streams: u32,
}

impl Limits {
    /// The listeners' bounds. The API server gives a webhook call at most
    /// 30 s (10 s by default), so a request that takes longer is of no use
    /// to it; its connections are pooled, so 256 leave ample room.
    pub const SERVING: Limits = Limits {
        max_connections: 256,
        handshake: Duration::from_secs(5),
        header_read: Duration::from_secs(10),
        request: Duration::from_secs(30),
        idle: Duration::from_secs(90),
        max_streams: 64,
    };
}

/// Serves `router` on `tcp` (behind TLS when `tls` is given) until `stop`
/// turns true, then drains the open connections for at most `drain`.
pub async fn serve(
    name: &'static str,
    tcp: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    router: Router,
    mut stop: watch::Receiver<bool>,
    limits: Limits,
    drain: Duration,
) {
    let acceptor = tls.map(TlsAcceptor::from);
    let registry = Arc::new(Registry::new(limits.max_connections));
    let mut connections = JoinSet::new();
    loop {
        let (stream, peer) = tokio::select! {
            () = stopped(&mut stop) => break,
            Some(_) = connections.join_next() => continue,
            accepted = tcp.accept() => match accepted {
                Ok(connection) => connection,
                Err(e) => {
                    // Out of file descriptors and the like: wait, then retry.
                    warn!(listener = name, "accepting a connection: {e}");
                    sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Some(ticket) = registry.admit(name) else {
            continue;
        };
        // Without it, a response written in two pieces waits for the
        // client's delayed ACK: about 40 ms per request.
        if let Err(e) = stream.set_nodelay(true) {
            debug!(%peer, "setting TCP_NODELAY: {e}");
        }
        connections.spawn(connection(
            stream,
            peer,
            acceptor.clone(),
            router.clone(),
            limits,
            ticket,
            stop.clone(),
        ));
    }
    drop(tcp);
    let drained = timeout(drain, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        warn!(
            listener = name,
            "{} connections still open after {drain:?}, stopping anyway",
            connections.len()
        );
    }
    info!(listener = name, "stopped");
}

/// Resolves once `stop` turns true, or its sender is gone.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The guard wait_for returns is not Send: drop it here.
    let _ = stop.wait_for(|stop| *stop).await.is_ok();
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    acceptor: Option<TlsAcceptor>,
    router: Router,
    limits: Limits,
    ticket: Ticket,
    stop: watch::Receiver<bool>,
) {
    let ticket = Arc::new(ticket);
    match acceptor {
        None => http(stream, router, limits, ticket, stop).await,
        Some(acceptor) => {
            let handshake = tokio::select! {
                () = ticket.evicted.cancelled() => return,
                shaken = timeout(limits.handshake, acceptor.accept(stream)) => shaken,
            };
            match handshake {
                Ok(Ok(tls)) => http(tls, router, limits, ticket, stop).await,
                Ok(Err(e)) => debug!(%peer, "TLS handshake failed: {e}"),
                Err(_) => debug!(%peer, "TLS handshake timed out"),
            }
        }
    }
}

async fn http<IO>(
    io: IO,
    router: Router,
    limits: Limits,
    ticket: Arc<Ticket>,
    mut stop: watch::Receiver<bool>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let service = {
        let (activity, ticket) = (activity.clone(), ticket.clone());
        service_fn(move |request: Request<Incoming>| {
            let active = activity.begin();
            ticket.prove();
            let router = router.clone();
            async move {
                let answered = timeout(limits.request, router.oneshot(request.map(Body::new)));
                let response = match answered.await {
                    Ok(Ok(response)) => response,
                    Ok(Err(never)) => match never {},
                    Err(_) => (
                        StatusCode::REQUEST_TIMEOUT,
                        format!("no answer within {:?}\n", limits.request),
                    )
                        .into_response(),
                };
                drop(active);
                Ok::<_, Infallible>(response)
            }
        })
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read)
        .max_buf_size(MAX_HEADER_BYTES as usize);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams)
        .max_header_list_size(MAX_HEADER_BYTES)
        .keep_alive_interval(limits.idle / 3)
        .keep_alive_timeout(Duration::from_secs(10));
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    // Once shutting down, the connection gets `limits.request` to finish.
    let mut closing: Option<tokio::time::Instant> = None;
    let mut idle_check = tokio::time::Instant::now() + limits.idle;
    loop {
        tokio::select! {
            served = conn.as_mut() => {
                if let Err(e) = served {
                    debug!("connection ended: {e}");
                }
                return;
            }
            () = ticket.evicted.cancelled() => return,
            () = stopped(&mut stop), if closing.is_none() => {
                conn.as_mut().graceful_shutdown();
                closing = Some(tokio::time::Instant::now() + limits.request);
            }
            () = sleep_until(idle_check), if closing.is_none() => {
                match activity.idle_for() {
                    Some(idle) if idle >= limits.idle => {
                        conn.as_mut().graceful_shutdown();
                        closing = Some(tokio::time::Instant::now() + limits.request);
                    }
                    Some(idle) => idle_check = tokio::time::Instant::now() + (limits.idle - idle),
                    None => idle_check = tokio::time::Instant::now() + limits.idle,
                }
            }
            () = sleep_until(closing.unwrap_or(idle_check)), if closing.is_some() => return,
        }
    }
}

/// Requests in flight on one connection, and when the last one ended.
struct Activity {
    in_flight: AtomicUsize,
    since: Mutex<Instant>,
}

impl Activity {
    fn new() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            since: Mutex::new(Instant::now()),
        }
    }

    fn begin(self: &Arc<Self>) -> Active {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        Active(self.clone())
    }

    /// How long no request has been in flight; None while one is.
    fn idle_for(&self) -> Option<Duration> {
        (self.in_flight.load(Ordering::SeqCst) == 0).then(|| self.since().elapsed())
    }

    fn since(&self) -> std::sync::MutexGuard<'_, Instant> {
        self.since.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A request in flight; its drop marks the connection's last activity.
struct Active(Arc<Activity>);

impl Drop for Active {
    fn drop(&mut self) {
        *self.0.since() = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The open connections of a listener, and which of them have not yet sent
/// a request (those may be closed to make room).
struct Registry {
    max: usize,
    slots: Mutex<Slots>,
}

struct Slots {
    open: usize,
    next: u64,
    unproven: BTreeMap<u64, CancellationToken>,
    warned: Option<Instant>,
}

/// One admitted connection; dropping it frees its slot.
struct Ticket {
    registry: Arc<Registry>,
    id: u64,
    evicted: CancellationToken,
}

impl Registry {
    fn new(max: usize) -> Self {
        Self {
            max,
            slots: Mutex::new(Slots {
                open: 0,
                next: 0,
                unproven: BTreeMap::new(),
                warned: None,
            }),
        }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a new connection, closing the oldest silent one when all
    /// are taken; None when every open connection has sent a request.
    fn admit(self: &Arc<Self>, listener: &'static str) -> Option<Ticket> {
        let mut slots = self.slots();
        if slots.open >= self.max {
            match slots.unproven.pop_first() {
                // Its slot is freed when its task sees the cancellation.
                Some((_, oldest)) => oldest.cancel(),
                None => {
                    // One warning per minute under a flood, not one per connection.
                    if slots
                        .warned
                        .is_none_or(|at| at.elapsed() > Duration::from_secs(60))
                    {
                        warn!(
                            listener,
                            max = self.max,
                            "every connection slot is taken by a connection in use; refusing new ones"
                        );
                        slots.warned = Some(Instant::now());
                    }
                    return None;
                }
            }
        }
        slots.open += 1;
        slots.next += 1;
        let (id, evicted) = (slots.next, CancellationToken::new());
        slots.unproven.insert(id, evicted.clone());
        Some(Ticket {
            registry: self.clone(),
            id,
            evicted,
        })
    }
}

impl Ticket {
    /// The connection sent a request: it is no longer closed to make room.
    fn prove(&self) {
        self.registry.slots().unproven.remove(&self.id);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut slots = self.registry.slots();
        slots.open -= 1;
        slots.unproven.remove(&self.id);
    }
}

#[cfg(test)]
mod tests;
