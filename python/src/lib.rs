//! `portcullis._native`: the Rust client ([`portcullis_client`]) for
//! asyncio. The Python package (`python/portcullis/`) is the API people
//! use; this module is its engine and stays small: connect (or accept a
//! gateway that dials in), requests with their streams and cancel, events,
//! ping, and file transfers that never pass through Python.
//!
//! The boundary speaks JSON text (params, results, stream data, events),
//! which the package turns into Python objects with `json` (C speed); bytes
//! (output chunks, file data) cross as `bytes`. Every awaitable is a tokio
//! future made a Python one by `pyo3-async-runtimes`; when the awaiting
//! asyncio task is cancelled that future is dropped, and dropping a
//! request's future before its answer sends the gateway `cancel`.
//!
//! Errors become the package's exception classes (`portcullis.errors`,
//! one per relay error code) under the GIL, when the answer is handed to
//! Python — never on a tokio thread.
//!
//! Unsafe code: PyO3's macros expand to FFI glue that uses `unsafe`, so
//! this one crate cannot `forbid` it as the workspace does; it writes none
//! itself (`deny` below still catches any hand-written block outside a
//! macro expansion).

#![deny(unsafe_op_in_unsafe_fn)]

mod exit;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use pyo3::{IntoPyObjectExt, PyErr};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use zeroize::Zeroizing;

use portcullis_client::{Client as RustClient, ClientError, ClientOptions, StreamItem, config};
use portcullis_crypto::{PublicKey, StaticKeypair};
use portcullis_wire::frame::{Cancel, Frame, RequestContext, RequestId};
use portcullis_wire::keyfile;
use portcullis_wire::record::{Channel, ChunkRecord};

/// Stream items held for a reader before the request's forwarding task
/// waits (and with it, the connection's reader: a stream nobody reads
/// would otherwise hold memory without bound).
const CALL_QUEUE: usize = 64;
/// Transfer progress is reported at most this often (a callback takes
/// the GIL).
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// A failure on its way to Python: turned into the package's exception
/// class when the answer is handed over, under the GIL.
enum Failure {
    Client(ClientError),
    Local(String),
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        Self::Client(e)
    }
}

impl Failure {
    fn into_py_err(self, py: Python<'_>) -> PyErr {
        let (kind, code, message, details, recoverable) = match self {
            Failure::Client(ClientError::Remote(body)) => (
                "remote",
                body.code.as_str().to_string(),
                body.message,
                body.details.map(|d| d.to_string()),
                body.recoverable,
            ),
            Failure::Client(ClientError::Timeout) => (
                "timeout",
                String::new(),
                "timed out".into(),
                None,
                true,
            ),
            Failure::Client(e @ ClientError::Disconnected(_)) => {
                ("disconnected", String::new(), e.to_string(), None, true)
            }
            Failure::Client(
                e @ (ClientError::Connect { .. }
                | ClientError::Upgrade(_)
                | ClientError::Tls(_)
                | ClientError::TlsSetup(_)
                | ClientError::Url(_)
                // Only the handshake and the hello return it.
                | ClientError::Channel(_)),
            ) => ("connect", String::new(), e.to_string(), None, false),
            Failure::Client(e) => ("protocol", String::new(), e.to_string(), None, false),
            Failure::Local(message) => ("local", String::new(), message, None, false),
        };
        let made = py
            .import("portcullis.errors")
            .and_then(|m| m.getattr("_from_native"))
            .and_then(|f| f.call1((kind, code, message.clone(), details, recoverable)));
        match made {
            Ok(exception) => PyErr::from_value(exception),
            // The package is not importable (the module used alone): still
            // an error with the message.
            Err(_) => PyRuntimeError::new_err(message),
        }
    }
}

/// A future's answer: the value, or the failure, converted for Python
/// where the GIL is held anyway.
struct Answer<T>(Result<T, Failure>);

impl<'py, T: IntoPyObject<'py>> IntoPyObject<'py> for Answer<T> {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self.0 {
            Ok(value) => value.into_bound_py_any(py),
            Err(failure) => Err(failure.into_py_err(py)),
        }
    }
}

/// Runs `fut` as an asyncio awaitable.
fn awaitable<'py, T, F>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, Failure>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    // The tokio runtime, with the hand-over to Python gated for exit.
    pyo3_async_runtimes::generic::future_into_py::<exit::Counted, _, _>(py, async move {
        Ok(Answer(fut.await))
    })
}

