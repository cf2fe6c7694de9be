//! The admin socket: HTTP/1.1 with JSON over a Unix socket, for operators
//! and their scripts (`curl --unix-socket`). Mode 0660; a connecting peer
//! must be root, or share the socket's owner uid or group gid, and must
//! not be in a sandboxed command's namespaces (see `foreign_namespace`).
//!
//! | method | path | does |
//! |---|---|---|
//! | GET | /v1/status | instance, version, policy generation, paused and how (`pause`: off, soft, stop), session count, whether the audit log writes |
//! | GET | /v1/metrics | Prometheus text metrics (`server/metrics.rs`) |
//! | GET | /v1/sessions | the live sessions |
//! | DELETE | /v1/sessions/ID | closes one session |
//! | POST | /v1/policy/reload | reloads the policy file (an invalid one is kept out) |
//! | POST | /v1/pause[?soft], /v1/resume | the emergency stop (or with `soft`, refuse new requests only); persists across restarts |
//! | GET | /v1/audit?FILTERS | audit entries, newest first (see `audit_filter`) |
//! | GET | /v1/audit/verify[?kept=SEQ:HEAD] | recompute the hash chain (and check a checkpoint kept elsewhere) |
//! | GET | /v1/audit/checkpoint | the newest signed checkpoint |
//! | GET | /v1/audit/SEQ | one entry |
//! | GET | /v1/audit/after/SEQ | up to 1,000 entries after SEQ, oldest first |
//! | GET | /v1/audit/export | the whole log as JSON Lines (see `AuditLog::export`), streamed |
//! | POST | /v1/audit/prune?before=TIME | removes older entries, leaving a signed marker |
//! | GET | /v1/approvals | tool calls waiting for an operator |
//! | POST | /v1/approvals/ID/approve, /v1/approvals/ID/deny | decides one (as the peer's uid) |
//!
//! Reading the log scans sled, so those handlers run on the blocking pool:
//! a long `verify` never holds up a session's worker thread.

use std::convert::Infallible;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::UnixListener;
use tracing::{info, warn};

use crate::provider::Pause;
use crate::server::Gateway;
use portcullis_store::Health;

/// Binds the admin socket (replacing a stale one) with mode 0660.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    bind_socket(path, 0o660)
}

/// Binds a Unix socket at `path` (its directory made, a stale socket
/// replaced) with `mode`.
pub(crate) fn bind_socket(path: &Path, mode: u32) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
}

pub async fn serve(gateway: Arc<Gateway>, listener: UnixListener) {
    let path = gateway.config.admin_socket.clone();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
            () = gateway.shutdown.cancelled() => break,
        };
        let owner = std::fs::metadata(&path).map(|m| (m.uid(), m.gid())).ok();
        let allowed = match (stream.peer_cred(), owner) {
            (Ok(peer), Some((uid, gid))) => {
                peer.uid() == 0 || peer.uid() == uid || peer.gid() == gid
            }
            _ => false,
        };
        if !allowed {
            warn!(peer = ?stream.peer_cred().ok(), "admin socket: peer refused");
            continue;
        }
        let pid = stream.peer_cred().ok().and_then(|peer| peer.pid());
        if let Some(namespace) = pid.and_then(foreign_namespace) {
            warn!(
                ?pid,
                namespace, "admin socket: refused a peer in a sandbox's namespace"
            );
            continue;
        }
        let gateway = gateway.clone();
        let peer_uid = stream.peer_cred().map(|c| c.uid()).unwrap_or(u32::MAX);
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let gateway = gateway.clone();
                async move { Ok::<_, Infallible>(route(&gateway, request, peer_uid).await) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
    let _ = std::fs::remove_file(&path);
}

