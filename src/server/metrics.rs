//! Prometheus text metrics: `GET /v1/metrics` on the admin socket
//! (`portcullis metrics`), and `GET /metrics` on `metrics_listen` when the
//! config sets it. Counters are fed where a request's final audit entry and
//! a security event are recorded; gauges are read when scraped.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use portcullis_store::{COMMIT_BUCKETS, Decision, Record};

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::server::state::Gateway;

/// Distinct `method` labels kept; a method the gateway does not serve is
/// counted as `unknown`, so a hostile client cannot grow this map.
#[derive(Default)]
pub struct Metrics {
    /// Method → answered requests, by decision (`DECISIONS`' order).
    requests: Mutex<BTreeMap<String, [u64; DECISIONS.len()]>>,
    security_events: Mutex<BTreeMap<String, u64>>,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

/// The `decision` label, by index into a method's counts.
const DECISIONS: [&str; 4] = ["allowed", "approved", "blocked", "none"];

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Metrics {
    /// A request's final entry (`served`: whether the gateway serves its
    /// method, which decides whether the method becomes a label).
    pub fn request(&self, record: &Record, served: bool) {
        let method = match record.method.as_deref() {
            Some(method) if served => method,
            _ => "unknown",
        };
        let decision = match record.decision {
            Some(Decision::Allowed) => 0,
            Some(Decision::Approved) => 1,
            Some(Decision::Blocked) => 2,
            None => 3,
        };
        let mut requests = lock(&self.requests);
        match requests.get_mut(method) {
            Some(counts) => counts[decision] += 1,
            None => {
                let mut counts = [0; DECISIONS.len()];
                counts[decision] = 1;
                requests.insert(method.to_string(), counts);
            }
        }
        drop(requests);
        self.bytes_in.fetch_add(record.bytes_in, Ordering::Relaxed);
        self.bytes_out
            .fetch_add(record.bytes_out, Ordering::Relaxed);
    }

    /// A security event; `event` is one of the gateway's own names.
    pub fn security_event(&self, event: &str) {
        *lock(&self.security_events)
            .entry(event.to_string())
            .or_default() += 1;
    }

    /// Everything, in the Prometheus text format (version 0.0.4).
    pub fn render(&self, gateway: &Gateway) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let one = |value: f64| vec![(String::new(), value)];
        metric(
            "portcullis_sessions",
            "gauge",
            "Sessions open now.",
            &one(gateway.sessions.count() as f64),
        );
        for gauge in gateway.providers.gauges() {
            metric(gauge.name, "gauge", gauge.help, &one(gauge.value));
        }
        let requests: Vec<_> = lock(&self.requests)
            .iter()
            .flat_map(|(method, counts)| {
                DECISIONS
                    .iter()
                    .zip(counts)
                    .filter(|(_, n)| **n > 0)
                    .map(move |(decision, n)| {
                        let labels =
                            format!("{{method=\"{}\",decision=\"{decision}\"}}", escape(method));
                        (labels, *n as f64)
                    })
            })
            .collect();
        metric(
            "portcullis_requests_total",
            "counter",
            "Requests answered, by method and policy decision (none: refused before a decision).",
            &requests,
        );
        let bytes = vec![
            (
                "{direction=\"in\"}".to_string(),
                self.bytes_in.load(Ordering::Relaxed) as f64,
            ),
            (
                "{direction=\"out\"}".to_string(),
                self.bytes_out.load(Ordering::Relaxed) as f64,
            ),
        ];
        metric(
            "portcullis_request_bytes_total",
            "counter",
            "Payload bytes of requests: in from clients, out to them.",
            &bytes,
        );
        let events = lock(&self.security_events).clone();
        let failures = events.get("handshake_failed").copied().unwrap_or(0);
        metric(
            "portcullis_handshake_failures_total",
            "counter",
            "Noise handshakes that failed.",
            &one(failures as f64),
        );
        let events: Vec<_> = events
            .iter()
            .map(|(event, n)| (format!("{{event=\"{}\"}}", escape(event)), *n as f64))
            .collect();
        metric(
            "portcullis_security_events_total",
            "counter",
            "Security events recorded in the audit log, by event.",
            &events,
        );
        let commits = gateway.audit.commit_stats();
        let mut histogram: Vec<_> = COMMIT_BUCKETS
            .iter()
            .zip(commits.at_most)
            .map(|(le, n)| (format!("_bucket{{le=\"{le}\"}}"), n as f64))
            .collect();
        histogram.push(("_bucket{le=\"+Inf\"}".into(), commits.commits as f64));
        histogram.push(("_sum".into(), commits.seconds));
        histogram.push(("_count".into(), commits.commits as f64));
        metric(
            "portcullis_audit_commit_seconds",
            "histogram",
            "Audit group commits (journal write and fdatasync): how long each took.",
            &histogram,
        );
        metric(
            "portcullis_audit_entries_total",
            "counter",
            "Audit entries committed since the gateway started.",
            &one(commits.entries as f64),
        );
        let relays: Vec<_> = gateway
            .relays
            .iter()
            .filter_map(|r| r.lock().ok().map(|s| s.clone()))
            .collect();
        if !relays.is_empty() {
            let by_url = |value: &dyn Fn(&crate::server::dial::EndpointStatus) -> f64| {
                relays
                    .iter()
                    .map(|r| (format!("{{url=\"{}\"}}", escape(&r.url)), value(r)))
                    .collect::<Vec<_>>()
            };
            metric(
                "portcullis_relay_connected",
                "gauge",
                "1 while the gateway is connected to the [[relay]] endpoint.",
                &by_url(&|r| f64::from(u8::from(r.state == "connected"))),
            );
            metric(
                "portcullis_relay_connections_total",
                "counter",
                "Connections made to the [[relay]] endpoint.",
                &by_url(&|r| r.connections as f64),
            );
            metric(
                "portcullis_relay_failed_attempts",
                "gauge",
                "Failed attempts since the endpoint's last healthy connection.",
                &by_url(&|r| r.attempts as f64),
            );
        }
        metric(
            "portcullis_audit_writing",
            "gauge",
            "1 while the audit log writes; 0 while it cannot (every request is refused until it can).",
            &one(if gateway.audit.stopped().is_none() {
                1.0
            } else {
                0.0
            }),
        );
        out
    }
}

/// `render` as an HTTP response, for the admin socket and `metrics_listen`.
pub fn response(gateway: &Gateway) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(gateway.metrics.render(gateway))));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    response
}

/// A label value in the text format: backslash, quote and newline escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Serves `GET /metrics` (and nothing else) on `listener` until shutdown:
/// for a Prometheus server that scrapes over TCP.
pub async fn serve(gateway: Arc<Gateway>, listener: TcpListener) {
    // A few scrapers at once; more connections are closed at once.
    let permits = Arc::new(tokio::sync::Semaphore::new(8));
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
            () = gateway.shutdown.cancelled() => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            continue;
        };
        let gateway = gateway.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let gateway = gateway.clone();
                async move {
                    if request.method() == Method::GET && request.uri().path() == "/metrics" {
                        return Ok::<_, Infallible>(response(&gateway));
                    }
                    let mut not_found = Response::new(Full::new(Bytes::new()));
                    *not_found.status_mut() = StatusCode::NOT_FOUND;
                    Ok(not_found)
                }
            });
            let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            // A scraper that stalls is dropped, not kept.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(30), connection).await;
        });
    }
}
