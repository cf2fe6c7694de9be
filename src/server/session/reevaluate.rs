//! What a policy change or an expiry does to a live session: close it if
//! its principal may no longer act, stop what is no longer allowed
//! (requests in flight, resources), and tell the peer what changed.

use std::time::Duration;

use portcullis_policy::{Policy, principal_status, summary};
use portcullis_wire::frame::{ErrorBody, ErrorCode, Request};
use serde_json::json;
use tokio::time::Instant;
use tracing::info;

use super::{Ending, Session, capabilities_json, granted_names, later, tools_by_name};

impl Session {
    /// After a policy change or an expiry: close if the principal may no
    /// longer act, tell the peer if its capabilities changed.
    pub(super) async fn reevaluate(&mut self) -> Option<Ending> {
        let policy = self.gateway.current_policy();
        let now = jiff::Timestamp::now();
        let granted = summary(&policy, &self.principal, now);
        let revoked = match principal_status(&policy, &self.principal, now) {
            Err((_, rule)) => Some(rule),
            Ok(()) if granted_names(&granted).is_empty() => {
                Some(format!("principal `{}` has no grants left", self.principal))
            }
            Ok(()) => None,
        };
        if let Some(rule) = revoked {
            info!(session = self.info.id, principal = %self.principal, "revoked: {rule}");
            self.gateway.security_event(
                "session_revoked",
                Some(&self.principal),
                format!("session {}: {rule}", self.info.id),
            );
            return Some(self.end(
                ErrorCode::PermissionDenied,
                "access was revoked by the policy",
                true,
            ));
        }
        self.stop_what_is_no_longer_allowed(&policy, now).await;
        self.announce_tool_changes(&policy, now).await;
        if granted != self.granted {
            let names = granted_names(&granted);
            if let Some(accepted) = &mut self.accepted {
                accepted.retain(|c| names.contains(c));
            }
            // One event per capability that changed, as the spec writes
            // it (`{capability, state}`), with the whole new set beside.
            let (before, after) = (
                capabilities_json(&policy, &self.granted),
                capabilities_json(&policy, &granted),
            );
            self.resources.set_granted(granted.max_resources);
            self.granted = granted;
            let names: std::collections::BTreeSet<&String> =
                before.keys().chain(after.keys()).collect();
            for name in names {
                let state = match (before.get(name), after.get(name)) {
                    (None, Some(_)) => "available",
                    (Some(_), None) => "unavailable",
                    (old, new) if old != new => "changed",
                    _ => continue,
                };
                let payload = json!({"capability": name, "state": state,
                    "capabilities": after, "generation": policy.generation});
                self.event("capability.updated", payload).await;
            }
        }
        None
    }

    /// Tells the client which tools a policy change granted, changed
    /// (`tool.registered`, with the new descriptor) or took away
    /// (`tool.unregistered`).
    async fn announce_tool_changes(&mut self, policy: &Policy, now: jiff::Timestamp) {
        let tools = tools_by_name(policy, &self.principal, now);
        let generation = &policy.generation;
        for name in self.tools.keys().filter(|name| !tools.contains_key(*name)) {
            let payload = json!({"name": name, "generation": generation});
            self.event("tool.unregistered", payload).await;
        }
        for (name, descriptor) in &tools {
            if self.tools.get(name) != Some(descriptor) {
                let payload = json!({"tool": descriptor, "generation": generation});
                self.event("tool.registered", payload).await;
            }
        }
        self.tools = tools;
    }

    /// Stops what the policy no longer allows: requests in flight (a
    /// command whose grant was taken away is killed; it answers
    /// `permission_denied`) and resources (a watch on a root since taken
    /// away).
    async fn stop_what_is_no_longer_allowed(&self, policy: &Policy, now: jiff::Timestamp) {
        let providers = &self.gateway.providers;
        let allowed =
            |request: &Request| providers.still_allowed(policy, &self.principal, request, now);
        for (id, running) in &self.in_flight {
            if !allowed(&running.request) {
                info!(session = self.info.id, request = %id, "request revoked by the policy");
                let _ = running.revoked.set(ErrorBody::new(
                    ErrorCode::PermissionDenied,
                    crate::provider::REVOKED_BY_POLICY,
                ));
                running.cancel.cancel();
            }
        }
        for (id, request) in self.resources.requests() {
            if !allowed(&request) && self.resources.dispose(&id) {
                info!(session = self.info.id, resource = %id, "resource revoked by the policy");
                let payload = json!({"id": id, "reason": "the policy no longer allows it"});
                self.event("resource.disposed", payload).await;
            }
        }
    }

    /// When the principal or one of its grants next expires.
    pub(super) fn next_expiry(&self) -> Option<Instant> {
        let policy = self.gateway.current_policy();
        let now = jiff::Timestamp::now();
        let principal = policy.principal(&self.principal)?;
        let grants = policy
            .grants
            .iter()
            .filter(|g| g.principals.contains(&self.principal));
        let soonest = principal
            .expires_at
            .into_iter()
            .chain(grants.filter_map(|g| g.expires_at))
            .filter(|t| *t > now)
            .min()?;
        let wait = Duration::try_from(soonest.duration_since(now)).ok()?;
        Some(later(Instant::now(), wait))
    }
}
