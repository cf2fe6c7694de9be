//! The `fileops` capability: `file.*` methods inside granted roots.
//!
//! Policy has decided and normalised the path ([`FileTerms`]); this module
//! parses the method's other params, runs the operation from `ops.rs` on
//! the blocking pool within its root's share (or, for a few system calls' work and for inline
//! writes, on `pools.rs`'s threads; a stat the kernel answers from memory, and a streamed read's
//! chunks the page cache has, on the runtime worker: `ops::stat_cached`,
//! `ops::read_cached_into`), confined by `confine.rs`, and moves data: small
//! contents inline in JSON, large ones as chunks on channel 4 (file data).
//! docs/PROTOCOL.md §7 is the reference for params and results.

pub mod direct;
mod edit;
pub mod ops;
mod pools;
pub use pools::BLOCKING_THREADS;
pub mod search;
pub mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use portcullis_policy::{Capability, FileTerms, Target, Terms};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::artifacts::{Artifacts, Source, Upload};
use crate::provider::{
    Call, Method, Progress, Provider, Reply, StreamSink, Usage, no_input, params,
};
use ops::{AtomicFile, CachedRead};
use portcullis_confine::{FileError, Root, RootSpec};
use portcullis_wire::frame::{ErrorBody, ErrorCode, Request};
use portcullis_wire::record::Channel;

/// Largest inline read, in bytes of file data, before it is fitted to the
/// result's room (the gateway's `max_frame`; JSON escaping can only shrink
/// what fits). Larger reads stream (`stream: true`).
pub const MAX_INLINE_READ: usize = 4 << 20;
/// JSON bytes a response's payload (content, entries) may take: a record
/// is 65519 bytes, and the id and other fields need room too.
pub(crate) const RESPONSE_BUDGET: usize = 60_000;
/// Room an inline read's other fields take beside its content.
const RESULT_FIELDS: usize = 1024;

/// The `fileops` provider. Cloning shares its state.
#[derive(Clone)]
pub struct Files(Arc<State>);

struct State {
    /// Uploads to the runtime's storage, when the daemon makes them.
    artifacts: Option<Artifacts>,
    /// Threads of their own for operations of a few system calls.
    quick: pools::Pool,
    /// Threads of their own for inline writes.
    writes: pools::Pool,
    /// Each root's share of the main blocking pool, for everything else.
    main: pools::Pool,
    /// The one inotify watcher every `file.watch` shares.
    hub: Arc<watch::Hub>,
}

impl Files {
    pub fn new() -> Self {
        Self::with_artifacts(None)
    }

    /// A provider whose `file.read` can hand a file to the runtime's
    /// storage (`artifact`).
    pub fn with_artifacts(artifacts: Option<Artifacts>) -> Self {
        Self(Arc::new(State {
            artifacts,
            quick: pools::Pool::quick(),
            writes: pools::Pool::writes(),
            main: pools::Pool::main(),
            hub: watch::Hub::new(),
        }))
    }

    /// Runs a file operation of a few system calls on the quick threads,
    /// within the share of them of the root whose host directory is `root`.
    async fn quick<T: Send + 'static>(
        &self,
        root: &Path,
        op: impl FnOnce() -> Result<T, FileError> + Send + 'static,
    ) -> Result<T, ErrorBody> {
        joined(self.0.quick.run(&[root], op).await).await
    }

    /// Runs an inline write (or edit) on the write threads, within the
    /// root's share of them.
    async fn inline_write<T: Send + 'static>(
        &self,
        root: &Path,
        op: impl FnOnce() -> Result<T, FileError> + Send + 'static,
    ) -> Result<T, ErrorBody> {
        joined(self.0.writes.run(&[root], op).await).await
    }

    /// Runs any other file operation on the main blocking pool, within the
    /// share of it of every root it touches (whose host directories are
    /// `roots`).
    async fn blocking<T: Send + 'static>(
        &self,
        roots: &[&Path],
        op: impl FnOnce() -> Result<T, FileError> + Send + 'static,
    ) -> Result<T, ErrorBody> {
        joined(self.0.main.run(roots, op).await).await
    }
}

impl Default for Files {
    fn default() -> Self {
        Self::new()
    }
}

/// A method that reads one path of a root: one entry, once answered.
const fn reads(name: &'static str) -> Method {
    Method {
        name,
        capability: Capability::Fileops,
        start_entry: false,
        target: path_target,
        input: no_input,
    }
}

/// A method that changes one path of a root: its start entry is durable
/// before anything changes.
const fn changes(name: &'static str, input: fn(&Request) -> Option<Channel>) -> Method {
    Method {
        name,
        start_entry: true,
        input,
        ..reads(name)
    }
}

/// A method from one path to another (`file.move`, `file.copy`).
const fn between_paths(name: &'static str) -> Method {
    Method {
        target: transfer_target,
        ..changes(name, no_input)
    }
}

const METHODS: &[Method] = &[
    reads("file.read"),
    changes("file.write", upload_input),
    changes("file.append", upload_input),
    reads("file.list"),
    reads("file.stat"),
    changes("file.mkdir", no_input),
    changes("file.delete", no_input),
    // Replacements of exact text, as one request (a portcullis method).
    changes("file.edit", no_input),
    between_paths("file.move"),
    between_paths("file.copy"),
    // A read, but a long one: its start entry shows it while it runs.
    Method {
        start_entry: true,
        ..reads("file.search")
    },
    // Makes a resource of the session's.
    Method {
        start_entry: true,
        ..reads("file.watch")
    },
];

fn path_target(request: &Request) -> Result<Target, ErrorBody> {
    let p = &request.params;
    Ok(Target::Path {
        root: params::string(p, "root_id")?,
        path: params::string(p, "path")?,
    })
}

