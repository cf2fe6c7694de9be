//! Artifacts: a result handed to the runtime's own storage instead of
//! the channel, as the relay spec's artifact coordination describes.
//!
//! For a call that asks (`file.read` with `artifact`), [`Artifacts::upload`]
//! decides the upload with the policy (`artifact.upload`: the principal's
//! `[grant.artifacts]`, its MIME types and `max_size`), asks the runtime
//! `artifact.reserve` (a provider → runtime request, audited), writes the
//! upload's start entry — durable before any byte leaves —, `PUT`s the
//! bytes to the URL the runtime returned with the headers it returned
//! (no redirect is followed), then asks `artifact.complete` with
//! `size_bytes` and `sha256`, or `artifact.abort`; its completing entry
//! follows. The call's stream gets an `artifact` frame and the session the
//! `artifact.uploaded` event. Failures are `artifact_error`.
//!
//! The upload URL and its headers are the runtime's secrets: the audit
//! entry names only the scheme, host and port.

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST, HeaderName, HeaderValue};
use hyper::{Method as HttpMethod, Uri};
use hyper_util::rt::TokioIo;
use portcullis_policy::{Query, Target, decide};
use portcullis_store::{AuditLog, Decision, Kind, Record};
use portcullis_wire::frame::{ErrorBody, ErrorCode};
use serde_json::{Map, Value, json};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::provider::Call;

/// Bytes read and sent at a time.
const PIECE: usize = 256 << 10;
/// Headers the runtime may ask an upload to carry, and their size.
const MAX_HEADERS: usize = 32;
const MAX_HEADER_BYTES: usize = 8 << 10;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Uploads results to the runtime's storage. Cheap to clone.
#[derive(Clone)]
pub struct Artifacts(Arc<State>);

struct State {
    audit: AuditLog,
    ca_file: PathBuf,
    /// Built on the first `https` upload.
    tls: OnceLock<Result<tokio_rustls::TlsConnector, String>>,
}

/// What to upload.
pub struct Upload {
    /// The spec's `kind` (`file`, `output`, `screenshot`, …).
    pub kind: String,
    pub mime_type: String,
    /// Passed to the runtime in `artifact.reserve`'s `metadata`.
    pub metadata: Map<String, Value>,
    pub size: u64,
    pub source: Source,
}

/// Where an upload's bytes come from.
pub enum Source {
    /// `size` bytes of an open file from `offset`.
    File {
        file: std::fs::File,
        offset: u64,
    },
    Bytes(Bytes),
}

/// `artifact.reserve`'s answer, checked.
struct Reservation {
    artifact_id: String,
    uri: Uri,
    tls: bool,
    host: String,
    port: u16,
    headers: Vec<(HeaderName, HeaderValue)>,
}

fn artifact_error(message: impl Into<String>) -> ErrorBody {
    ErrorBody::new(ErrorCode::ArtifactError, message)
}

impl Artifacts {
    pub fn new(audit: AuditLog, ca_file: Option<PathBuf>) -> Self {
        Self(Arc::new(State {
            audit,
            ca_file: ca_file.unwrap_or_else(|| crate::tls::DEBIAN_CA_BUNDLE.into()),
            tls: OnceLock::new(),
        }))
    }