fn parse_json(what: &str, text: Option<&str>) -> PyResult<Value> {
    match text {
        None => Ok(Value::Null),
        Some(text) => serde_json::from_str(text)
            .map_err(|e| PyValueError::new_err(format!("{what} is not JSON: {e}"))),
    }
}

fn parse_context(text: Option<&str>) -> PyResult<Option<RequestContext>> {
    match text {
        None => Ok(None),
        Some(text) => serde_json::from_str(text)
            .map(Some)
            .map_err(|e| PyValueError::new_err(format!("context: {e}"))),
    }
}

fn parse_key(text: &str) -> PyResult<PublicKey> {
    PublicKey::from_base64(text.trim())
        .map_err(|e| PyValueError::new_err(format!("gateway_key: {e}")))
}

fn load_identity(path: Option<PathBuf>, config_dir: Option<&PathBuf>) -> PyResult<StaticKeypair> {
    match (path, config_dir) {
        (Some(path), _) => keyfile::load(&path)
            .map_err(|e| PyValueError::new_err(format!("identity {}: {e}", path.display()))),
        (None, Some(dir)) => {
            config::identity(dir).map_err(|e| PyValueError::new_err(e.to_string()))
        }
        (None, None) => Err(PyValueError::new_err(
            "no identity: pass identity=PATH (a key file) or set HOME for ~/.config/portcullis",
        )),
    }
}

/// Sends `cancel` for a request when dropped before its answer arrived:
/// how an asyncio task's cancellation reaches the gateway.
struct CancelOnDrop {
    client: Arc<RustClient>,
    id: Option<RequestId>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let client = Arc::clone(&self.client);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let reason = Some("cancelled by the Python caller".into());
                let _ = client.send(Frame::Cancel(Cancel { id, reason })).await;
            });
        }
    }
}

/// A connection to a gateway.
#[pyclass(frozen, module = "portcullis._native")]
struct Client {
    inner: Arc<RustClient>,
}

struct ConnectArgs {
    url: String,
    gateway_key: Option<String>,
    identity: Option<PathBuf>,
    token: Option<String>,
    tls_ca: Option<PathBuf>,
    timeout: f64,
    config_dir: Option<PathBuf>,
    remember: bool,
}

fn client_options(args: ConnectArgs) -> PyResult<(ClientOptions, Option<(PathBuf, PublicKey)>)> {
    let config_dir = args.config_dir.or_else(config::dir);
    let (key, remember) = match (&args.gateway_key, &config_dir) {
        (Some(text), _) => {
            let key = parse_key(text)?;
            let remember = match (&config_dir, args.remember) {
                (Some(dir), true) => Some((dir.clone(), key)),
                _ => None,
            };
            (key, remember)
        }
        (None, Some(dir)) => match config::remembered_key(dir, &args.url)
            .map_err(|e| PyValueError::new_err(e.to_string()))?
        {
            Some(key) => (key, None),
            None => {
                return Err(PyValueError::new_err(format!(
                    "no gateway key for {}: pass gateway_key= once (it is then remembered in {})",
                    args.url,
                    dir.join("gateways.toml").display()
                )));
            }
        },
        (None, None) => return Err(PyValueError::new_err("gateway_key is required")),
    };
    let identity = match (&args.token, args.identity) {
        // A token authenticates; the key only runs the handshake.
        (Some(_), None) => StaticKeypair::generate()
            .map_err(|e| PyRuntimeError::new_err(format!("cannot make a key: {e}")))?,
        (_, identity) => load_identity(identity, config_dir.as_ref())?,
    };
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        return Err(PyValueError::new_err(
            "timeout must be a positive number of seconds",
        ));
    }
    let mut options = ClientOptions::new(&args.url, key, identity);
    options.token = args.token.map(Zeroizing::new);
    options.tls_ca = args.tls_ca;
    options.timeout = Duration::from_secs_f64(args.timeout);
    Ok((options, remember))
}

