//! Tool calls and commands that wait for an operator. A call whose
//! approval policy (the tool's, or a shell grant's command pattern) is
//! `ask_once`, `ask_once_per_run` or `always_ask` is parked here (its
//! request simply has not answered yet) until an operator approves or
//! denies it through the admin socket (`portcullis approvals …`), the
//! wait times out, or the request is cancelled. `ask_once` approvals are
//! remembered per principal and tool (or exact command line),
//! `ask_once_per_run` per those and the request context's `run_id`, in
//! the store.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use portcullis_policy::ApprovalPolicy;
use portcullis_store::{Decision as AuditDecision, Record as AuditRecord, RememberedApprovals};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::provider::{EventSink, StreamSink};
use portcullis_wire::frame::{ErrorBody, ErrorCode, Request};

/// Parked calls at most (more are refused at once).
const MAX_PENDING: usize = 1024;

#[derive(Default)]
pub struct Approvals {
    pending: Mutex<BTreeMap<u64, Pending>>,
    next: AtomicU64,
    remembered: Option<RememberedApprovals>,
}

struct Pending {
    shown: Value,
    answer: oneshot::Sender<Answer>,
}

enum Answer {
    Approved(String),
    Denied(String),
}

/// What an approval is asked for, shown to the operator as is (the
/// arguments as the caller sent them: secrets are the tools', never the
/// caller's).
pub struct Ask {
    principal: String,
    method: String,
    /// The tool's name; `None` for a command.
    tool: Option<String>,
    /// A command's line (program and arguments, space-separated).
    command: Option<String>,
    /// What the approval is bound to: the tool's arguments, or the
    /// command's whole params (argv, cwd, env, …).
    arguments: Value,
    request_id: String,
    run_id: Option<String>,
    policy: ApprovalPolicy,
    /// The tool's risk as the policy declares it.
    risk: Option<String>,
}

impl Ask {
    /// The approval a `tool.call`, `shell.exec` or `shell.start` request
    /// of `principal` needs.
    pub fn for_request(principal: &str, request: &Request, policy: ApprovalPolicy) -> Self {
        let params = &request.params;
        let is_tool = request.method == "tool.call";
        let command = params.get("command").and_then(Value::as_array).map(|argv| {
            argv.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" ")
        });
        Self {
            principal: principal.to_string(),
            method: request.method.clone(),
            tool: is_tool.then(|| {
                params
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            }),
            command: command.filter(|_| !is_tool),
            arguments: match is_tool {
                true => params
                    .get("arguments")
                    .cloned()
                    .unwrap_or_else(|| json!({})),
                false => Value::Object(params.clone()),
            },
            request_id: request.id.to_string(),
            run_id: request.context.as_ref().and_then(|c| c.run_id.clone()),
            policy,
            risk: None,
        }
    }

    /// With the tool's declared risk, for the runtime's view.
    pub fn with_risk(mut self, risk: Option<String>) -> Self {
        self.risk = risk;
        self
    }
}

/// Who sees a parked call besides the operator: the runtime, through a
/// `status` frame of the call and an event of its session
/// (`approval.requested`, then `approval.decided`).
pub struct Onlookers {
    pub stream: StreamSink,
    pub events: EventSink,
    pub request_id: String,
}

impl Onlookers {
    async fn show(&self, view: Value) {
        let _ = self.stream.event("status", view.clone()).await;
        let mut payload = view;
        payload["request_id"] = json!(self.request_id);
        let event = match payload["state"] == "awaiting_approval" {
            true => "approval.requested",
            false => "approval.decided",
        };
        let _ = self.events.send(event, payload).await;
    }
}

/// Writes the outcome of [`Approvals::obtain`] into the call's audit entry.
pub fn record_outcome(record: &mut AuditRecord, outcome: &Result<String, ErrorBody>) {
    match outcome {
        Ok(by) => {
            record.decision = Some(AuditDecision::Approved);
            record.approved_by = Some(by.clone());
        }
        Err(_) => record.decision = Some(AuditDecision::Blocked),
    }
}

impl Approvals {
    pub fn new(remembered: Option<RememberedApprovals>) -> Self {
        Self {
            remembered,
            ..Self::default()
        }
    }

