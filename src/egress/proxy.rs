//! One command's proxy: HTTP/1.1 (hyper) on its Unix socket, each
//! request a CONNECT tunnel or a plain-HTTP request in absolute form.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt as _, Empty, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use portcullis_policy::egress::{Egress as AllowList, normalize_name, parse_address};
use portcullis_store::{Decision, Kind, Record, Status};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpStream, UnixListener};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::{CommandLink, Egress};

/// How long a name's resolution, an upstream connect, a request head or
/// a ClientHello may take.
pub(super) const TIMEOUT: Duration = Duration::from_secs(10);
/// Connections of one command at once; more are closed at once.
const MAX_CONNECTIONS: usize = 256;
/// A ClientHello longer than this is not read on.
const MAX_CLIENT_HELLO: usize = 64 << 10;

type Body = BoxBody<Bytes, hyper::Error>;

pub(super) struct Context {
    pub egress: Arc<Egress>,
    pub rules: Arc<AllowList>,
    pub command: CommandLink,
    pub stop: CancellationToken,
}

pub(super) async fn accept(listener: UnixListener, cx: Arc<Context>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = tokio::select! {
            () = cx.stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of descriptors, say: wait rather than spin.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let cx = cx.clone();
        tokio::spawn(async move {
            let service = service_fn(|request| handle(cx.clone(), request));
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            tokio::select! {
                _ = connection => {}
                () = cx.stop.cancelled() => {}
            }
            drop(permit);
        });
    }
}

async fn handle(
    cx: Arc<Context>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    Ok(match request.method() == Method::CONNECT {
        true => tunnel(cx, request).await,
        false => forward(cx, request).await,
    })
}

/// `CONNECT host:port`: decided and connected, answered 200, then the
/// client's ClientHello must name `host` before a byte goes upstream.
async fn tunnel(cx: Arc<Context>, request: Request<Incoming>) -> Response<Body> {
    let Some(authority) = request.uri().authority().cloned() else {
        return answer(StatusCode::BAD_REQUEST, "CONNECT needs host:port");
    };
    let host = authority.host().to_string();
    let port = authority.port_u16().unwrap_or(443);
    let opened = match open(&cx, "egress.connect", &host, port).await {
        Ok(opened) => opened,
        Err(refused) => return refused,
    };
    tokio::spawn(async move {
        let upgraded = match hyper::upgrade::on(request).await {
            Ok(upgraded) => upgraded,
            Err(e) => return opened.close(&cx, Err(format!("the tunnel: {e}"))).await,
        };
        carry(&cx, TokioIo::new(upgraded), opened, &host).await;
    });
    Response::new(empty())
}

async fn carry(
    cx: &Context,
    mut client: TokioIo<hyper::upgrade::Upgraded>,
    mut opened: Opened,
    host: &str,
) {
    let hello = tokio::time::timeout(TIMEOUT, client_hello(&mut client)).await;
    let hello = match hello {
        Ok(Ok(hello)) => hello,
        Ok(Err(why)) => return opened.refuse_late(cx, why).await,
        Err(_) => {
            return opened
                .refuse_late(cx, "no TLS ClientHello within 10 s".into())
                .await;
        }
    };
    let sni_fits = match &hello.server_name {
        Some(name) => normalize_name(name) == normalize_name(host),
        // Without SNI only a tunnel to an address literal is plain.
        None => parse_address(host).is_some(),
    };
    if !sni_fits {
        let said = hello.server_name.as_deref().unwrap_or("no name");
        let why = format!("the TLS server name ({said}) is not the CONNECT host ({host})");
        return opened.refuse_late(cx, why).await;
    }
    let copied = async {
        opened.upstream.write_all(&hello.bytes).await?;
        tokio::io::copy_bidirectional(&mut client, &mut opened.upstream).await
    };
    let outcome = tokio::select! {
        copied = copied => copied.map(|_| ()).map_err(|e| e.to_string()),
        () = cx.stop.cancelled() => Err("the command ended".to_string()),
    };
    opened.close(cx, outcome).await;
}

