//! The daemon assembled: which providers serve requests, and the tasks
//! they need beside requests. The one place that names them all; the
//! server below reaches them only through [`Providers`].

use std::sync::Arc;

use crate::config::Config;
use crate::files::Files;
use crate::provider::Providers;
use crate::resources::Resources;
use crate::server::Gateway;
use crate::shell::Shell;
use crate::tools::Tools;

/// Every provider this daemon serves.
pub fn providers(config: &Config) -> Providers {
    Providers::new()
        .with(Arc::new(Resources))
        .with(Arc::new(Files))
        .with(Arc::new(Shell))
        .with(Arc::new(Tools::new(config.secrets_dir.clone())))
}

/// Starts what the providers run beside requests: the shell's keeper,
/// which re-decides started processes on policy changes and ends them at
/// shutdown.
pub fn spawn_keepers(gateway: &Arc<Gateway>) {
    let providers = gateway.providers.clone();
    let still_allowed: crate::shell::process::StillAllowed =
        Arc::new(move |policy, principal, request, now| {
            providers.still_allowed(policy, principal, request, now)
        });
    tokio::spawn(crate::shell::process::keeper(
        &gateway.instance_id,
        gateway.policy.subscribe(),
        gateway.shutdown.clone(),
        still_allowed,
    ));
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
        let providers = providers(&config);
        let mut declared: Vec<&str> = providers.methods().map(|m| m.name).collect();
        declared.sort_unstable();
        assert_eq!(declared.len(), 27, "{declared:?}");
        for method in providers.methods() {
            assert_eq!(
                portcullis_policy::capability_of(method.name),
                Some(method.capability),
                "{}",
                method.name
            );
        }
        // Registering a provider twice names the method it repeats.
        let mut twice = Providers::new().with(Arc::new(Files));
        let error = twice.register(Arc::new(Files)).unwrap_err();
        assert!(error.contains("file."), "{error}");
    }
}
