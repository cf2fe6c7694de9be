//! The client CLI against the real gateway: `connect` and `ping`, the
//! remembered gateway keys and the identity created on first use.

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::process::{Command, Output};

use common::{Gateway, key_b64};
use portcullis::keyfile;

fn portcullis(config_home: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(args)
        .env("XDG_CONFIG_HOME", config_home)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn connect_remembers_the_gateway_key_and_ping_uses_it() {
    let home = std::env::temp_dir().join(format!("portcullis-cli-client-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    let alice_file = home.join("alice.key");
    let alice = keyfile::generate(&alice_file, false).unwrap();
    let policy = format!(
        "[[principal]]\nid = \"alice\"\npublic_key = \"{}\"\n[[grant]]\nid = \"g\"\nprincipals = [\"alice\"]\nresources = {{}}\n",
        key_b64(&alice)
    );
    let gw = Gateway::start(&policy, "");
    let (url, key, identity) = (
        gw.url.as_str(),
        gw.key.to_base64(),
        alice_file.to_str().unwrap(),
    );

    let first = portcullis(
        &home,
        &[
            "connect",
            url,
            "--gateway-key",
            &key,
            "--identity",
            identity,
        ],
    );
    assert!(first.status.success(), "{}", text(&first.stderr));
    let hello: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(hello["client_id"], "alice");
    let remembered = std::fs::read_to_string(home.join("portcullis/gateways.toml")).unwrap();
    assert!(remembered.contains(&key), "{remembered}");

    let ping = portcullis(
        &home,
        &["ping", url, "--identity", identity, "--count", "2"],
    );
    assert!(ping.status.success(), "{}", text(&ping.stderr));
    assert!(
        text(&ping.stdout).contains("pong 2:"),
        "{}",
        text(&ping.stdout)
    );

    let unknown = portcullis(
        &home,
        &["connect", "ws://127.0.0.1:1", "--identity", identity],
    );
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        text(&unknown.stderr).contains("no key is remembered"),
        "{}",
        text(&unknown.stderr)
    );

    // Without --identity a personal key is created (0600); this gateway does not know it.
    let stranger = portcullis(&home, &["connect", url]);
    assert_eq!(stranger.status.code(), Some(1));
    assert!(
        text(&stranger.stderr).contains("created your identity key"),
        "{}",
        text(&stranger.stderr)
    );
    assert!(
        text(&stranger.stderr).contains("authentication failed"),
        "{}",
        text(&stranger.stderr)
    );
    let mode = std::fs::metadata(home.join("portcullis/identity.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let _ = std::fs::remove_dir_all(home);
}