fn transfer_target(request: &Request) -> Result<Target, ErrorBody> {
    let p = &request.params;
    let root = params::string(p, "root_id")?;
    let to_root = params::optional_string(p, "to_root_id")?.unwrap_or_else(|| root.clone());
    Ok(Target::Transfer {
        from: (root, params::string(p, "path")?),
        to: (to_root, params::string(p, "to_path")?),
    })
}

/// A streamed write takes its data as chunks on channel 4.
fn upload_input(request: &Request) -> Option<Channel> {
    let streams = request.params.get("stream") == Some(&Value::Bool(true));
    streams.then_some(Channel::FileData)
}

impl Provider for Files {
    fn methods(&self) -> &'static [Method] {
        METHODS
    }

    /// Uploads remove their temporary file, reads stop at the next chunk.
    fn cancel_grace(&self) -> std::time::Duration {
        std::time::Duration::from_secs(2)
    }

    fn call(&self, call: Call) -> Reply {
        Box::pin(serve(self.clone(), call))
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Encoding {
    #[default]
    #[serde(alias = "utf-8", alias = "text")]
    Utf8,
    #[serde(alias = "bytes")]
    Base64,
}

/// An `encoding` parameter of a request whose result names its encoding:
/// the encoding, and the name to answer with (the caller's own spelling
/// of UTF-8: the relay spec writes `utf-8`, portcullis `utf8`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct AskedEncoding {
    pub encoding: Encoding,
    pub name: &'static str,
}

impl Default for AskedEncoding {
    fn default() -> Self {
        Self {
            encoding: Encoding::Utf8,
            name: "utf8",
        }
    }
}

impl<'de> Deserialize<'de> for AskedEncoding {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let asked = String::deserialize(d)?;
        let encoding =
            Encoding::deserialize(serde::de::value::StrDeserializer::<D::Error>::new(&asked))?;
        let name = match (asked.as_str(), encoding) {
            ("utf-8", _) => "utf-8",
            (_, Encoding::Utf8) => "utf8",
            (_, Encoding::Base64) => "base64",
        };
        Ok(Self { encoding, name })
    }
}

#[derive(Deserialize)]
struct ReadParams {
    #[serde(default)]
    offset: u64,
    length: Option<u64>,
    #[serde(default)]
    encoding: AskedEncoding,
    #[serde(default)]
    stream: bool,
    /// With `stream`: whether the result carries the SHA-256 of the bytes
    /// sent (a core-second per GiB here; the channel authenticates the
    /// bytes either way).
    #[serde(default = "yes")]
    sha256: bool,
    /// Upload the bytes to the runtime's storage instead (`true`, or what
    /// to call them); see `read_as_artifact`.
    #[serde(default)]
    artifact: Option<ArtifactAsk>,
}

/// `file.read`'s `artifact`: `true`, or the artifact's kind, type and
/// metadata.
#[derive(Deserialize)]
#[serde(untagged)]
enum ArtifactAsk {
    Yes(bool),
    Described(ArtifactDescription),
}