/// Which namespace of the peer `pid` is not the daemon's, if any: a
/// command runs in user, PID and mount namespaces of its own (and cannot
/// see this socket there). A second layer: a peer whose namespaces cannot
/// be read is another, more privileged user (a command runs as the
/// daemon's own uid, whose entries the daemon can always read), and is
/// judged by the owner check alone.
pub(crate) fn foreign_namespace(pid: i32) -> Option<&'static str> {
    ["user", "pid", "mnt"].into_iter().find(|namespace| {
        let of = |who: &str| std::fs::read_link(format!("/proc/{who}/ns/{namespace}")).ok();
        matches!((of("self"), of(&pid.to_string())), (Some(own), Some(peer)) if own != peer)
    })
}

async fn route(gateway: &Gateway, request: Request<Incoming>, peer_uid: u32) -> Response<Body> {
    let path = request.uri().path().to_string();
    match (request.method(), path.as_str()) {
        (&Method::GET, "/v1/metrics") => {
            crate::server::metrics::response(gateway).map(|body| body.boxed_unsync())
        }
        (&Method::GET, "/v1/status") => {
            let policy = gateway.current_policy();
            reply(
                StatusCode::OK,
                json!({
                    "instance_id": gateway.instance_id,
                    "version": env!("CARGO_PKG_VERSION"),
                    "provider_id": gateway.config.provider_id,
                    "policy_generation": policy.generation,
                    "paused": *gateway.paused.borrow() != Pause::Off,
                    "pause": gateway.paused.borrow().as_str(),
                    "sessions": gateway.sessions.count(),
                    "relays": gateway
                        .relays
                        .iter()
                        .filter_map(|r| r.lock().ok().map(|s| json!(*s)))
                        .collect::<Vec<_>>(),
                    "audit": match gateway.audit.health() {
                        Health::Writing => json!({"writing": true}),
                        Health::Stopped { reason, since } =>
                            json!({"writing": false, "reason": reason, "since": since}),
                    },
                }),
            )
        }
        (&Method::GET, "/v1/approvals") => reply(
            StatusCode::OK,
            json!({ "approvals": gateway.approvals.list() }),
        ),
        (&Method::POST, p) if p.starts_with("/v1/approvals/") => {
            let rest = &p["/v1/approvals/".len()..];
            let parsed = rest
                .split_once('/')
                .and_then(|(id, verb)| Some((id.parse::<u64>().ok()?, verb)));
            match parsed {
                Some((id, verb @ ("approve" | "deny"))) => {
                    let approve = verb == "approve";
                    if gateway
                        .approvals
                        .decide(id, approve, format!("uid {peer_uid}"))
                    {
                        info!(
                            approval = id,
                            uid = peer_uid,
                            approve,
                            "approval decided by the operator"
                        );
                        reply(StatusCode::OK, json!({ "id": id, "approved": approve }))
                    } else {
                        reply(
                            StatusCode::NOT_FOUND,
                            json!({ "error": format!("no call waiting with approval id {id}") }),
                        )
                    }
                }
                _ => reply(
                    StatusCode::NOT_FOUND,
                    json!({ "error": "expected /v1/approvals/ID/approve or /v1/approvals/ID/deny" }),
                ),
            }
        }
        (&Method::GET, "/v1/sessions") => reply(
            StatusCode::OK,
            json!({ "sessions": gateway.sessions.list() }),
        ),
        (&Method::DELETE, p) if p.starts_with("/v1/sessions/") => {
            match p["/v1/sessions/".len()..].parse::<u64>() {
                Ok(id) if gateway.sessions.kill(id) => {
                    info!(
                        session = id,
                        uid = peer_uid,
                        "session closed by the operator"
                    );
                    reply(StatusCode::OK, json!({ "closed": id }))
                }
                _ => reply(StatusCode::NOT_FOUND, json!({ "error": "no such session" })),
            }
        }
        (&Method::POST, "/v1/policy/reload") => match gateway.reload_policy() {
            Ok(generation) => {
                info!(%generation, uid = peer_uid, "policy reloaded through the admin socket");
                reply(
                    StatusCode::OK,
                    json!({ "ok": true, "generation": generation }),
                )
            }
            Err(errors) => {
                warn!(
                    uid = peer_uid,
                    "policy reload failed; keeping the old policy:\n{errors}"
                );
                reply(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    json!({ "ok": false, "errors": errors.0 }),
                )
            }
        },
        (&Method::POST, "/v1/pause" | "/v1/resume") => {
            let soft = request
                .uri()
                .query()
                .is_some_and(|q| q.split('&').any(|p| p == "soft"));
            let pause = match (path == "/v1/pause", soft) {
                (false, _) => Pause::Off,
                (true, true) => Pause::Soft,
                (true, false) => Pause::Stop,
            };
            match gateway.set_paused(pause) {
                Ok(()) => {
                    info!(uid = peer_uid, "pause: {}", pause.as_str());
                    reply(
                        StatusCode::OK,
                        json!({ "paused": pause != Pause::Off, "pause": pause.as_str() }),
                    )
                }
                Err(e) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    json!({ "error": format!("cannot record the pause: {e}") }),
                ),
            }
        }
        (&Method::GET, "/v1/audit") => match audit_filter(request.uri().query().unwrap_or("")) {
            Ok(filter) => {
                let audit = gateway.audit.clone();
                match blocking(move || audit.list(&filter)).await {
                    Ok(entries) => reply(StatusCode::OK, json!({ "entries": entries })),
                    Err(e) => reply(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        json!({ "error": e.to_string() }),
                    ),
                }
            }
            Err(e) => reply(StatusCode::BAD_REQUEST, json!({ "error": e.to_string() })),
        },
        (&Method::POST, "/v1/audit/prune") => {
            let query = request.uri().query().unwrap_or("");
            let before = query.split('&').find_map(|p| p.strip_prefix("before="));
            let before = before
                .and_then(|b| percent_decode(b).ok())
                .and_then(|b| b.parse::<jiff::Timestamp>().ok());
            match before {
                None => reply(
                    StatusCode::BAD_REQUEST,
                    json!({ "error": "expected ?before=RFC3339_TIME" }),
                ),
                Some(before) => match gateway.audit.prune(before).await {
                    Ok(removed) => {
                        info!(removed, %before, uid = peer_uid, "audit log pruned");
                        let detail = format!("{removed} entries before {before}, uid {peer_uid}");
                        gateway.security_event("audit_pruned", None, detail);
                        reply(StatusCode::OK, json!({ "removed": removed }))
                    }
                    Err(e) => reply(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        json!({ "error": e.to_string() }),
                    ),
                },
            }
        }
        (&Method::GET, "/v1/audit/checkpoint") => {
            let audit = gateway.audit.clone();
            match blocking(move || audit.head_checkpoint()).await {
                Ok(Some(checkpoint)) => reply(StatusCode::OK, json!(checkpoint)),
                Ok(None) => reply(
                    StatusCode::NOT_FOUND,
                    json!({ "error": "no checkpoint yet: the log is empty" }),
                ),
                Err(e) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    json!({ "error": e.to_string() }),
                ),
            }
        }
        (&Method::GET, "/v1/audit/verify") => {
            // `?kept=SEQ:HEAD`: a checkpoint kept off the host, whose
            // signature the caller checked; the log must still extend it.
            let kept = match kept_of(request.uri().query().unwrap_or("")) {
                Ok(kept) => kept,
                Err(e) => return reply(StatusCode::BAD_REQUEST, json!({ "error": e })),
            };
            let audit = gateway.audit.clone();
            match blocking(move || audit.verify_against(audit.public_key(), kept.as_ref())).await {
                Ok(report) => reply(StatusCode::OK, json!(report)),
                Err(e) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    json!({ "error": e.to_string() }),
                ),
            }
        }
        (&Method::GET, "/v1/audit/export") => export(gateway),
        (&Method::GET, p) if p.starts_with("/v1/audit/after/") => {
            let Ok(seq) = p["/v1/audit/after/".len()..].parse::<u64>() else {
                return reply(
                    StatusCode::BAD_REQUEST,
                    json!({ "error": "expected /v1/audit/after/SEQ" }),
                );
            };
            let audit = gateway.audit.clone();
            match blocking(move || audit.after(seq, 1000)).await {
                Ok(entries) => reply(StatusCode::OK, json!({ "entries": entries })),
                Err(e) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    json!({ "error": e.to_string() }),
                ),
            }
        }
        (&Method::GET, p) if p.starts_with("/v1/audit/") => {
            let Ok(seq) = p["/v1/audit/".len()..].parse::<u64>() else {
                return reply(
                    StatusCode::NOT_FOUND,
                    json!({ "error": "no such audit entry" }),
                );
            };
            let audit = gateway.audit.clone();
            match blocking(move || audit.get(seq)).await {
                Ok(Some(entry)) => reply(StatusCode::OK, json!(entry)),
                Ok(None) => reply(
                    StatusCode::NOT_FOUND,
                    json!({ "error": "no such audit entry" }),
                ),
                Err(e) => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    json!({ "error": e.to_string() }),
                ),
            }
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            json!({ "error": "unknown admin endpoint; see docs/OPERATIONS.md" }),
        ),
    }
}