    /// Uploads `upload` for `call`, and answers what the runtime should
    /// know of it (`artifact_id`, `size_bytes`, `sha256`, `mime_type`).
    pub async fn upload(&self, call: &Call, upload: Upload) -> Result<Value, ErrorBody> {
        let mut record = self.record(call, &upload);
        let query = Query {
            method: "artifact.upload".into(),
            target: Target::Artifact {
                mime_type: upload.mime_type.clone(),
                size: upload.size,
            },
        };
        let decision = decide(
            &call.policy,
            &call.principal,
            &query,
            jiff::Timestamp::now(),
        );
        record.rule = Some(decision.rule.clone());
        if let portcullis_policy::Verdict::Deny(denial) = decision.verdict {
            let code = crate::provider::error_code(denial);
            let error = ErrorBody::new(code, format!("artifact: {}", decision.rule));
            record.decision = Some(Decision::Blocked);
            self.finish(record, Err(&error)).await;
            return Err(error);
        }
        record.decision = Some(Decision::Allowed);
        let grant = decision.grant.clone().unwrap_or_default();

        let mut params = Map::new();
        if let Some(run) = call.request.context.as_ref().and_then(|c| c.run_id.clone()) {
            params.insert("run_id".into(), run.into());
        }
        params.insert("kind".into(), upload.kind.clone().into());
        params.insert("mime_type".into(), upload.mime_type.clone().into());
        params.insert("size_bytes".into(), upload.size.into());
        params.insert("metadata".into(), Value::Object(upload.metadata.clone()));
        let reserved = call
            .requests
            .ask_runtime(&call.request.id, "artifact.reserve", params, &call.cancel)
            .await
            .map_err(|e| match e.code {
                // Not the runtime's failure: it was never asked.
                ErrorCode::CapabilityUnavailable | ErrorCode::Cancelled => e,
                _ => artifact_error(format!(
                    "the runtime did not reserve the artifact: {}",
                    e.message
                )),
            });
        let reservation = match reserved.and_then(|r| Reservation::parse(&r)) {
            Ok(reservation) => reservation,
            Err(error) => {
                self.finish(record, Err(&error)).await;
                return Err(error);
            }
        };
        record.destination = Some(reservation.destination());
        record.detail = Some(format!(
            "artifact {}: {} bytes of {}",
            reservation.artifact_id, upload.size, upload.mime_type
        ));
        // Only where the grant lets uploads go: its host and port listed,
        // resolved to addresses it allows (public, or listed).
        let addresses = match self.destination(&call.policy, &grant, &reservation).await {
            Ok((addresses, rule)) => {
                record.rule = Some(format!("{}; {rule}", decision.rule));
                addresses
            }
            Err(error) => {
                record.decision = Some(Decision::Blocked);
                self.abort(call, &reservation, &error.message).await;
                self.finish(record, Err(&error)).await;
                return Err(error);
            }
        };

        let mut start = record.clone();
        start.kind = Kind::RequestStart;
        let start_seq = match self.0.audit.append(start).await {
            Ok(seq) => seq,
            Err(e) => {
                tracing::error!("audit: {e}");
                let error = crate::provider::audit_unavailable(false, &e.to_string());
                self.abort(call, &reservation, "the audit log cannot write")
                    .await;
                return Err(error);
            }
        };
        record.start_seq = Some(start_seq);

        let sent = tokio::select! {
            sent = self.put(&reservation, &addresses, &upload.mime_type, upload.size, upload.source) => sent,
            () = call.cancel.cancelled() => Err(ErrorBody::new(ErrorCode::Cancelled, "the upload was cancelled")),
        };
        let outcome = match sent {
            Ok(sha256) => {
                record.bytes_out = upload.size;
                let mut params = Map::new();
                params.insert("artifact_id".into(), reservation.artifact_id.clone().into());
                params.insert("size_bytes".into(), upload.size.into());
                params.insert("sha256".into(), sha256.clone().into());
                call.requests
                    .ask_runtime(&call.request.id, "artifact.complete", params, &call.cancel)
                    .await
                    .map(|_| sha256)
                    .map_err(|e| {
                        artifact_error(format!(
                            "the runtime did not complete the artifact: {}",
                            e.message
                        ))
                    })
            }
            Err(error) => {
                self.abort(call, &reservation, &error.message).await;
                Err(error)
            }
        };
        let sha256 = match outcome {
            Ok(sha256) => sha256,
            Err(error) => {
                self.finish(record, Err(&error)).await;
                return Err(error);
            }
        };
        record.detail = Some(format!(
            "artifact {}: {} bytes of {}, sha256 {sha256}",
            reservation.artifact_id, upload.size, upload.mime_type
        ));
        self.finish(record, Ok(())).await;
        let described = json!({
            "artifact_id": reservation.artifact_id,
            "kind": upload.kind,
            "mime_type": upload.mime_type,
            "size_bytes": upload.size,
            "sha256": sha256,
        });
        // What the runtime hears beside the answer; a gone session has
        // the answer's fate anyway.
        let _ = call.stream.event("artifact", described.clone()).await;
        let mut event = described.clone();
        event["request_id"] = json!(call.request.id.as_str());
        if let Some(run) = call.request.context.as_ref().and_then(|c| c.run_id.clone()) {
            event["run_id"] = json!(run);
        }
        let _ = call
            .resources
            .events()
            .send("artifact.uploaded", event)
            .await;
        Ok(described)
    }