#[pymethods]
impl Client {
    /// Connects and reads the gateway's hello (see `portcullis.connect`).
    #[staticmethod]
    #[pyo3(signature = (url, gateway_key=None, identity=None, token=None, tls_ca=None, timeout=10.0, config_dir=None, remember=true))]
    #[allow(clippy::too_many_arguments)]
    fn connect(
        py: Python<'_>,
        url: String,
        gateway_key: Option<String>,
        identity: Option<PathBuf>,
        token: Option<String>,
        tls_ca: Option<PathBuf>,
        timeout: f64,
        config_dir: Option<PathBuf>,
        remember: bool,
    ) -> PyResult<Bound<'_, PyAny>> {
        let (options, remember) = client_options(ConnectArgs {
            url: url.clone(),
            gateway_key,
            identity,
            token,
            tls_ca,
            timeout,
            config_dir,
            remember,
        })?;
        awaitable(py, async move {
            let inner = RustClient::connect(options).await?;
            if let Some((dir, key)) = remember {
                config::remember(&dir, &url, &key).map_err(|e| Failure::Local(e.to_string()))?;
            }
            Ok(Client {
                inner: Arc::new(inner),
            })
        })
    }

    /// The gateway's hello, JSON text.
    #[getter]
    fn hello(&self) -> String {
        serde_json::to_string(self.inner.hello()).unwrap_or_default()
    }

    /// The gateway's description from the handshake, JSON text.
    #[getter]
    fn gateway_info(&self) -> String {
        self.inner.gateway_info().to_string()
    }

    /// Events lost in all because nobody read them fast enough.
    #[getter]
    fn events_lost(&self) -> u64 {
        self.inner.events_lost()
    }

    /// Sends `relay.accepted` for `capabilities`, output as `chunks` or
    /// `frames`.
    #[pyo3(signature = (capabilities, output="chunks".to_string()))]
    fn accept<'py>(
        &self,
        py: Python<'py>,
        capabilities: Vec<String>,
        output: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = Arc::clone(&self.inner);
        awaitable(py, async move {
            let names: Vec<&str> = capabilities.iter().map(String::as_str).collect();
            client.accept_output(&names, &output).await?;
            Ok(())
        })
    }

    /// One request; its result as JSON text. Stream items are dropped.
    /// Cancelling the awaiting task sends `cancel`.
    #[pyo3(signature = (method, params=None, context=None))]
    fn request<'py>(
        &self,
        py: Python<'py>,
        method: String,
        params: Option<&str>,
        context: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let params = parse_json("params", params)?;
        let context = parse_context(context)?;
        let client = Arc::clone(&self.inner);
        awaitable(py, async move {
            let handle = open(&client, &method, params, context).await?;
            let mut guard = CancelOnDrop {
                client: Arc::clone(&client),
                id: Some(handle.id.clone()),
            };
            let result = handle.response().await;
            guard.id = None;
            Ok(result?.to_string())
        })
    }

    /// Starts a request whose stream is read (`Call.next`), that sends
    /// chunks (`Call.send`), or both.
    #[pyo3(signature = (method, params=None, context=None))]
    fn start<'py>(
        &self,
        py: Python<'py>,
        method: String,
        params: Option<&str>,
        context: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let params = parse_json("params", params)?;
        let context = parse_context(context)?;
        let client = Arc::clone(&self.inner);
        awaitable(py, async move {
            let (started_tx, started) = oneshot::channel();
            let (items_tx, items) = mpsc::channel(CALL_QUEUE);
            let (answer_tx, answer) = oneshot::channel();
            let (cancel_tx, cancel_rx) = oneshot::channel();
            tokio::spawn(forward(
                Arc::clone(&client),
                method,
                params,
                context,
                started_tx,
                items_tx,
                answer_tx,
                cancel_rx,
            ));
            let id = started
                .await
                .map_err(|_| Failure::Local("the request's task ended".into()))??;
            Ok(Call {
                client,
                id,
                items: Arc::new(tokio::sync::Mutex::new(Some(items))),
                answer: Arc::new(tokio::sync::Mutex::new(Some(answer))),
                cancel: Mutex::new(Some(cancel_tx)),
            })
        })
    }

    /// A relay ping; the round trip in seconds.
    fn ping<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = Arc::clone(&self.inner);
        awaitable(py, async move { Ok(client.ping().await?.as_secs_f64()) })
    }

    /// The next event as JSON text `{"event", "payload"}`, or None after
    /// `timeout` seconds (None: wait until one comes or the connection
    /// ends).
    #[pyo3(signature = (timeout=None))]
    fn next_event<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = Arc::clone(&self.inner);
        let wait = match timeout {
            Some(t) if t.is_finite() && t >= 0.0 => Duration::from_secs_f64(t),
            Some(_) => return Err(PyValueError::new_err("timeout must be >= 0")),
            // A day at a time: the loop below is the "forever".
            None => Duration::from_secs(86_400),
        };
        let forever = timeout.is_none();
        awaitable(py, async move {
            loop {
                tokio::select! {
                    event = client.next_event(wait) => match event {
                        Some(event) => {
                            return Ok(Some(serde_json::to_string(&event).unwrap_or_default()));
                        }
                        None if forever => continue,
                        None => return Ok(None),
                    },
                    reason = client.closed() => {
                        // Whatever was queued before the end is still read.
                        if let Some(event) = client.next_event(Duration::ZERO).await {
                            return Ok(Some(serde_json::to_string(&event).unwrap_or_default()));
                        }
                        return Err(ClientError::Disconnected(reason).into());
                    }
                }
            }
        })
    }

    /// Streams ROOT:PATH into the local file `local`; the result as JSON.
    #[pyo3(signature = (root, path, local, sha256=true, progress=None))]
    fn download<'py>(
        &self,
        py: Python<'py>,
        root: String,
        path: String,
        local: PathBuf,
        sha256: bool,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = Arc::clone(&self.inner);
        awaitable(py, async move {
            let out = std::fs::File::create(&local)
                .map_err(|e| Failure::Local(format!("{}: {e}", local.display())))?;
            let mut report = Progress::new(progress);
            let (result, _file) = client
                .download(&root, &path, out, sha256, &mut |n| report.tick(n))
                .await?;
            report.finish();
            Ok(result.to_string())
        })
    }

    /// Uploads the local file `local` to ROOT:PATH; the result as JSON.
    #[pyo3(signature = (local, root, path, append=false, sha256=true, progress=None))]
    #[allow(clippy::too_many_arguments)]
    fn upload<'py>(
        &self,
        py: Python<'py>,
        local: PathBuf,
        root: String,
        path: String,
        append: bool,
        sha256: bool,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = Arc::clone(&self.inner);
        awaitable(py, async move {
            let input = std::fs::File::open(&local)
                .map_err(|e| Failure::Local(format!("{}: {e}", local.display())))?;
            let size = input.metadata().ok().map(|m| m.len());
            let options = portcullis_client::UploadOptions {
                size,
                append,
                sha256,
            };
            let mut report = Progress::new(progress);
            let result = client
                .upload(&root, &path, input, options, &mut |n| report.tick(n))
                .await?;
            report.finish();
            Ok(result.to_string())
        })
    }

    /// Resolves with the reason once the connection has ended.
    fn closed<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let client = Arc::clone(&self.inner);
        awaitable(py, async move { Ok(client.closed().await) })
    }

    /// Closes the connection now; waiting requests fail as disconnected.
    fn close(&self) {
        self.inner.close();
    }
}