impl ArtifactAsk {
    fn wanted(&self) -> bool {
        match self {
            Self::Yes(wanted) => *wanted,
            Self::Described(_) => true,
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ArtifactDescription {
    kind: Option<String>,
    mime_type: Option<String>,
    #[serde(default)]
    metadata: serde_json::Map<String, Value>,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct WriteParams {
    content: Option<String>,
    #[serde(default)]
    encoding: Encoding,
    #[serde(default)]
    stream: bool,
    /// With `stream`: the size the upload must have.
    size: Option<u64>,
    #[serde(default)]
    create_parents: bool,
    /// Whether the result carries the SHA-256 of what was written.
    #[serde(default = "yes")]
    sha256: bool,
}

#[derive(Deserialize)]
struct ListParams {
    #[serde(default = "one")]
    depth: usize,
    #[serde(default)]
    hidden: bool,
    #[serde(default)]
    offset: usize,
    #[serde(default = "list_limit")]
    limit: usize,
}

fn one() -> usize {
    1
}

fn list_limit() -> usize {
    1000
}

#[derive(Deserialize)]
struct Flags {
    #[serde(default)]
    parents: bool,
    #[serde(default)]
    recursive: bool,
    #[serde(default)]
    overwrite: bool,
}

fn params<T: serde::de::DeserializeOwned>(request: &Request) -> Result<T, ErrorBody> {
    serde_json::from_value(Value::Object(request.params.clone())).map_err(|e| {
        ErrorBody::new(
            ErrorCode::InvalidRequest,
            format!("{} params: {e}", request.method),
        )
    })
}

async fn serve(files: Files, call: Call) -> Result<Value, ErrorBody> {
    let as_artifact = call.request.method == "file.read"
        && params::<ReadParams>(&call.request)
            .ok()
            .and_then(|p| p.artifact)
            .is_some_and(|a| a.wanted());
    if as_artifact {
        return read_as_artifact(&files, &call).await;
    }
    let Call {
        request,
        terms,
        cancel,
        stream,
        input,
        usage,
        resources,
        max_result,
        ..
    } = call;
    match (request.method.as_str(), terms) {
        ("file.move" | "file.copy", Terms::Transfer { from, to }) => {
            let flags: Flags = params(&request)?;
            let copy = request.method == "file.copy";
            let roots = (from.host_root.clone(), to.host_root.clone());
            files
                .blocking(&[&roots.0, &roots.1], move || {
                    let (from_root, to_root) = (open_root(&from)?, open_root(&to)?);
                    if copy {
                        ops::copy(
                            &from_root,
                            &from.path,
                            &to_root,
                            &to.path,
                            flags.overwrite,
                            &cancel,
                        )
                    } else {
                        ops::rename(&from_root, &from.path, &to_root, &to.path, flags.overwrite)
                    }
                })
                .await
        }
        (method, Terms::File(file)) => {
            let path = file.path.clone();
            match method {
                "file.stat" => match ops::stat_cached(&file, &path) {
                    Some(answer) => Ok(answer),
                    None => {
                        let host = file.host_root.clone();
                        files
                            .quick(&host, move || ops::stat(&open_root(&file)?, &path))
                            .await
                    }
                },
                "file.list" => {
                    let p: ListParams = params(&request)?;
                    let how = ops::Listing {
                        depth: p.depth.clamp(1, ops::MAX_DEPTH),
                        hidden: p.hidden,
                        offset: p.offset,
                        limit: p.limit.clamp(1, 10_000),
                        budget: RESPONSE_BUDGET,
                    };
                    let host = file.host_root.clone();
                    files
                        .blocking(&[&host], move || {
                            ops::list(&open_root(&file)?, &path, &how, &cancel)
                        })
                        .await
                }
                "file.mkdir" => {
                    let flags: Flags = params(&request)?;
                    let host = file.host_root.clone();
                    files
                        .quick(&host, move || {
                            ops::mkdir(&open_root(&file)?, &path, flags.parents)
                        })
                        .await
                }
                "file.delete" => {
                    let flags: Flags = params(&request)?;
                    let host = file.host_root.clone();
                    files
                        .blocking(&[&host], move || {
                            ops::delete(&open_root(&file)?, &path, flags.recursive, &cancel)
                        })
                        .await
                }
                "file.search" => {
                    let p: search::SearchParams = params(&request)?;
                    let host = file.host_root.clone();
                    files
                        .blocking(&[&host], move || {
                            search::search(&open_root(&file)?, &path, p, &stream, &cancel)
                        })
                        .await
                }
                "file.watch" => {
                    let p: watch::WatchParams = params(&request)?;
                    let id = resources.reserve("w")?;
                    let (events, runtime) = (resources.events(), tokio::runtime::Handle::current());
                    let (watch_id, hub) = (id.clone(), files.0.hub.clone());
                    let host = file.host_root.clone();
                    let (guard, info) = files
                        .blocking(&[&host], move || {
                            let root = open_root(&file)?;
                            watch::start(
                                &hub,
                                root,
                                &path,
                                p.recursive,
                                &watch_id,
                                events,
                                &runtime,
                            )
                        })
                        .await?;
                    resources.add(
                        id.clone(),
                        "file.watch",
                        &request,
                        info.clone(),
                        Box::new(guard),
                    );
                    let mut result = info;
                    result["watch"] = json!(id);
                    Ok(result)
                }
                "file.read" => {
                    read(
                        &files,
                        file,
                        params(&request)?,
                        stream,
                        usage,
                        cancel,
                        max_result,
                    )
                    .await
                }
                "file.write" | "file.append" => {
                    let append = method == "file.append";
                    write(&files, file, params(&request)?, append, input, usage).await
                }
                "file.edit" => edit_file(&files, file, params(&request)?, usage).await,
                other => Err(unserved(other)),
            }
        }
        (method, _) => Err(unserved(method)),
    }
}

fn unserved(method: &str) -> ErrorBody {
    ErrorBody::new(
        ErrorCode::ProviderError,
        format!("`{method}` reached the files provider without file terms"),
    )
}

/// Confinement's view of a granted root.
pub(crate) fn root_spec(terms: &FileTerms) -> RootSpec<'_> {
    RootSpec {
        id: &terms.root,
        host_root: &terms.host_root,
        virtual_root: &terms.virtual_root,
        follow_symlinks: terms.follow_symlinks,
    }
}

/// Opens a granted root's directory for one request.
pub(crate) fn open_root(terms: &FileTerms) -> Result<Root, FileError> {
    Root::open(&root_spec(terms))
}

/// A confinement error as the wire says it.
pub(crate) fn error_body(error: FileError) -> ErrorBody {
    let code = match &error {
        FileError::NotFound(_) => ErrorCode::NotFound,
        FileError::Escapes(_) | FileError::Denied(_) => ErrorCode::PermissionDenied,
        FileError::Invalid(_) => ErrorCode::InvalidRequest,
        FileError::Io(_) => ErrorCode::ProviderError,
        FileError::Cancelled => ErrorCode::Cancelled,
    };
    ErrorBody::new(code, error.message())
}

/// A file operation's answer, once its thread is done with it.
async fn joined<T>(operation: JoinHandle<Result<T, FileError>>) -> Result<T, ErrorBody> {
    match operation.await {
        Ok(result) => result.map_err(error_body),
        Err(e) => {
            // A panic is a bug in the operation: its message is for the
            // operator's log, not for the peer.
            tracing::error!("a file operation failed: {e}");
            Err(ErrorBody::new(
                ErrorCode::ProviderError,
                "the file operation failed inside the gateway (see its log)",
            ))
        }
    }
}

async fn read(
    files: &Files,
    file: FileTerms,
    p: ReadParams,
    sink: StreamSink,
    usage: std::sync::Arc<Usage>,
    cancel: CancellationToken,
    max_result: usize,
) -> Result<Value, ErrorBody> {
    if p.stream {
        return read_stream(files, file, p, sink, cancel).await;
    }
    let host = file.host_root.clone();
    let op = move || {
        let root = open_root(&file)?;
        let (handle, size) = ops::open_read(&root, &file.path)?;
        let offset = p.offset.min(size);
        let available = size - offset;
        let mut result = json!({
            "path": root.virtual_path(&file.path),
            "size": size,
            "offset": offset,
        });
        let want = p
            .length
            .unwrap_or(MAX_INLINE_READ as u64)
            .min(available)
            .min(MAX_INLINE_READ as u64) as usize;
        let data = ops::read_at(&handle, offset, want)?;
        let at_eof = offset + (data.len() as u64) >= size;
        let budget = max_result.saturating_sub(RESULT_FIELDS);
        let (content, used) = fit_inline(&data, p.encoding.encoding, at_eof, budget)
            .map_err(|m| FileError::Invalid(format!("{}: {m}", root.virtual_path(&file.path))))?;
        usage.add_out(used);
        result["content"] = Value::String(content);
        result["encoding"] = json!(p.encoding.name);
        result["length"] = json!(used);
        result["eof"] = json!(offset + used as u64 >= size);
        Ok(result)
    };
    files.quick(&host, op).await
}

/// `file.read` with `stream`: the file is opened on a blocking thread,
/// then read chunk by chunk, each straight into the record that carries
/// it — on the runtime's worker when the page cache has the bytes
/// ([`ops::read_cached_into`]), else on a blocking thread — so a cached
/// file goes out without a hand-off between threads per chunk. A stream
/// waits for its reader: never on a quick thread.
async fn read_stream(
    files: &Files,
    file: FileTerms,
    p: ReadParams,
    sink: StreamSink,
    cancel: CancellationToken,
) -> Result<Value, ErrorBody> {
    let host = file.host_root.clone();
    let (handle, size, path) = files
        .blocking(&[&host], move || {
            let root = open_root(&file)?;
            let (handle, size) = ops::open_read(&root, &file.path)?;
            Ok((Arc::new(handle), size, root.virtual_path(&file.path)))
        })
        .await?;
    let offset = p.offset.min(size);
    let want = p.length.unwrap_or(size - offset).min(size - offset);
    let mut hasher = p.sha256.then(Sha256::new);
    let mut sent = 0u64;
    let mut progress = Progress::default();
    let mut try_cache = true;
    let gone = |_| error_body(FileError::Cancelled);
    while sent < want {
        if cancel.is_cancelled() {
            return Err(error_body(FileError::Cancelled));
        }
        let left = usize::try_from(want - sent).unwrap_or(usize::MAX);
        let mut chunk = sink.chunk_record(Channel::FileData, left);
        let (room, at) = (chunk.room(), offset + sent);
        let cached = match try_cache {
            true => ops::read_cached_into(&handle, at, room, chunk.buffer()),
            // Not tried: read on a blocking thread, as for a miss.
            false => CachedRead::Missing,
        };
        if cached == CachedRead::Unsupported {
            try_cache = false;
        }
        let n = match cached {
            CachedRead::Read(n) => n,
            CachedRead::Missing | CachedRead::Unsupported => {
                let handle = handle.clone();
                let n;
                (chunk, n) = files
                    .blocking(&[&host], move || {
                        let n = ops::read_at_into(&handle, at, room, chunk.buffer())?;
                        Ok((chunk, n))
                    })
                    .await?;
                n
            }
        };
        if n == 0 {
            break; // the file shrank meanwhile
        }
        if let Some(hasher) = &mut hasher {
            hasher.update(chunk.data());
            // Tens of microseconds a chunk: other sessions' tasks between.
            tokio::task::yield_now().await;
        }
        sent += n as u64;
        sink.record(chunk).await.map_err(gone)?;
        if progress.due() {
            let data = json!({"bytes_sent": sent, "bytes_total": want});
            sink.event("progress", data).await.map_err(gone)?;
        }
    }
    let mut result = json!({
        "path": path,
        "size": size,
        "offset": offset,
        "length": sent,
        "eof": offset + sent >= size,
    });
    if let Some(hasher) = hasher {
        result["sha256"] = json!(hex::encode(hasher.finalize()));
    }
    Ok(result)
}

/// `file.read` with `artifact`: the bytes asked for (`offset`, `length`)
/// go to the runtime's storage through [`Artifacts::upload`] and the
/// answer says where (`artifact`), in place of `content`.
async fn read_as_artifact(files: &Files, call: &Call) -> Result<Value, ErrorBody> {
    let Terms::File(file) = &call.terms else {
        return Err(unserved(&call.request.method));
    };
    let p: ReadParams = params(&call.request)?;
    let described = match p.artifact {
        Some(ArtifactAsk::Described(d)) => d,
        _ => ArtifactDescription::default(),
    };
    let Some(artifacts) = files.0.artifacts.clone() else {
        return Err(ErrorBody::new(
            ErrorCode::CapabilityUnavailable,
            "this gateway uploads no artifacts",
        ));
    };
    let (file, host) = (file.clone(), file.host_root.clone());
    let (handle, size, path) = files
        .quick(&host, move || {
            let root = open_root(&file)?;
            let (handle, size) = ops::open_read(&root, &file.path)?;
            Ok((handle, size, root.virtual_path(&file.path)))
        })
        .await?;
    let offset = p.offset.min(size);
    let length = p.length.unwrap_or(size - offset).min(size - offset);
    let mut metadata = described.metadata;
    metadata.insert("source".into(), json!("file.read"));
    metadata.insert("path".into(), json!(path));
    let upload = Upload {
        kind: described.kind.unwrap_or_else(|| "file".into()),
        mime_type: described
            .mime_type
            .unwrap_or_else(|| mime_type_of(&path).into()),
        metadata,
        size: length,
        source: Source::File {
            file: handle,
            offset,
        },
    };
    let artifact = artifacts.upload(call, upload).await?;
    call.usage
        .add_out(usize::try_from(length).unwrap_or(usize::MAX));
    Ok(json!({
        "path": path,
        "size": size,
        "offset": offset,
        "length": length,
        "eof": offset + length >= size,
        "artifact": artifact,
    }))
}

/// A MIME type from a file name's extension; bytes when it says nothing.
fn mime_type_of(path: &str) -> &'static str {
    let extension = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match extension.as_deref() {
        Some("txt" | "log" | "md") => "text/plain",
        Some("csv") => "text/csv",
        Some("html" | "htm") => "text/html",
        Some("json") => "application/json",
        Some("pdf") => "application/pdf",
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("svg") => "image/svg+xml",
        Some("zip") => "application/zip",
        Some("gz") => "application/gzip",
        Some("tar") => "application/x-tar",
        _ => "application/octet-stream",
    }
}

/// Content asked for as text that is not UTF-8.
#[derive(Debug, thiserror::Error)]
#[error("not UTF-8 text (byte {at}); read it with encoding base64")]
pub(crate) struct NotUtf8 {
    at: usize,
}

/// The length of `text` as a JSON string, quotes included, as serde_json
/// writes it: `"`, `\` and the short control escapes take two bytes,
/// other control characters six (`\u001f`). Counted, not written: a
/// command's output can be many MiB.
fn json_string_len(text: &str) -> usize {
    let extra = |b: u8| -> u16 {
        let escaped = u16::from(b < 0x20 || b == b'"' || b == b'\\');
        let long = u16::from(b < 0x20 && !matches!(b, b'\n' | b'\r' | b'\t' | 8 | 12));
        escaped + 4 * long
    };
    // Summed in u16 lanes per 4 KiB (at most 5 × 4096), which the
    // compiler vectorises; escapes are rare.
    let escapes: usize = text
        .as_bytes()
        .chunks(4096)
        .map(|chunk| usize::from(chunk.iter().fold(0u16, |sum, &b| sum + extra(b))))
        .sum();
    text.len() + 2 + escapes
}

/// The longest prefix of `data` whose encoding fits one response, as
/// (content, bytes of `data` used). UTF-8 is cut at a character boundary;
/// bytes that are not UTF-8 are an error that names the way out.
pub(crate) fn fit_inline(
    data: &[u8],
    encoding: Encoding,
    at_eof: bool,
    budget: usize,
) -> Result<(String, usize), NotUtf8> {
    match encoding {
        Encoding::Base64 => {
            let used = data.len().min(budget / 4 * 3);
            let content = base64::engine::general_purpose::STANDARD.encode(&data[..used]);
            Ok((content, used))
        }
        Encoding::Utf8 => {
            let mut text = match std::str::from_utf8(data) {
                Ok(text) => text,
                // Cut in the middle of a character by the length limit.
                Err(e) if e.error_len().is_none() && !at_eof => {
                    std::str::from_utf8(&data[..e.valid_up_to()]).unwrap_or_default()
                }
                Err(e) => {
                    return Err(NotUtf8 {
                        at: e.valid_up_to(),
                    });
                }
            };
            loop {
                let encoded = json_string_len(text);
                if encoded <= budget {
                    return Ok((text.to_string(), text.len()));
                }
                // Escapes made it too long: keep the part that fits.
                let mut cut = text.len() * budget / encoded;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                text = &text[..cut];
            }
        }
    }
}

#[derive(Deserialize)]
struct EditParams {
    edits: Vec<edit::Edit>,
}

/// `file.edit {path, edits: [{old_text, new_text, replace_all?}]}`: each
/// edit in order on the file's text; the file replaced atomically, or
/// left as it was when any edit does not apply.
async fn edit_file(
    files: &Files,
    file: FileTerms,
    p: EditParams,
    usage: std::sync::Arc<Usage>,
) -> Result<Value, ErrorBody> {
    if p.edits.is_empty() || p.edits.len() > edit::MAX_EDITS {
        return Err(ErrorBody::new(
            ErrorCode::InvalidRequest,
            format!("`edits` takes 1 to {} edits", edit::MAX_EDITS),
        ));
    }
    usage.add_in(
        p.edits
            .iter()
            .map(|e| e.old_text.len() + e.new_text.len())
            .sum(),
    );
    let host = file.host_root.clone();
    files.inline_write(&host, move || {
        let root = open_root(&file)?;
        let vpath = root.virtual_path(&file.path);
        let (handle, size) = ops::open_read(&root, &file.path)?;
        if size > edit::MAX_FILE {
            return Err(FileError::Invalid(format!(
                "{vpath}: {size} bytes; file.edit takes files of at most {} bytes (use file.write)",
                edit::MAX_FILE
            )));
        }
        let data = ops::read_at(&handle, 0, size as usize)?;
        let text = String::from_utf8(data)
            .map_err(|_| FileError::Invalid(format!("{vpath}: not UTF-8 text")))?;
        let (edited, replacements) = edit::apply(&text, &p.edits)
            .map_err(|why| FileError::Invalid(format!("{vpath}: {why}")))?;
        let mut out = AtomicFile::create(&root, &file.path, false, true)?;
        out.write(Bytes::from(edited))?;
        let mut result = out.commit()?;
        result["replacements"] = json!(replacements);
        Ok(result)
    })
    .await
}

async fn write(
    files: &Files,
    file: FileTerms,
    p: WriteParams,
    append: bool,
    input: Option<mpsc::Receiver<Bytes>>,
    usage: std::sync::Arc<Usage>,
) -> Result<Value, ErrorBody> {
    let inline = match (&p.content, p.stream) {
        (Some(content), false) => Some(match p.encoding {
            Encoding::Utf8 => content.clone().into_bytes(),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(content)
                .map_err(|e| ErrorBody::new(ErrorCode::InvalidRequest, format!("content: {e}")))?,
        }),
        (None, true) => None,
        (Some(_), true) => {
            return Err(ErrorBody::new(
                ErrorCode::InvalidRequest,
                "give either `content` or `stream: true`, not both",
            ));
        }
        (None, false) => {
            return Err(ErrorBody::new(
                ErrorCode::InvalidRequest,
                "`content` is required (or `stream: true` and the data as chunks on channel 4)",
            ));
        }
    };
    let host = file.host_root.clone();
    let Some(data) = inline else {
        let Some(input) = input else {
            return Err(error_body(FileError::Io("the upload has no input".into())));
        };
        return streamed_write(files, file, p, append, input).await;
    };
    usage.add_in(data.len());
    files
        .inline_write(&host, move || {
            let root = open_root(&file)?;
            let mut sink = open_sink(&root, &file.path, append, &p)?;
            sink.put(Bytes::from(data))?;
            sink.finish()
        })
        .await
}

/// Where `file.write` or `file.append` of `path` puts its bytes.
fn open_sink(
    root: &Root,
    path: &str,
    append: bool,
    p: &WriteParams,
) -> Result<Box<dyn Sink + Send>, FileError> {
    Ok(if append {
        Box::new(Appender::open(root, path, p.sha256)?)
    } else {
        Box::new(AtomicFile::create(root, path, p.create_parents, p.sha256)?)
    })
}

/// A streamed upload (`stream: true`): it waits for its client's chunks on
/// the runtime and takes a thread of the main blocking pool (within the
/// root's share) only to write what has arrived. So uploads whose client
/// sends slowly, or nothing at all, hold no thread and no share, however
/// many a principal opens.
async fn streamed_write(
    files: &Files,
    file: FileTerms,
    p: WriteParams,
    append: bool,
    mut input: mpsc::Receiver<Bytes>,
) -> Result<Value, ErrorBody> {
    let host = file.host_root.clone();
    let opened = files
        .blocking(&[&host], move || {
            let root = open_root(&file)?;
            Ok(Incoming {
                sink: open_sink(&root, &file.path, append, &p)?,
                vpath: root.virtual_path(&file.path),
                size: p.size,
            })
        })
        .await?;
    let mut parked = Parked {
        files: files.clone(),
        host: host.clone(),
        upload: Some(opened),
    };
    loop {
        // `None`: cancelled or the session ended; the parked upload is
        // dropped (its partial file removed) off the runtime.
        let chunk = input
            .recv()
            .await
            .ok_or_else(|| error_body(FileError::Cancelled))?;
        let Some(upload) = parked.upload.take() else {
            return Err(error_body(FileError::Io("the upload was lost".into())));
        };
        match files
            .blocking(&[&host], move || upload.write(chunk, input))
            .await?
        {
            Written::More(upload, rest) => {
                parked.upload = Some(upload);
                input = rest;
            }
            Written::Done(result) => return Ok(result),
        }
    }
}

/// A streamed upload's file and what it must come to.
struct Incoming {
    sink: Box<dyn Sink + Send>,
    vpath: String,
    /// The size the client said the upload has.
    size: Option<u64>,
}

/// What [`Incoming::write`] left: an upload waiting for more, or its result.
enum Written {
    More(Incoming, mpsc::Receiver<Bytes>),
    Done(Value),
}

impl Incoming {
    /// Writes `chunk` and every chunk already queued behind it, so a client
    /// that sends faster than the disk takes keeps its thread; the empty
    /// chunk that ends an upload finishes it. An error drops the sink here,
    /// on the blocking thread, which removes the partial file.
    fn write(
        mut self,
        first: Bytes,
        mut input: mpsc::Receiver<Bytes>,
    ) -> Result<Written, FileError> {
        let mut chunk = first;
        loop {
            if chunk.is_empty() {
                return self.finish().map(Written::Done);
            }
            if self
                .size
                .is_some_and(|size| self.sink.size() + chunk.len() as u64 > size)
            {
                return Err(too_long(&self.vpath, self.size));
            }
            self.sink.put(chunk)?;
            chunk = match input.try_recv() {
                Ok(next) => next,
                Err(mpsc::error::TryRecvError::Empty) => return Ok(Written::More(self, input)),
                Err(mpsc::error::TryRecvError::Disconnected) => return Err(FileError::Cancelled),
            };
        }
    }

    fn finish(self) -> Result<Value, FileError> {
        if let Some(size) = self.size
            && self.sink.size() != size
        {
            return Err(FileError::Invalid(format!(
                "{}: {} bytes arrived, `size` said {size}; nothing was written",
                self.vpath,
                self.sink.size()
            )));
        }
        self.sink.finish()
    }
}

/// An upload between its chunks. Should the request end there (cancelled
/// past its grace, the session gone), the upload is dropped on a blocking
/// thread within the root's share: removing its partial file is a system
/// call on a file system that may hang, never for a runtime worker.
struct Parked {
    files: Files,
    host: PathBuf,
    upload: Option<Incoming>,
}

impl Drop for Parked {
    fn drop(&mut self) {
        let Some(upload) = self.upload.take() else {
            return;
        };
        let (files, host) = (self.files.clone(), std::mem::take(&mut self.host));
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ = files
                        .blocking(&[&host], move || {
                            drop(upload);
                            Ok(())
                        })
                        .await;
                });
            }
            Err(_) => drop(upload),
        }
    }
}

