//! The daemon assembled: which providers serve requests, and the tasks
//! they need beside requests. The one place that names them all; the
//! server below reaches them only through [`Providers`].

use std::sync::Arc;

use crate::artifacts::Artifacts;
use crate::config::Config;
use crate::egress::Egress;
use crate::files::Files;
use crate::provider::Providers;
use crate::resources::Resources;
use crate::server::Gateway;
use crate::shell::Shell;
use crate::shell::process::{Processes, StillAllowed, keeper};
use crate::tools::Tools;
use portcullis_store::{AuditLog, Handles};

/// The providers of one run of the daemon, and what they share.
pub struct Daemon {
    /// This run's id: in hellos, and in the ids of started processes.
    pub instance_id: String,
    /// Every provider this daemon serves.
    pub providers: Providers,
    /// The shell's started processes (`resource.*` lists them too).
    processes: Processes,
}

impl Daemon {
    /// The providers, sharing `audit` and the store's `handles` of started
    /// processes.
    pub fn assemble(config: &Config, audit: AuditLog, handles: Handles) -> Self {
        let instance_id = crate::random_id();
        let processes = Processes::new(&instance_id, Some(handles));
        let artifacts = Artifacts::new(audit.clone(), config.artifacts.ca_file.clone());
        let egress = Egress::new(&config.egress, &config.state_dir, audit);
        let shell = Shell::new(processes.clone(), egress, Some(artifacts.clone()));
        let tools = Tools::new(config.secrets_dir.clone()).with_mcp_servers(shell.clone());
        let providers = Providers::new()
            .with(Arc::new(Resources::new(processes.clone())))
            .with(Arc::new(Files::with_artifacts(Some(artifacts))))
            .with(Arc::new(shell))
            .with(Arc::new(tools));
        Self {
            instance_id,
            providers,
            processes,
        }
    }

    /// Starts what the providers run beside requests: the shell's keeper,
    /// which re-decides started processes on policy changes and ends them
    /// at shutdown.
    pub fn spawn_keepers(&self, gateway: &Arc<Gateway>) {
        let providers = gateway.providers.clone();
        let still_allowed: StillAllowed = Arc::new(move |policy, principal, request, now| {
            providers.still_allowed(policy, principal, request, now)
        });
        tokio::spawn(keeper(
            self.processes.clone(),
            gateway.policy.subscribe(),
            gateway.paused.subscribe(),
            gateway.shutdown.clone(),
            still_allowed,
        ));
    }

    /// Waits (up to `grace`) until every started process has exited.
    pub async fn processes_exited(&self, grace: std::time::Duration) {
        self.processes.all_exited(grace).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each method a provider declares is filed under the same capability
    /// by the policy (which decides on it), and no two providers declare
    /// the same method.
    #[test]
    fn every_declared_method_has_the_policy_s_capability() {
        let config = Config::parse(
            "listen = [\"127.0.0.1:0\"]\nkey_file = \"k\"\npolicy = \"p\"\nstate_dir = \"s\"\nadmin_socket = \"a\"\n",
            std::path::Path::new("/etc/portcullis/portcullis.toml"),
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = portcullis_store::Store::open(dir.path()).unwrap();
        let (audit, handles) = (store.audit(None).unwrap(), store.handles().unwrap());
        let providers = Daemon::assemble(&config, audit, handles).providers;
        let mut declared: Vec<&str> = providers.methods().map(|m| m.name).collect();
        declared.sort_unstable();
        assert_eq!(declared.len(), 33, "{declared:?}");
        for method in providers.methods() {
            assert_eq!(
                portcullis_policy::capability_of(method.name),
                Some(method.capability),
                "{}",
                method.name
            );
        }
        // Registering a provider twice names the method it repeats.
        let mut twice = Providers::new().with(Arc::new(Files::new()));
        let error = twice.register(Arc::new(Files::new())).unwrap_err();
        assert!(error.0.starts_with("file."), "{error}");
    }
}