/// Reports transfer progress to a Python callable, at most every
/// [`PROGRESS_EVERY`], and once at the end.
struct Progress {
    callback: Option<Py<PyAny>>,
    last: Instant,
    done: u64,
    reported: u64,
}

impl Progress {
    fn new(callback: Option<Py<PyAny>>) -> Self {
        Self {
            callback,
            last: Instant::now(),
            done: 0,
            reported: 0,
        }
    }

    fn tick(&mut self, done: u64) {
        self.done = done;
        if self.last.elapsed() >= PROGRESS_EVERY {
            self.report();
        }
    }

    fn finish(&mut self) {
        if self.done != self.reported {
            self.report();
        }
    }

    fn report(&mut self) {
        self.last = Instant::now();
        self.reported = self.done;
        if let Some(callback) = &self.callback {
            let done = self.done;
            // Not at all once the interpreter is exiting (`exit`).
            exit::with_python(|| {
                Python::attach(|py| {
                    // A callback that raises is reported, not fatal to the
                    // transfer.
                    if let Err(e) = callback.call1(py, (done,)) {
                        e.print(py);
                    }
                })
            });
        }
    }
}

/// Sends a request, with the runtime's context when it has one.
async fn open<'c>(
    client: &'c RustClient,
    method: &str,
    params: Value,
    context: Option<RequestContext>,
) -> Result<portcullis_client::RequestHandle<'c>, ClientError> {
    match context {
        Some(context) => client.start_with_context(context, method, params).await,
        None => client.start(method, params).await,
    }
}