/// Why an audit query string was refused; sent back as a 400's `error`.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("bad percent-encoding in the query")]
    PercentEncoding,
    #[error("the query is not UTF-8")]
    NotUtf8,
    #[error("`{0}` must be an RFC 3339 time")]
    Time(String),
    #[error("`limit` must be a number")]
    Limit,
    #[error("unknown {key} `{value}`")]
    UnknownValue { key: String, value: String },
    #[error("unknown filter `{0}`")]
    UnknownFilter(String),
}

/// `since`/`until` (RFC 3339 times), `principal`, `method` (glob),
/// `decision`, `status`, `limit`; values percent-encoded.
/// `kept=SEQ:HEAD` of `/v1/audit/verify`, as the checkpoint it names.
fn kept_of(query: &str) -> Result<Option<portcullis_store::Checkpoint>, &'static str> {
    let Some(kept) = query.split('&').find_map(|pair| pair.strip_prefix("kept=")) else {
        return Ok(None);
    };
    let bad = "expected kept=SEQ:HEAD (the entry and the hex hash a kept checkpoint covers)";
    let (seq, head) = kept.split_once(':').ok_or(bad)?;
    let seq = seq.parse().map_err(|_| bad)?;
    if head.len() != 64 || !head.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad);
    }
    Ok(Some(portcullis_store::Checkpoint {
        seq,
        head: head.to_ascii_lowercase(),
        time: String::new(),
        key: String::new(),
        signature: String::new(),
        origin: None,
    }))
}