    /// The upload's entry, as far as it is known before the decision.
    fn record(&self, call: &Call, upload: &Upload) -> Record {
        let context = call.request.context.as_ref();
        Record {
            kind: Kind::Request,
            started_at: jiff::Timestamp::now().to_string(),
            connection: Some(call.origin.connection),
            peer: Some(call.origin.peer.clone()),
            principal: Some(call.principal.as_str().into()),
            method: Some("artifact.upload".into()),
            capability: Some("artifacts".into()),
            parent_request_id: Some(call.request.id.to_string()),
            policy_generation: Some(call.policy.generation.clone()),
            run_id: context.and_then(|c| c.run_id.clone()),
            session_id: context.and_then(|c| c.session_id.clone()),
            tool_call_id: context.and_then(|c| c.tool_call_id.clone()),
            detail: Some(format!("{} bytes of {}", upload.size, upload.mime_type)),
            ..Record::default()
        }
    }

    /// Writes the upload's completing (or refusing) entry.
    async fn finish(&self, mut record: Record, outcome: Result<(), &ErrorBody>) {
        record.completed_at = Some(jiff::Timestamp::now().to_string());
        let (status, code) = crate::provider::audit_status(outcome.err());
        (record.status, record.error_code) = (Some(status), code);
        if let Err(error) = outcome {
            let why: String = error.message.chars().take(300).collect();
            record.detail = Some(match record.detail.take() {
                Some(detail) => format!("{detail}: {why}"),
                None => why,
            });
        }
        if let Err(e) = self.0.audit.append(record).await {
            tracing::error!("audit: {e}");
        }
    }

    /// Tells the runtime the reserved artifact will not come.
    async fn abort(&self, call: &Call, reservation: &Reservation, reason: &str) {
        let mut params = Map::new();
        params.insert("artifact_id".into(), reservation.artifact_id.clone().into());
        params.insert(
            "reason".into(),
            reason.chars().take(300).collect::<String>().into(),
        );
        // Even once the call is cancelled: the runtime should free its room.
        let _ = call
            .requests
            .ask_runtime(
                &call.request.id,
                "artifact.abort",
                params,
                &tokio_util::sync::CancellationToken::new(),
            )
            .await;
    }

    /// The addresses the upload may use, and the rule that allows them.
    async fn destination(
        &self,
        policy: &portcullis_policy::Policy,
        grant: &str,
        to: &Reservation,
    ) -> Result<(Vec<std::net::IpAddr>, String), ErrorBody> {
        let resolved: Vec<std::net::IpAddr> =
            match portcullis_policy::egress::parse_address(&to.host) {
                Some(address) => vec![address],
                None => tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    tokio::net::lookup_host((to.host.as_str(), to.port)),
                )
                .await
                .map_err(|_| artifact_error(format!("{}: no DNS answer within 10 s", to.host)))?
                .map_err(|e| artifact_error(format!("{}: {e}", to.host)))?
                .map(|a| a.ip())
                .collect(),
            };
        portcullis_policy::artifact_destination(policy, grant, &to.host, to.port, &resolved)
            .map_err(|why| {
                ErrorBody::new(
                    ErrorCode::PermissionDenied,
                    format!("artifact upload to {}: {why}", to.destination()),
                )
            })
    }

    /// `PUT`s the bytes to one of `addresses`; answers their SHA-256 (hex)
    /// once the server said 2xx.
    async fn put(
        &self,
        to: &Reservation,
        addresses: &[std::net::IpAddr],
        mime_type: &str,
        size: u64,
        source: Source,
    ) -> Result<String, ErrorBody> {
        let mut last = artifact_error(format!("{}: no address to connect to", to.destination()));
        let mut connected = None;
        for address in addresses {
            let at = std::net::SocketAddr::new(*address, to.port);
            match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(at)).await {
                Ok(Ok(tcp)) => {
                    connected = Some(tcp);
                    break;
                }
                Ok(Err(e)) => last = artifact_error(format!("{}: {at}: {e}", to.destination())),
                Err(_) => {
                    last = artifact_error(format!(
                        "{}: {at}: no connection within 10 s",
                        to.destination()
                    ))
                }
            }
        }
        let tcp = connected.ok_or(last)?;
        let _ = tcp.set_nodelay(true);
        if to.tls {
            let connector = self.tls()?;
            let name = rustls::pki_types::ServerName::try_from(to.host.clone())
                .map_err(|e| artifact_error(format!("upload host `{}`: {e}", to.host)))?;
            let stream = connector
                .connect(name, tcp)
                .await
                .map_err(|e| artifact_error(format!("{}: TLS: {e}", to.destination())))?;
            send(stream, to, mime_type, size, source).await
        } else {
            send(tcp, to, mime_type, size, source).await
        }
    }

    fn tls(&self) -> Result<tokio_rustls::TlsConnector, ErrorBody> {
        self.0
            .tls
            .get_or_init(|| crate::tls::client_connector(Some(&self.0.ca_file)))
            .clone()
            .map_err(|why| {
                artifact_error(format!(
                    "an https upload needs CA certificates (`[artifacts] ca_file`): {why}"
                ))
            })
    }
}