/// Started request: sends it, tells the caller its id, hands stream items
/// to the reader (or drops them once nobody reads), sends `cancel` when
/// asked, and hands over the answer.
#[allow(clippy::too_many_arguments)]
async fn forward(
    client: Arc<RustClient>,
    method: String,
    params: Value,
    context: Option<RequestContext>,
    started: oneshot::Sender<Result<String, Failure>>,
    items: mpsc::Sender<StreamItem>,
    answer: oneshot::Sender<Result<Value, ClientError>>,
    mut cancel: oneshot::Receiver<()>,
) {
    let mut handle = match open(&client, &method, params, context).await {
        Ok(handle) => handle,
        Err(e) => {
            let _ = started.send(Err(e.into()));
            return;
        }
    };
    let _ = started.send(Ok(handle.id.as_str().to_string()));
    let mut cancel_pending = true;
    loop {
        tokio::select! {
            item = handle.next() => match item {
                Some(item) => {
                    // A reader that went away: keep reading (the
                    // connection must not wait on this request), drop.
                    let _ = items.send(item).await;
                }
                None => break,
            },
            asked = &mut cancel, if cancel_pending => {
                cancel_pending = false;
                if asked.is_ok() {
                    let _ = handle.cancel().await;
                }
            }
        }
    }
    drop(items);
    let _ = answer.send(handle.response().await);
}

type Answered = oneshot::Receiver<Result<Value, ClientError>>;

/// A request in flight: its stream, its answer, its cancel.
#[pyclass(frozen, module = "portcullis._native")]
struct Call {
    client: Arc<RustClient>,
    id: String,
    items: Arc<tokio::sync::Mutex<Option<mpsc::Receiver<StreamItem>>>>,
    answer: Arc<tokio::sync::Mutex<Option<Answered>>>,
    cancel: Mutex<Option<oneshot::Sender<()>>>,
}

/// One stream item as Python sees it: `("stream", event, json_text)` or
/// `("chunk", channel, bytes)`.
struct Item(StreamItem);

impl<'py> IntoPyObject<'py> for Item {
    type Target = PyTuple;
    type Output = Bound<'py, PyTuple>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        match self.0 {
            StreamItem::Stream { event, data } => {
                ("stream", event, data.to_string()).into_pyobject(py)
            }
            StreamItem::Chunk { channel, data } => {
                let name = match channel {
                    Channel::Stdout => "stdout",
                    Channel::Stderr => "stderr",
                    Channel::Stdin => "stdin",
                    Channel::FileData => "file",
                    Channel::Terminal => "terminal",
                };
                ("chunk", name, PyBytes::new(py, &data)).into_pyobject(py)
            }
        }
    }
}

fn channel_named(name: &str) -> PyResult<Channel> {
    match name {
        "stdin" => Ok(Channel::Stdin),
        "file" => Ok(Channel::FileData),
        other => Err(PyValueError::new_err(format!(
            "channel `{other}`: a client sends on `stdin` or `file`"
        ))),
    }
}

#[pymethods]
impl Call {
    /// The request's id.
    #[getter]
    fn id(&self) -> &str {
        &self.id
    }

    /// The next stream item, or None once the answer has come.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let items = Arc::clone(&self.items);
        awaitable(py, async move {
            let mut items = items.lock().await;
            Ok(match items.as_mut() {
                Some(rx) => rx.recv().await.map(Item),
                None => None,
            })
        })
    }

    /// Sends `data` as chunks on `channel` (`stdin` or `file`); empty
    /// `data` sends the empty chunk that ends the input.
    fn send<'py>(
        &self,
        py: Python<'py>,
        channel: &str,
        data: &Bound<'py, PyBytes>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let channel = channel_named(channel)?;
        let data = Bytes::copy_from_slice(data.as_bytes());
        let id =
            RequestId::new(self.id.clone()).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let client = Arc::clone(&self.client);
        awaitable(py, async move {
            let mut rest = &data[..];
            loop {
                let mut chunk = ChunkRecord::new(&id, channel, rest.len().max(1));
                let take = chunk.room().min(rest.len());
                chunk.buffer().extend_from_slice(&rest[..take]);
                client.send_record(chunk.into_record()).await?;
                rest = &rest[take..];
                if rest.is_empty() {
                    return Ok(());
                }
            }
        })
    }

    /// The answer as JSON text. Stream items not read are dropped from
    /// now on. Cancelling the awaiting task sends `cancel`.
    fn result<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (items, answer) = (Arc::clone(&self.items), Arc::clone(&self.answer));
        let cancel = self.cancel.lock().ok().and_then(|mut c| c.take());
        awaitable(py, async move {
            items.lock().await.take();
            let Some(answer) = answer.lock().await.take() else {
                return Err(Failure::Local("the result was taken already".into()));
            };
            // Dropped unanswered (the awaiting task was cancelled):
            // `cancel` goes out.
            let mut guard = CancelSender(cancel);
            let answered = answer.await;
            guard.0 = None;
            match answered {
                Ok(result) => Ok(result?.to_string()),
                Err(_) => Err(Failure::Local("the request's task ended".into())),
            }
        })
    }

    /// Asks the gateway to stop the request; its answer says `cancelled`.
    fn cancel(&self) {
        if let Some(cancel) = self.cancel.lock().ok().and_then(|mut c| c.take()) {
            let _ = cancel.send(());
        }
    }
}