pub fn audit_filter(query: &str) -> Result<portcullis_store::Filter, FilterError> {
    let mut filter = portcullis_store::Filter::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value)?;
        let time = || {
            value
                .parse::<jiff::Timestamp>()
                .map_err(|_| FilterError::Time(key.to_string()))
        };
        match key {
            "since" => filter.since = Some(time()?),
            "until" => filter.until = Some(time()?),
            "principal" => filter.principal = Some(value),
            "method" => filter.method = Some(value),
            "decision" => filter.decision = Some(named(key, &value)?),
            "status" => filter.status = Some(named(key, &value)?),
            "run" => filter.run = Some(value),
            "session" => filter.session = Some(value),
            "tool_call" => filter.tool_call = Some(value),
            "connection" => filter.connection = Some(value),
            "transport" => filter.transport = Some(value),
            "profile" => filter.profile = Some(value),
            "limit" => filter.limit = value.parse().map_err(|_| FilterError::Limit)?,
            other => return Err(FilterError::UnknownFilter(other.to_string())),
        }
    }
    Ok(filter)
}

/// A snake_case enum value by name (`blocked`, `succeeded`, …).
fn named<T: serde::de::DeserializeOwned>(key: &str, value: &str) -> Result<T, FilterError> {
    serde_json::from_value(Value::String(value.to_string())).map_err(|_| {
        FilterError::UnknownValue {
            key: key.to_string(),
            value: value.to_string(),
        }
    })
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
pub fn percent_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

fn percent_decode(value: &str) -> Result<String, FilterError> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = value
                .get(i + 1..i + 3)
                .ok_or(FilterError::PercentEncoding)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| FilterError::PercentEncoding)?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| FilterError::NotUtf8)
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Why a store read for an admin request failed (a 500's `error`).
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error(transparent)]
    Store(#[from] portcullis_store::StoreError),
    #[error("the store read failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Runs a store read on the blocking pool.
async fn blocking<T: Send + 'static>(
    read: impl FnOnce() -> Result<T, portcullis_store::StoreError> + Send + 'static,
) -> Result<T, ReadError> {
    Ok(tokio::task::spawn_blocking(read).await??)
}