    /// Waits for an approval of `ask` (or finds one remembered). Returns
    /// who approved; a denial or timeout is `approval_required`. `shown`
    /// hears what the runtime may see: the approval when it is parked
    /// (`state: "awaiting_approval"`), and how it was decided.
    pub async fn obtain(
        &self,
        ask: Ask,
        timeout: Duration,
        cancel: &CancellationToken,
        shown: &Onlookers,
    ) -> Result<String, ErrorBody> {
        let principal = ask.principal.as_str();
        // What the approval is of, in words and as its remembered key: a
        // tool by name (as before commands had approvals), a command by
        // its exact line.
        let (what, subject) = match (&ask.tool, &ask.command) {
            (Some(tool), _) => (format!("call of tool `{tool}`"), tool.clone()),
            (None, line) => {
                let line = line.clone().unwrap_or_default();
                (format!("command `{line}`"), format!("command: {line}"))
            }
        };
        let key: Option<Vec<&str>> = match ask.policy {
            ApprovalPolicy::AskOnce => Some(vec![principal, &subject]),
            ApprovalPolicy::AskOncePerRun => ask
                .run_id
                .as_deref()
                .map(|run| vec![principal, &subject, run]),
            _ => None,
        };
        if let (Some(key), Some(remembered)) = (&key, &self.remembered)
            && let Ok(Some(by)) = remembered.get(key)
        {
            return Ok(format!("{by} (remembered)"));
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = self.lock();
            if pending.len() >= MAX_PENDING {
                return Err(ErrorBody::new(
                    ErrorCode::ApprovalRequired,
                    "too many calls are waiting for approval; try again later",
                ));
            }
            let shown = json!({
                "id": id,
                "principal": ask.principal,
                "method": ask.method,
                "tool": ask.tool,
                "command": ask.command,
                "arguments": ask.arguments,
                "request_id": ask.request_id,
                "run_id": ask.run_id,
                "approval_policy": ask.policy.as_str(),
                "requested_at": jiff::Timestamp::now().to_string(),
                "expires_in_ms": timeout.as_millis() as u64,
            });
            pending.insert(id, Pending { shown, answer: tx });
        }
        tracing::info!(
            approval = id,
            principal,
            "{what} is waiting for an operator's approval (portcullis approvals)"
        );
        // The runtime sees the approval (not its arguments: their digest,
        // so a changed argument is visibly another approval) and may
        // cancel it; only the operator decides.
        let digest = hex::encode(Sha256::digest(ask.arguments.to_string()));
        let parked = json!({
            "state": "awaiting_approval",
            "approval_id": id,
            "method": ask.method,
            "tool": ask.tool,
            "command": ask.command,
            "arguments_sha256": digest,
            "risk": ask.risk,
            "approval_policy": ask.policy.as_str(),
            "expires_in_ms": timeout.as_millis() as u64,
        });
        shown.show(parked).await;
        let answer = tokio::select! {
            answer = rx => answer.ok(),
            () = tokio::time::sleep(timeout) => None,
            () = cancel.cancelled() => {
                self.lock().remove(&id);
                shown.show(json!({"state": "approval_cancelled", "approval_id": id})).await;
                return Err(ErrorBody::new(ErrorCode::Cancelled, "cancelled while waiting for approval"));
            }
        };
        self.lock().remove(&id);
        let decided = match &answer {
            Some(Answer::Approved(_)) => "approved",
            Some(Answer::Denied(_)) => "denied",
            None => "expired",
        };
        shown
            .show(json!({"state": decided, "approval_id": id}))
            .await;
        match answer {
            Some(Answer::Approved(by)) => {
                if let (Some(key), Some(remembered)) = (&key, &self.remembered)
                    && let Err(e) = remembered.remember(key, &by)
                {
                    tracing::warn!("cannot remember the approval: {e}");
                }
                Ok(by)
            }
            Some(Answer::Denied(by)) => Err(ErrorBody::new(
                ErrorCode::ApprovalRequired,
                format!("the operator ({by}) denied this {what}"),
            )),
            None => Err(ErrorBody::new(
                ErrorCode::ApprovalRequired,
                format!(
                    "no operator approved this {what} within {} s",
                    timeout.as_secs()
                ),
            )),
        }
    }

    /// The calls waiting, oldest first.
    pub fn list(&self) -> Vec<Value> {
        self.lock().values().map(|p| p.shown.clone()).collect()
    }

    /// Approves or denies a waiting call; false if there is none with `id`.
    pub fn decide(&self, id: u64, approve: bool, by: String) -> bool {
        let Some(pending) = self.lock().remove(&id) else {
            return false;
        };
        let answer = if approve {
            Answer::Approved(by)
        } else {
            Answer::Denied(by)
        };
        pending.answer.send(answer).is_ok()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}
