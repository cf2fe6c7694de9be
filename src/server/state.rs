//! The gateway's shared state: configuration, keys, the current policy, the
//! pause switch, the live sessions. Sessions watch the policy and the pause
//! switch and react to changes themselves.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use portcullis_crypto::StaticKeypair;
use portcullis_policy::{Policy, PolicyErrors, load_file};
use serde::Serialize;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use portcullis_store::{AuditLog, Kind, Record};

use crate::config::Config;
use crate::provider::{Pause, Providers};
use crate::server::approvals::Approvals;
use crate::server::peer::Peer;

pub struct Gateway {
    pub config: Config,
    pub key: StaticKeypair,
    /// New at every start: handles from an earlier instance are gone.
    pub instance_id: String,
    pub policy: watch::Sender<Arc<Policy>>,
    pub paused: watch::Sender<Pause>,
    pub sessions: Sessions,
    /// Cancelled on SIGTERM: stop accepting, drain, close.
    pub shutdown: CancellationToken,
    pub connections: Arc<Semaphore>,
    /// The capability providers, by method: the daemon's assembly
    /// (`cli/serve.rs`) registers them.
    pub providers: Providers,
    /// Set when the config has `[tls]`.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// Every request and security event, durable before it is answered.
    pub audit: AuditLog,
    /// Tool calls waiting for an operator.
    pub approvals: Approvals,
    pub metrics: crate::server::metrics::Metrics,
    /// What frames arriving in parts may hold, all sessions together
    /// (`[limits] max_frames_in_parts`).
    pub parts: portcullis_wire::record::PartsBudget,
    /// Each `[[relay]]` endpoint's state, in the config's order.
    pub relays: Vec<crate::server::dial::Endpoint>,
}

impl Gateway {
    pub fn new(
        config: Config,
        key: StaticKeypair,
        policy: Policy,
        audit: AuditLog,
        providers: Providers,
        instance_id: String,
    ) -> Self {
        // The marker holds `soft` for a soft pause; anything else (an
        // older daemon's marker too) is the emergency stop.
        let paused = match std::fs::read_to_string(config.state_dir.join("paused")) {
            Ok(text) if text.trim() == "soft" => Pause::Soft,
            Ok(_) => Pause::Stop,
            Err(_) => Pause::Off,
        };
        let connections = Arc::new(Semaphore::new(config.limits.max_connections));
        let parts = portcullis_wire::record::PartsBudget::new(config.limits.max_frames_in_parts);
        let relays = config
            .relays
            .iter()
            .map(|r| crate::server::dial::endpoint(&r.url))
            .collect();
        Self {
            relays,
            parts,
            config,
            key,
            instance_id,
            policy: watch::Sender::new(Arc::new(policy)),
            paused: watch::Sender::new(paused),
            sessions: Sessions::default(),
            shutdown: CancellationToken::new(),
            connections,
            providers,
            tls: None,
            audit,
            approvals: Default::default(),
            metrics: Default::default(),
        }
    }

    pub fn current_policy(&self) -> Arc<Policy> {
        self.policy.borrow().clone()
    }

    /// Loads the policy file again. An invalid file keeps the old policy.
    /// Sessions see the change through their `watch` receiver.
    pub fn reload_policy(&self) -> Result<String, PolicyErrors> {
        let result = load_file(&self.config.policy);
        let (detail, generation) = match &result {
            Ok(policy) => (
                format!("generation {}", policy.generation),
                Some(policy.generation.clone()),
            ),
            Err(errors) => (format!("kept the old policy: {}", errors.0.len()), None),
        };
        self.security_event(
            if generation.is_some() {
                "policy_reloaded"
            } else {
                "policy_reload_failed"
            },
            None,
            detail,
        );
        let policy = result?;
        let generation = policy.generation.clone();
        self.policy.send_replace(Arc::new(policy));
        Ok(generation.to_string())
    }