/// Streams `AuditLog::export` as it is written, 64 KiB at a time. A failure
/// part-way ends the body with an `error` line, which `verify --file`
/// refuses, so a cut-short export cannot pass for a whole one.
fn export(gateway: &Gateway) -> Response<Body> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let audit = gateway.audit.clone();
    tokio::task::spawn_blocking(move || {
        let mut out = ChunkWriter {
            tx,
            buf: Vec::new(),
        };
        if let Err(e) = audit.export(&mut out) {
            let line = json!({ "type": "error", "message": e.to_string() });
            let _ = writeln!(out, "{line}");
        }
        let _ = out.flush();
    });
    let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
        let chunk = rx.recv().await?;
        Some((Ok(hyper::body::Frame::data(chunk)), rx))
    });
    let mut response = Response::new(StreamBody::new(chunks).boxed_unsync());
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/jsonl"),
    );
    response
}

/// A `Write` that hands full buffers to an async body; blocks while the
/// reader is slow, so an export never piles up in memory.
struct ChunkWriter {
    tx: tokio::sync::mpsc::Sender<Bytes>,
    buf: Vec<u8>,
}

impl std::io::Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= 64 * 1024 {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            let chunk = Bytes::from(std::mem::take(&mut self.buf));
            self.tx.blocking_send(chunk).map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the reader went away")
            })?;
        }
        Ok(())
    }
}

fn reply(status: StatusCode, body: Value) -> Response<Body> {
    let body = Full::new(Bytes::from(format!("{body}\n"))).boxed_unsync();
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

/// Why a request to the admin socket got no answer (the CLI's side).
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("cannot reach the daemon at {socket}: {source} (is it running? see --admin-socket)")]
    Connect {
        socket: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("the admin socket's HTTP failed: {0}")]
    Http(#[from] hyper::Error),
    #[error("cannot build the request: {0}")]
    Request(#[from] hyper::http::Error),
    #[error("{0}")]
    Refused(String),
    #[error("cannot write the answer: {0}")]
    Write(std::io::Error),
}

/// A request to a running daemon's admin socket: what the CLI uses.
pub async fn request(
    socket: &Path,
    method: Method,
    path: &str,
) -> Result<(StatusCode, Value), AdminError> {
    let response = send(socket, method, path).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    let value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    Ok((status, value))
}

/// A GET whose body is copied to `out` as it arrives (`audit export`).
/// A refused request is `AdminError::Refused` with the daemon's message.
pub async fn download(
    socket: &Path,
    path: &str,
    out: &mut dyn std::io::Write,
) -> Result<(), AdminError> {
    let response = send(socket, Method::GET, path).await?;
    let status = response.status();
    let mut body = response.into_body();
    if !status.is_success() {
        let body = body.collect().await?.to_bytes();
        let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let message = value["error"].as_str().unwrap_or("refused").to_string();
        return Err(AdminError::Refused(message));
    }
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            out.write_all(&data).map_err(AdminError::Write)?;
        }
    }
    Ok(())
}

async fn send(socket: &Path, method: Method, path: &str) -> Result<Response<Incoming>, AdminError> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|source| AdminError::Connect {
            socket: socket.to_path_buf(),
            source,
        })?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "portcullis")
        .body(http_body_util::Empty::<Bytes>::new())?;
    Ok(sender.send_request(request).await?)
}
