//! `portcullis serve --demo [DIR]`: a working local gateway in one command.
//! Creates, once, in DIR: a gateway key, a client key, a workspace, a policy
//! granting the client key that workspace, and a config listening on
//! 127.0.0.1:7443. Later runs reuse what is there.

use std::path::{Path, PathBuf};

use portcullis_wire::keyfile;

pub const DEMO_ADDR: &str = "127.0.0.1:7443";

/// Prepares DIR and returns its config file.
pub fn prepare(dir: &Path) -> Result<PathBuf, String> {
    let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
    std::fs::create_dir_all(dir.join("workspace"))
        .map_err(|e| io("cannot create the demo directory", e))?;
    let dir = dir
        .canonicalize()
        .map_err(|e| io("cannot resolve the demo directory", e))?;
    let key = |name: &str| -> Result<portcullis_crypto::StaticKeypair, String> {
        let path = dir.join(name);
        if path.exists() {
            keyfile::load(&path)
        } else {
            keyfile::generate(&path, false)
        }
        .map_err(|e| e.to_string())
    };
    let gateway = key("gateway.key")?;
    let client = key("client.key")?;
    let policy = dir.join("policy.toml");
    if !policy.exists() {
        let text = DEMO_POLICY
            .replace("CLIENT_KEY", &client.public().to_base64())
            .replace("WORKSPACE", &dir.join("workspace").display().to_string());
        std::fs::write(&policy, text).map_err(|e| io("cannot write the demo policy", e))?;
    }
    let config = dir.join("portcullis.toml");
    if !config.exists() {
        std::fs::write(&config, DEMO_CONFIG.replace("ADDR", DEMO_ADDR))
            .map_err(|e| io("cannot write the demo config", e))?;
    }
    println!("demo gateway in {}", dir.display());
    println!(
        "gateway key:  {} ({})",
        gateway.public().to_base64(),
        gateway.public().fingerprint()
    );
    println!(
        "connect with: portcullis connect ws://{DEMO_ADDR} --gateway-key {} --identity {}",
        gateway.public().to_base64(),
        dir.join("client.key").display()
    );
    Ok(config)
}

const DEMO_CONFIG: &str = r#"# portcullis demo configuration (see docs/OPERATIONS.md)
provider_id = "portcullis-demo"
listen = ["ADDR"]
key_file = "gateway.key"
policy = "policy.toml"
state_dir = "state"
admin_socket = "admin.sock"
"#;

const DEMO_POLICY: &str = r#"# portcullis demo policy (see docs/POLICY.md)

[[principal]]
id = "demo"
description = "The demo client (client.key)"
public_key = "CLIENT_KEY"

[[root]]
id = "workspace"
path = "WORKSPACE"
virtual_path = "/workspace/demo"

[[grant]]
id = "demo"
principals = ["demo"]
fileops = { workspace = "rw" }
resources = {}
scripts = {}

[grant.shell]
commands = ["ls", "cat", "echo", "sh", "bash", "git", "true"]
cwd_roots = ["workspace"]
env_set = { PATH = "/usr/local/bin:/usr/bin:/bin" }
pty = true
persist = true
"#;