    /// Records a security event. Not awaited: the event is not the answer
    /// to any request, and the writer keeps the order.
    pub fn security_event(&self, event: &str, principal: Option<&str>, detail: String) {
        self.metrics.security_event(event);
        let record = Record {
            kind: Kind::Security,
            started_at: jiff::Timestamp::now().to_string(),
            principal: principal.map(Arc::from),
            event: Some(event.to_string()),
            detail: Some(detail),
            policy_generation: Some(self.current_policy().generation.clone()),
            ..Record::default()
        };
        let audit = self.audit.clone();
        tokio::spawn(async move {
            if let Err(e) = audit.append(record).await {
                tracing::error!("audit: {e}");
            }
        });
    }

    /// The operator's pause ([`Pause`]). Persisted as a file in the state
    /// directory so it survives a restart until resumed; audited.
    pub fn set_paused(&self, pause: Pause) -> std::io::Result<()> {
        let marker = self.config.state_dir.join("paused");
        if pause == Pause::Off {
            if marker.exists() {
                std::fs::remove_file(&marker)?;
            }
        } else {
            std::fs::create_dir_all(&self.config.state_dir)?;
            std::fs::write(&marker, format!("{}\n", pause.as_str()))?;
        }
        let before = self.paused.send_replace(pause);
        let (event, detail) = match pause {
            Pause::Off => (
                "resumed",
                format!(
                    "the operator resumed the gateway (was: {})",
                    before.as_str()
                ),
            ),
            Pause::Soft => (
                "paused",
                "soft pause: new requests are refused; sessions and running work go on".to_string(),
            ),
            Pause::Stop => (
                "paused",
                format!(
                    "emergency stop: {} sessions closed, their requests failed, commands killed (but those \
                     whose grant says survive_revocation); new sessions refused",
                    self.sessions.count()
                ),
            ),
        };
        self.security_event(event, None, detail);
        Ok(())
    }
}

#[derive(Default)]
pub struct Sessions {
    live: Mutex<HashMap<u64, SessionInfo>>,
    next_id: AtomicU64,
}

#[derive(Clone, Serialize)]
pub struct SessionInfo {
    pub id: u64,
    pub principal: String,
    pub peer: Peer,
    pub started_at: String,
    #[serde(skip)]
    pub kill: CancellationToken,
    #[serde(serialize_with = "load")]
    pub in_flight: Arc<AtomicUsize>,
}

fn load<S: serde::Serializer>(n: &Arc<AtomicUsize>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(n.load(Ordering::Relaxed) as u64)
}

/// Removes its session from the registry when dropped.
pub struct SessionGuard<'a> {
    sessions: &'a Sessions,
    pub info: SessionInfo,
}

impl Drop for SessionGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut live) = self.sessions.live.lock() {
            live.remove(&self.info.id);
        }
    }
}

impl Sessions {
    /// Registers a session, unless its principal already has `max` of them.
    pub fn register(&self, principal: &str, peer: Peer, max: usize) -> Option<SessionGuard<'_>> {
        let mut live = self.live.lock().ok()?;
        if live.values().filter(|s| s.principal == principal).count() >= max {
            return None;
        }
        let info = SessionInfo {
            id: self.next_id.fetch_add(1, Ordering::Relaxed) + 1,
            principal: principal.to_string(),
            peer,
            started_at: jiff::Timestamp::now().to_string(),
            kill: CancellationToken::new(),
            in_flight: Arc::new(AtomicUsize::new(0)),
        };
        live.insert(info.id, info.clone());
        Some(SessionGuard {
            sessions: self,
            info,
        })
    }

    pub fn list(&self) -> Vec<SessionInfo> {
        let mut all: Vec<_> = self
            .live
            .lock()
            .map(|l| l.values().cloned().collect())
            .unwrap_or_default();
        all.sort_by_key(|s| s.id);
        all
    }

    pub fn kill(&self, id: u64) -> bool {
        self.live
            .lock()
            .ok()
            .and_then(|l| l.get(&id).map(|s| s.kill.cancel()))
            .is_some()
    }

    pub fn count(&self) -> usize {
        self.live.lock().map(|l| l.len()).unwrap_or(0)
    }
}