/// A plain-HTTP request in absolute form (`GET http://host/path`),
/// decided, connected and sent on with its path only.
async fn forward(cx: Arc<Context>, mut request: Request<Incoming>) -> Response<Body> {
    let uri = request.uri().clone();
    if uri.scheme_str() != Some("http") {
        return answer(
            StatusCode::BAD_REQUEST,
            "the proxy takes absolute http:// URLs and CONNECT (for https)",
        );
    }
    let Some(authority) = uri.authority() else {
        return answer(StatusCode::BAD_REQUEST, "the URL has no host");
    };
    let (host, port) = (
        authority.host().to_string(),
        authority.port_u16().unwrap_or(80),
    );
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let Ok(path) = path.parse() else {
        return answer(StatusCode::BAD_REQUEST, "the URL's path is not valid");
    };
    let opened = match open(&cx, "egress.http", &host, port).await {
        Ok(opened) => opened,
        Err(refused) => return refused,
    };
    let Opened {
        upstream,
        end,
        tally,
    } = opened;
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await {
            Ok(pair) => pair,
            Err(e) => {
                let why = format!("{host}:{port}: {e}");
                close(&cx, end, &tally, Err(why.clone())).await;
                return answer(StatusCode::BAD_GATEWAY, &why);
            }
        };
    let stop = cx.stop.clone();
    let closing = cx.clone();
    tokio::spawn(async move {
        let outcome = tokio::select! {
            done = connection => done.map_err(|e| e.to_string()),
            () = stop.cancelled() => Err("the command ended".to_string()),
        };
        close(&closing, end, &tally, outcome).await;
    });
    *request.uri_mut() = path;
    let headers = request.headers_mut();
    for hop in [
        "proxy-authorization",
        "proxy-connection",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
    ] {
        headers.remove(hop);
    }
    if let Ok(value) = HeaderValue::from_str(authority.as_str()) {
        headers.insert(header::HOST, value);
    }
    match sender.send_request(request).await {
        Ok(response) => response.map(http_body_util::BodyExt::boxed),
        Err(e) => answer(StatusCode::BAD_GATEWAY, &format!("{host}:{port}: {e}")),
    }
}

/// An upstream connection, made after its `egress_start` entry was
/// durable; `end` is its closing entry, to be completed.
struct Opened {
    upstream: Counted<TcpStream>,
    end: Record,
    tally: Arc<Tally>,
}

/// Writes a connection's closing entry: the bytes each way (counted on
/// the upstream connection: `bytes_out` sent to the destination,
/// `bytes_in` received from it) and how it ended.
async fn close(cx: &Context, mut end: Record, tally: &Tally, outcome: Result<(), String>) {
    end.completed_at = Some(jiff::Timestamp::now().to_string());
    end.bytes_in = tally.read.load(Ordering::Relaxed);
    end.bytes_out = tally.written.load(Ordering::Relaxed);
    match outcome {
        Ok(()) => end.status = Some(Status::Succeeded),
        Err(why) => {
            end.status = Some(Status::Failed);
            end.detail = Some(match end.detail.take() {
                Some(detail) => format!("{detail}; {why}"),
                None => why,
            });
        }
    }
    append(cx, end).await;
}

impl Opened {
    async fn close(self, cx: &Context, outcome: Result<(), String>) {
        let Opened {
            upstream,
            end,
            tally,
        } = self;
        drop(upstream);
        close(cx, end, &tally, outcome).await;
    }

    /// Closes a tunnel the proxy will not carry after all (what the
    /// client sent is not TLS, or names another server).
    async fn refuse_late(mut self, cx: &Context, why: String) {
        self.end.decision = Some(Decision::Blocked);
        self.end.error_code = Some("egress_refused".into());
        self.close(cx, Err(why)).await;
    }
}

