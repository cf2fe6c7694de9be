//! `portcullis doctor` against a running gateway's real config: a root
//! that does not exist fails the check (exit 1) and says what to do;
//! once it exists every check passes, and the running gateway answers on
//! its admin socket.

mod common;

use common::{Gateway, key_b64};
use portcullis_crypto::StaticKeypair;
use serde_json::Value;

fn doctor(gw: &Gateway) -> (bool, Vec<Value>) {
    let out = gw.cli_config(&["doctor", "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let fine = report["status"] != "fail";
    assert_eq!(
        out.status.success(),
        fine,
        "exit code follows the worst check: {report}"
    );
    (fine, report["checks"].as_array().unwrap().clone())
}

fn check<'c>(checks: &'c [Value], name: &str) -> &'c Value {
    checks
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no check `{name}` in {checks:?}"))
}

#[test]
fn doctor_names_a_missing_root_and_passes_once_it_exists() {
    let alice = StaticKeypair::generate().unwrap();
    let policy = format!(
        "[[principal]]\nid = \"alice\"\npublic_key = \"{}\"\n\n\
         [[root]]\nid = \"main\"\npath = \"WORKSPACE\"\nvirtual_path = \"/w\"\n\n\
         [[root]]\nid = \"later\"\npath = \"GWDIR/later\"\nvirtual_path = \"/later\"\n\n\
         [[grant]]\nid = \"g\"\nprincipals = [\"alice\"]\nfileops = {{ main = \"rw\", later = \"ro\" }}\n",
        key_b64(&alice)
    );
    let gw = Gateway::start(&policy, "");

    let (fine, checks) = doctor(&gw);
    assert!(!fine);
    let missing = check(&checks, "root later");
    assert_eq!(missing["status"], "fail");
    assert!(
        missing["detail"].as_str().unwrap().contains("create it"),
        "{missing}"
    );
    assert_eq!(check(&checks, "root main")["status"], "ok");
    assert_eq!(check(&checks, "policy")["status"], "ok");
    assert_eq!(check(&checks, "gateway key")["status"], "ok");
    let admin = check(&checks, "admin socket");
    assert!(
        admin["detail"].as_str().unwrap().contains("answers"),
        "{admin}"
    );

    std::fs::create_dir(gw.dir.join("later")).unwrap();
    let (fine, checks) = doctor(&gw);
    assert!(fine, "{checks:?}");
    assert_eq!(check(&checks, "root later")["status"], "ok");
}

#[test]
fn doctor_fails_on_a_config_that_does_not_load() {
    let dir_dir = tempfile::Builder::new()
        .prefix("portcullis-doctor-")
        .tempdir()
        .unwrap();
    let dir = dir_dir.path().to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("portcullis.toml");
    std::fs::write(&config, "listen = [\"127.0.0.1:0\"]\nkey_file = 3\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(["doctor", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("fail  config:"), "{text}");
    assert!(
        text.contains("portcullis.toml:2:"),
        "names the position: {text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