/// Sends the forwarding task its cancel when dropped.
struct CancelSender(Option<oneshot::Sender<()>>);

impl Drop for CancelSender {
    fn drop(&mut self) {
        if let Some(cancel) = self.0.take() {
            let _ = cancel.send(());
        }
    }
}

impl Drop for Call {
    /// A call dropped unanswered is not left running on the gateway.
    fn drop(&mut self) {
        if let Some(cancel) = self.cancel.get_mut().ok().and_then(Option::take) {
            let _ = cancel.send(());
        }
    }
}

/// Accepts gateways that dial in (`[[relay]]` on the gateway).
#[pyclass(frozen, module = "portcullis._native")]
struct Listener {
    inner: Arc<portcullis_client::listen::ProviderListener>,
}

#[pymethods]
impl Listener {
    /// Listens on `addr` (`HOST:PORT`); gateways must present `token`.
    #[staticmethod]
    fn bind(py: Python<'_>, addr: String, token: String) -> PyResult<Bound<'_, PyAny>> {
        let token = Zeroizing::new(token);
        awaitable(py, async move {
            let inner = portcullis_client::listen::ProviderListener::bind(&addr, token)
                .await
                .map_err(|e| Failure::Local(format!("cannot listen on {addr}: {e}")))?;
            Ok(Listener {
                inner: Arc::new(inner),
            })
        })
    }

    /// `HOST:PORT` as bound.
    #[getter]
    fn address(&self) -> PyResult<String> {
        self.inner
            .local_addr()
            .map(|a| a.to_string())
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// The next gateway that dials in and proves `gateway_key`.
    #[pyo3(signature = (gateway_key, identity=None, timeout=10.0, config_dir=None))]
    fn accept<'py>(
        &self,
        py: Python<'py>,
        gateway_key: String,
        identity: Option<PathBuf>,
        timeout: f64,
        config_dir: Option<PathBuf>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (options, _) = client_options(ConnectArgs {
            url: "ws://listener".into(),
            gateway_key: Some(gateway_key),
            identity,
            token: None,
            tls_ca: None,
            timeout,
            config_dir,
            remember: false,
        })?;
        let listener = Arc::clone(&self.inner);
        awaitable(py, async move {
            let inner = listener.accept(options).await?;
            Ok(Client {
                inner: Arc::new(inner),
            })
        })
    }
}

/// Writes a new key file (mode 0600) at `path`; returns its public key.
#[pyfunction]
#[pyo3(signature = (path, overwrite=false))]
fn generate_key(path: PathBuf, overwrite: bool) -> PyResult<String> {
    keyfile::generate(&path, overwrite)
        .map(|pair| pair.public().to_base64())
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The public key of the key file at `path`.
#[pyfunction]
fn public_key(path: PathBuf) -> PyResult<String> {
    keyfile::load(&path)
        .map(|pair| pair.public().to_base64())
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<Call>()?;
    m.add_class::<Listener>()?;
    m.add_function(wrap_pyfunction!(generate_key, m)?)?;
    m.add_function(wrap_pyfunction!(public_key, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(exit::drain, m)?)?;
    // Before the interpreter finalizes: no tokio thread is inside Python.
    let drain = m.getattr("_drain")?;
    m.py()
        .import("atexit")?
        .call_method1("register", (drain,))?;
    Ok(())
}