/// Decides, resolves and connects `host:port` for `method`, with its
/// entries; a refusal comes back as the answer to give.
async fn open(cx: &Context, method: &str, host: &str, port: u16) -> Result<Opened, Response<Body>> {
    let destination = format!("{host}:{port}");
    let mut record = cx
        .egress
        .record(Kind::Egress, &cx.command, method, destination);
    let rule = match cx.rules.allows(host, port) {
        Ok(entry) => entry.text.clone(),
        Err(refusal) => {
            return Err(refuse(cx, record, StatusCode::FORBIDDEN, refusal.to_string()).await);
        }
    };
    record.rule = Some(rule);
    record.decision = Some(Decision::Allowed);
    let resolved = match (parse_address(host), normalize_name(host)) {
        (Some(addr), _) => vec![addr],
        (None, Some(name)) => match cx.egress.resolve(&name, port).await {
            Ok(addrs) => addrs,
            Err(why) => return Err(refuse(cx, record, StatusCode::BAD_GATEWAY, why).await),
        },
        (None, None) => return Err(answer(StatusCode::BAD_REQUEST, "not a host name")),
    };
    let usable = match cx.rules.usable(host, port, &resolved) {
        Ok(usable) => usable,
        Err(refusal) => {
            record.decision = Some(Decision::Blocked);
            return Err(refuse(cx, record, StatusCode::FORBIDDEN, refusal.to_string()).await);
        }
    };
    let mut start = record.clone();
    start.kind = Kind::EgressStart;
    if let Err(e) = cx.egress.audit.append(start).await {
        tracing::error!("audit: {e}");
        return Err(answer(
            StatusCode::SERVICE_UNAVAILABLE,
            "the audit log is unavailable; nothing was connected",
        ));
    }
    let mut last_error = String::from("no address");
    for addr in usable {
        let target = SocketAddr::new(addr, port);
        match tokio::time::timeout(TIMEOUT, TcpStream::connect(target)).await {
            Ok(Ok(stream)) => {
                record.detail = Some(format!("connected to {target}"));
                let tally = Arc::new(Tally::default());
                return Ok(Opened {
                    upstream: Counted {
                        inner: stream,
                        tally: tally.clone(),
                    },
                    end: record,
                    tally,
                });
            }
            Ok(Err(e)) => last_error = format!("{target}: {e}"),
            Err(_) => last_error = format!("{target}: no answer within 10 s"),
        }
    }
    record.error_code = Some("egress_unreachable".into());
    close(cx, record, &Tally::default(), Err(last_error.clone())).await;
    Err(answer(StatusCode::BAD_GATEWAY, &last_error))
}

/// Records a connection that was not made (durable before the answer).
async fn refuse(
    cx: &Context,
    mut record: Record,
    status: StatusCode,
    why: String,
) -> Response<Body> {
    record.completed_at = Some(jiff::Timestamp::now().to_string());
    record.status = Some(Status::Failed);
    if record.decision.is_none() {
        record.decision = Some(Decision::Blocked);
    }
    record.error_code = Some(match status {
        StatusCode::FORBIDDEN => "egress_refused".into(),
        _ => "egress_unreachable".into(),
    });
    record.detail = Some(why.clone());
    append(cx, record).await;
    answer(status, &why)
}

async fn append(cx: &Context, record: Record) {
    if let Err(e) = cx.egress.audit.append(record).await {
        tracing::error!("audit: {e}");
    }
}

fn answer(status: StatusCode, message: &str) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(format!("portcullis egress proxy: {message}\n")))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response
}

fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// The first bytes of a tunnel, and the server name their ClientHello
/// asks for.
struct Hello {
    bytes: Vec<u8>,
    server_name: Option<String>,
}

/// Reads until a whole TLS ClientHello has arrived (rustls parses it).
async fn client_hello(client: &mut (impl AsyncRead + Unpin)) -> Result<Hello, String> {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = client.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the client closed the tunnel before a TLS ClientHello".into());
        }
        bytes.extend_from_slice(&buf[..n]);
        if bytes.len() > MAX_CLIENT_HELLO {
            return Err("the ClientHello is too long".into());
        }
        let mut fresh = &buf[..n];
        while !fresh.is_empty() {
            acceptor
                .read_tls(&mut fresh)
                .map_err(|e| format!("not TLS: {e}"))?;
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => {
                let server_name = accepted.client_hello().server_name().map(str::to_string);
                return Ok(Hello { bytes, server_name });
            }
            Ok(None) => continue,
            Err((e, _)) => return Err(format!("not a TLS ClientHello: {e}")),
        }
    }
}

/// Bytes read from and written to an upstream connection.
#[derive(Default, Debug)]
struct Tally {
    read: AtomicU64,
    written: AtomicU64,
}

/// An upstream connection that counts its bytes.
struct Counted<S> {
    inner: S,
    tally: Arc<Tally>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = (buf.filled().len() - before) as u64;
        self.tally.read.fetch_add(read, Ordering::Relaxed);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            self.tally.written.fetch_add(*n as u64, Ordering::Relaxed);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