/// The request over one connection, the body fed as the server takes it.
async fn send<S>(
    stream: S,
    to: &Reservation,
    mime_type: &str,
    size: u64,
    source: Source,
) -> Result<String, ErrorBody>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let place = to.destination();
    let failed = |e: &dyn std::fmt::Display| artifact_error(format!("{place}: {e}"));
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| failed(&e))?;
    let driver = tokio::spawn(connection);
    let (mut body_tx, body) = http_body_util::channel::Channel::<Bytes, io::Error>::new(4);
    let mut request = hyper::Request::builder()
        .method(HttpMethod::PUT)
        .uri(to.uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(HOST, to.authority())
        .header(CONTENT_TYPE, mime_type)
        .header(CONTENT_LENGTH, size);
    for (name, value) in &to.headers {
        request = request.header(name, value);
    }
    let request = request.body(body).map_err(|e| failed(&e))?;
    let feed = async move {
        let mut hasher = Sha256::new();
        let mut sent = 0u64;
        let file = match source {
            Source::File { file, offset } => Some((Arc::new(file), offset)),
            Source::Bytes(bytes) => {
                hasher.update(&bytes);
                for piece in bytes.chunks(PIECE) {
                    body_tx
                        .send_data(bytes.slice_ref(piece))
                        .await
                        .map_err(|_| "the server stopped reading".to_string())?;
                }
                sent = bytes.len() as u64;
                None
            }
        };
        if let Some((file, offset)) = file {
            while sent < size {
                let want = usize::try_from(size - sent).unwrap_or(PIECE).min(PIECE);
                let at = offset + sent;
                let file = file.clone();
                let piece = tokio::task::spawn_blocking(move || {
                    use std::os::unix::fs::FileExt as _;
                    let mut buffer = vec![0; want];
                    let n = file.read_at(&mut buffer, at)?;
                    buffer.truncate(n);
                    Ok::<_, io::Error>(buffer)
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("reading the file: {e}"))?;
                if piece.is_empty() {
                    return Err(format!(
                        "the file shrank to {} bytes while it was sent",
                        offset + sent
                    ));
                }
                hasher.update(&piece);
                sent += piece.len() as u64;
                body_tx
                    .send_data(Bytes::from(piece))
                    .await
                    .map_err(|_| "the server stopped reading".to_string())?;
            }
        }
        Ok::<_, String>(hex::encode(hasher.finalize()))
    };
    let (fed, answered) = tokio::join!(feed, sender.send_request(request));
    driver.abort();
    let response = answered.map_err(|e| failed(&e))?;
    let status = response.status();
    if status.is_redirection() {
        return Err(artifact_error(format!(
            "{place} answered {status}: redirects are not followed; the runtime must give the final URL"
        )));
    }
    if !status.is_success() {
        // A short reason from the server, if it gave one in time.
        let body = tokio::time::timeout(Duration::from_secs(2), response.into_body().collect())
            .await
            .ok()
            .and_then(Result::ok)
            .map(|b| {
                String::from_utf8_lossy(&b.to_bytes())
                    .chars()
                    .take(200)
                    .collect::<String>()
            })
            .unwrap_or_default();
        return Err(artifact_error(
            format!("{place} answered {status} {body}")
                .trim_end()
                .to_string(),
        ));
    }
    fed.map_err(|e| failed(&e))
}

impl Reservation {
    /// Checks `artifact.reserve`'s result: an id, an `http(s)` URL with a
    /// host, and headers that are valid and do not replace the request's
    /// own framing.
    fn parse(result: &Value) -> Result<Self, ErrorBody> {
        let bad = |why: &str| artifact_error(format!("artifact.reserve answered {why}"));
        let artifact_id = result
            .get("artifact_id")
            .and_then(Value::as_str)
            .filter(|id| portcullis_wire::frame::is_short_name(id))
            .ok_or_else(|| {
                bad("no usable artifact_id (a short string without control characters)")
            })?
            .to_string();
        let url = result
            .get("upload_url")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("no upload_url"))?;
        let uri: Uri = url
            .parse()
            .map_err(|_| bad("an upload_url that is not a URL"))?;
        let tls = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(bad("an upload_url that is neither http nor https")),
        };
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("an upload_url without a host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let mut headers = Vec::new();
        if let Some(given) = result.get("headers") {
            let given = given
                .as_object()
                .ok_or_else(|| bad("headers that are not an object of strings"))?;
            if given.len() > MAX_HEADERS {
                return Err(bad(&format!("more than {MAX_HEADERS} headers")));
            }
            for (name, value) in given {
                let value = value
                    .as_str()
                    .filter(|v| v.len() <= MAX_HEADER_BYTES)
                    .ok_or_else(|| bad(&format!("header `{name}` that is not a short string")))?;
                let name = HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| bad(&format!("`{name}`, which is not a header name")))?;
                let framing = [
                    HOST,
                    CONTENT_LENGTH,
                    hyper::header::TRANSFER_ENCODING,
                    hyper::header::CONNECTION,
                    hyper::header::UPGRADE,
                    hyper::header::TE,
                ];
                if framing.contains(&name) {
                    return Err(bad(&format!(
                        "header `{name}`, which the gateway sets itself"
                    )));
                }
                let value = HeaderValue::from_str(value)
                    .map_err(|_| bad(&format!("a value of header `{name}` that is not valid")))?;
                headers.push((name, value));
            }
        }
        Ok(Self {
            artifact_id,
            uri,
            tls,
            host,
            port,
            headers,
        })
    }

    /// `host:port` as the `Host` header says it.
    fn authority(&self) -> String {
        match self.uri.authority() {
            // Without any user info the runtime put in the URL.
            Some(a) => a
                .as_str()
                .rsplit('@')
                .next()
                .unwrap_or_default()
                .to_string(),
            None => self.host.clone(),
        }
    }

    /// Where the bytes go, as the audit log may say it: no path, no query.
    fn destination(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        if self.host.contains(':') {
            format!("{scheme}://[{}]:{}", self.host, self.port)
        } else {
            format!("{scheme}://{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_s_reserve_response_is_a_reservation() {
        let spec = json!({
            "artifact_id": "art_123",
            "upload_url": "https://runtime.example/upload/art_123",
            "headers": {"Authorization": "Bearer upload-token"}
        });
        let r = Reservation::parse(&spec).unwrap();
        assert_eq!(r.artifact_id, "art_123");
        assert!(r.tls);
        assert_eq!((r.host.as_str(), r.port), ("runtime.example", 443));
        assert_eq!(r.headers.len(), 1);
        assert_eq!(r.destination(), "https://runtime.example:443");
        assert_eq!(r.authority(), "runtime.example");
    }

    #[test]
    fn reservations_that_would_mislead_the_upload_are_refused() {
        for (result, why) in [
            (json!({"upload_url": "http://h/x"}), "artifact_id"),
            (
                json!({"artifact_id": "a", "upload_url": "ftp://h/x"}),
                "neither http",
            ),
            (
                json!({"artifact_id": "a", "upload_url": "/relative"}),
                "neither http",
            ),
            (
                json!({"artifact_id": "a", "upload_url": "http://h/x", "headers": {"Host": "evil"}}),
                "sets itself",
            ),
            (
                json!({"artifact_id": "a", "upload_url": "http://h/x", "headers": {"Content-Length": "1"}}),
                "sets itself",
            ),
            (
                json!({"artifact_id": "a", "upload_url": "http://h/x", "headers": {"X": 1}}),
                "short string",
            ),
            (
                json!({"artifact_id": "a", "upload_url": "http://h/x", "headers": {"X": "a\nb"}}),
                "not valid",
            ),
            (
                json!({"artifact_id": "a", "upload_url": "http://h/x", "headers": []}),
                "not an object",
            ),
        ] {
            let error = Reservation::parse(&result).err().unwrap();
            assert_eq!(error.code, ErrorCode::ArtifactError);
            assert!(error.message.contains(why), "{result}: {}", error.message);
        }
    }

    #[test]
    fn user_info_in_the_url_stays_out_of_the_host_header_and_the_log() {
        let r = Reservation::parse(&json!({
            "artifact_id": "a", "upload_url": "http://user:secret@127.0.0.1:8080/up?sig=x"
        }))
        .unwrap();
        assert_eq!(r.authority(), "127.0.0.1:8080");
        assert_eq!(r.destination(), "http://127.0.0.1:8080");
        let v6 = Reservation::parse(&json!({"artifact_id": "a", "upload_url": "http://[::1]:9/u"}))
            .unwrap();
        assert_eq!(v6.host, "::1");
        assert_eq!(v6.destination(), "http://[::1]:9");
    }
}