fn too_long(vpath: &str, size: Option<u64>) -> FileError {
    FileError::Invalid(format!(
        "{vpath}: more data than `size` ({}) said; nothing was written",
        size.unwrap_or(0)
    ))
}

/// Where a write's bytes go: an atomic replacement or an append.
trait Sink {
    fn put(&mut self, data: Bytes) -> Result<(), FileError>;
    fn size(&self) -> u64;
    fn finish(self: Box<Self>) -> Result<Value, FileError>;
}

impl Sink for AtomicFile {
    fn put(&mut self, data: Bytes) -> Result<(), FileError> {
        self.write(data)
    }

    fn size(&self) -> u64 {
        AtomicFile::size(self)
    }

    fn finish(self: Box<Self>) -> Result<Value, FileError> {
        self.commit()
    }
}

struct Appender {
    file: std::fs::File,
    vpath: String,
    hash: Option<ops::HashPipe>,
    size: u64,
}

impl Appender {
    fn open(root: &Root, path: &str, hash: bool) -> Result<Self, FileError> {
        Ok(Self {
            file: ops::open_append(root, path)?,
            vpath: root.virtual_path(path),
            hash: hash.then(ops::HashPipe::new),
            size: 0,
        })
    }
}

impl Sink for Appender {
    fn put(&mut self, data: Bytes) -> Result<(), FileError> {
        use std::io::Write as _;
        let vpath = &self.vpath;
        self.file
            .write_all(&data)
            .map_err(|e| ops::io_error(vpath, e))?;
        self.size += data.len() as u64;
        if let Some(hash) = &mut self.hash {
            hash.update(data);
        }
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn finish(self: Box<Self>) -> Result<Value, FileError> {
        let vpath = &self.vpath;
        self.file.sync_data().map_err(|e| ops::io_error(vpath, e))?;
        let mut result = json!({ "path": self.vpath, "appended": self.size });
        if let Some(hash) = self.hash {
            result["sha256"] = json!(hash.finish()?);
        }
        Ok(result)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A rw root at `dir`, as the policy's terms name it.
    pub(crate) fn terms(dir: &std::path::Path, follow: bool) -> FileTerms {
        FileTerms {
            root: "main".into(),
            path: String::new(),
            mode: portcullis_policy::Mode::Rw,
            host_root: dir.to_path_buf(),
            virtual_root: "/workspace/main".into(),
            follow_symlinks: follow,
        }
    }

    /// A panicking operation answers with an error, and the quick threads
    /// keep serving: more panics than threads, then results again.
    #[tokio::test]
    async fn a_panic_is_an_error_and_the_quick_threads_go_on() {
        let limit = std::time::Duration::from_secs(10);
        let files = Files::new();
        for _ in 0..pools::QUICK_THREADS + 2 {
            let answer = files.quick(Path::new("/"), || -> Result<(), FileError> {
                panic!("a bug")
            });
            let answer = tokio::time::timeout(limit, answer)
                .await
                .expect("no thread serves the quick operations any more");
            let error = answer.expect_err("a panic must not look like success");
            assert_eq!(error.code, ErrorCode::ProviderError);
            assert!(!error.message.contains("a bug"), "{}", error.message);
        }
        let all = futures_util::future::join_all(
            (0..64u32).map(|i| files.quick(Path::new("/"), move || Ok(i * 2))),
        );
        let answers = tokio::time::timeout(limit, all)
            .await
            .expect("no thread serves the quick operations any more");
        let doubled: Vec<u32> = answers.into_iter().map(|a| a.unwrap()).collect();
        assert_eq!(doubled, (0..64).map(|i| i * 2).collect::<Vec<_>>());
    }

    /// Streamed uploads wait for their client on the main blocking pool:
    /// more of them waiting than there are write threads leave inline
    /// writes going, and more inline writes than threads all land.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiting_uploads_leave_the_write_threads_to_inline_writes() {
        let limit = std::time::Duration::from_secs(20);
        let dir = tempfile::tempdir().unwrap();
        let files = Files::new();
        let usage = Arc::new(Usage::default());
        let target = |name: String| FileTerms {
            path: name,
            ..terms(dir.path(), false)
        };
        let mut uploads = Vec::new();
        for i in 0..pools::WRITE_THREADS + 2 {
            let (tx, rx) = mpsc::channel(4);
            let p: WriteParams = serde_json::from_value(json!({"stream": true})).unwrap();
            let (files, file, usage) =
                (files.clone(), target(format!("upload-{i}")), usage.clone());
            let upload =
                tokio::spawn(async move { write(&files, file, p, false, Some(rx), usage).await });
            uploads.push((tx, upload));
        }
        let inline = futures_util::future::join_all((0..3 * pools::WRITE_THREADS).map(|i| {
            let p: WriteParams =
                serde_json::from_value(json!({"content": format!("{i}\n")})).unwrap();
            write(
                &files,
                target(format!("inline-{i}")),
                p,
                false,
                None,
                usage.clone(),
            )
        }));
        let answers = tokio::time::timeout(limit, inline)
            .await
            .expect("inline writes waited behind uploads that wait for their client");
        for (i, answer) in answers.into_iter().enumerate() {
            let result = answer.unwrap();
            let expected = hex::encode(Sha256::digest(format!("{i}\n")));
            assert_eq!(result["sha256"], json!(expected));
            let written = std::fs::read_to_string(dir.path().join(format!("inline-{i}"))).unwrap();
            assert_eq!(written, format!("{i}\n"));
        }
        for (i, (tx, upload)) in uploads.into_iter().enumerate() {
            tx.send(Bytes::from(format!("up {i}"))).await.unwrap();
            tx.send(Bytes::new()).await.unwrap();
            let result = tokio::time::timeout(limit, upload)
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert_eq!(result["size"], json!(format!("up {i}").len()));
            let written = std::fs::read_to_string(dir.path().join(format!("upload-{i}"))).unwrap();
            assert_eq!(written, format!("up {i}"));
        }
    }

    /// The entries of `dir` once there are `n` of them (within 20 s).
    async fn entries_become(dir: &Path, n: usize) -> usize {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let count = std::fs::read_dir(dir).unwrap().count();
            if count == n || std::time::Instant::now() > deadline {
                return count;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Streamed uploads whose client sends nothing hold no thread and no
    /// share: more of them on one root than its share of the main pool
    /// leave that root's other operations going.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn uploads_waiting_for_their_client_hold_no_thread() {
        let limit = std::time::Duration::from_secs(20);
        let dir = tempfile::tempdir().unwrap();
        let files = Files::new();
        let usage = Arc::new(Usage::default());
        let waiting = pools::BLOCKING_THREADS / 2 + 8;
        let mut uploads = Vec::new();
        for i in 0..waiting {
            let (tx, rx) = mpsc::channel(4);
            let p: WriteParams = serde_json::from_value(json!({"stream": true})).unwrap();
            let file = FileTerms {
                path: format!("upload-{i}"),
                ..terms(dir.path(), false)
            };
            let (files, usage) = (files.clone(), usage.clone());
            let upload =
                tokio::spawn(async move { write(&files, file, p, false, Some(rx), usage).await });
            uploads.push((tx, upload));
        }
        // Every upload has made its partial file and waits for data.
        assert_eq!(entries_become(dir.path(), waiting).await, waiting);
        let root = [dir.path()];
        let listed = files.blocking(&root, || Ok(1));
        let listed = tokio::time::timeout(limit, listed)
            .await
            .expect("the root's operations waited behind uploads that wait for their client");
        assert_eq!(listed.unwrap(), 1);
        for (i, (tx, upload)) in uploads.into_iter().enumerate() {
            for part in [format!("up {i}, "), "then more".to_string()] {
                tx.send(Bytes::from(part)).await.unwrap();
                tokio::task::yield_now().await;
            }
            tx.send(Bytes::new()).await.unwrap();
            let result = tokio::time::timeout(limit, upload)
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            let expected = format!("up {i}, then more");
            assert_eq!(result["size"], json!(expected.len()));
            assert_eq!(
                result["sha256"],
                json!(hex::encode(Sha256::digest(&expected)))
            );
            let written = std::fs::read_to_string(dir.path().join(format!("upload-{i}"))).unwrap();
            assert_eq!(written, expected);
        }
    }

    /// An upload whose request ends between chunks (its task dropped, as
    /// past a cancel's grace) still removes its partial file.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_upload_dropped_between_chunks_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::new();
        let (tx, rx) = mpsc::channel(4);
        let p: WriteParams = serde_json::from_value(json!({"stream": true})).unwrap();
        let file = FileTerms {
            path: "partial.bin".into(),
            ..terms(dir.path(), false)
        };
        let usage = Arc::new(Usage::default());
        let upload =
            tokio::spawn(async move { write(&files, file, p, false, Some(rx), usage).await });
        tx.send(Bytes::from(vec![7u8; 100_000])).await.unwrap();
        assert_eq!(entries_become(dir.path(), 1).await, 1);
        upload.abort();
        assert!(upload.await.unwrap_err().is_cancelled());
        assert_eq!(
            entries_become(dir.path(), 0).await,
            0,
            "the partial file stayed (the sender is still open)"
        );
        drop(tx);
    }

    /// An upload's chunks land whole and in order whether they arrive one
    /// at a time or many together, across the hand-offs between the runtime
    /// and the pool; more than `size` said ends it and leaves no file.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn chunks_across_hand_offs_land_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::new();
        let usage = Arc::new(Usage::default());
        let chunks: Vec<Vec<u8>> = (0..27).map(|i| vec![i as u8; 1 + i * 997]).collect();
        let expected: Vec<u8> = chunks.concat();
        for (name, size, spaced) in [
            ("spaced.bin", expected.len(), true),
            ("together.bin", expected.len(), false),
            ("too-long.bin", expected.len() - 1, true),
        ] {
            let (tx, rx) = mpsc::channel(16);
            let p: WriteParams =
                serde_json::from_value(json!({"stream": true, "size": size})).unwrap();
            let file = FileTerms {
                path: name.into(),
                ..terms(dir.path(), false)
            };
            let (files, usage) = (files.clone(), usage.clone());
            let upload =
                tokio::spawn(async move { write(&files, file, p, false, Some(rx), usage).await });
            for chunk in chunks.iter().chain([&Vec::new()]) {
                if tx.send(Bytes::from(chunk.clone())).await.is_err() {
                    break; // the upload ended early
                }
                if spaced {
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            }
            let answer = upload.await.unwrap();
            let path = dir.path().join(name);
            if size == expected.len() {
                let result = answer.unwrap();
                assert_eq!(result["size"], json!(expected.len()), "{name}");
                assert_eq!(std::fs::read(&path).unwrap(), expected, "{name}");
            } else {
                let error = answer.unwrap_err();
                assert!(error.message.contains("more data than `size`"), "{error:?}");
                assert!(!path.exists(), "{name} was left behind");
            }
        }
        assert_eq!(
            entries_become(dir.path(), 2).await,
            2,
            "a partial file stayed"
        );
    }

    #[tokio::test]
    async fn an_operations_error_keeps_its_code() {
        let files = Files::new();
        let answer = files
            .quick(Path::new("/"), || -> Result<(), FileError> {
                Err(FileError::Cancelled)
            })
            .await;
        assert_eq!(
            answer.unwrap_err().code,
            error_body(FileError::Cancelled).code
        );
    }

    #[test]
    fn inline_text_fits_one_record_and_cuts_at_characters() {
        let text = "é".repeat(40_000); // 80,000 bytes
        let (content, used) =
            fit_inline(text.as_bytes(), Encoding::Utf8, false, RESPONSE_BUDGET).unwrap();
        assert!(serde_json::to_string(&content).unwrap().len() <= RESPONSE_BUDGET);
        assert_eq!(used, content.len());
        assert!(used % 2 == 0, "never half a character");
        // Escapes take six bytes each: fewer characters fit.
        let controls = vec![1u8; 30_000];
        let (content, used) =
            fit_inline(&controls, Encoding::Utf8, false, RESPONSE_BUDGET).unwrap();
        assert!(serde_json::to_string(&content).unwrap().len() <= RESPONSE_BUDGET);
        assert!(used < 30_000 && used > 9_000, "{used}");
        // A character cut by the length limit is left for the next read.
        let (_, used) = fit_inline(
            &"aé".as_bytes()[..2],
            Encoding::Utf8,
            false,
            RESPONSE_BUDGET,
        )
        .unwrap();
        assert_eq!(used, 1);
        assert!(fit_inline(&[0xff, 0x41], Encoding::Utf8, false, RESPONSE_BUDGET).is_err());
        assert!(fit_inline(&"aé".as_bytes()[..2], Encoding::Utf8, true, RESPONSE_BUDGET).is_err());
        let (content, used) =
            fit_inline(&[0xff; 100_000], Encoding::Base64, false, RESPONSE_BUDGET).unwrap();
        assert!(content.len() <= RESPONSE_BUDGET);
        assert_eq!(used, RESPONSE_BUDGET / 4 * 3);
    }

    proptest::proptest! {
        /// Counted as serde_json writes it, for any text (controls, quotes,
        /// backslashes, DEL and non-ASCII included).
        #[test]
        fn a_json_string_is_as_long_as_counted(text in "[\\x00-\\x7f\"\\\\é✓]{0,300}") {
            proptest::prop_assert_eq!(
                json_string_len(&text),
                serde_json::to_string(&text).unwrap().len()
            );
        }
    }
}
