//! The client CLI against the real gateway: `connect` and `ping`, the
//! remembered gateway keys and the identity created on first use.

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::process::{Command, Output};

use common::{Gateway, key_b64};
use portcullis_wire::keyfile;

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
    let home_dir = tempfile::Builder::new()
        .prefix("portcullis-cli-client-")
        .tempdir()
        .unwrap();
    let home = home_dir.path().to_path_buf();
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
    assert_eq!(hello["principal"], "alice");
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

#[test]
fn file_verbs_put_get_cat_ls_stat_mkdir_rm_and_grep() {
    let home_dir = tempfile::Builder::new()
        .prefix("portcullis-cli-files-")
        .tempdir()
        .unwrap();
    let home = home_dir.path().to_path_buf();
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    let alice_file = home.join("alice.key");
    let alice = keyfile::generate(&alice_file, false).unwrap();
    let policy = format!(
        r#"
[[principal]]
id = "alice"
public_key = "{}"

[[root]]
id = "main"
path = "WORKSPACE"
virtual_path = "/workspace/main"

[[grant]]
id = "g"
principals = ["alice"]
fileops = {{ main = "rw" }}
"#,
        key_b64(&alice)
    );
    let gw = Gateway::start(&policy, "");
    let key = gw.key.to_base64();
    let run = |verb: &str, rest: &[&str]| {
        let mut args = vec![verb, gw.url.as_str(), "--gateway-key", &key];
        args.extend(["--identity", alice_file.to_str().unwrap()]);
        args.extend(rest);
        portcullis(&home, &args)
    };
    let ok = |out: &Output| assert!(out.status.success(), "{}", text(&out.stderr));

    // 5 MiB and a bit up and down again (past the 4 MiB from which each
    // side writes straight to the disk, where its file system allows);
    // with --sha256 the gateway's digests of both directions are printed
    // and agree.
    let data: Vec<u8> = (0..5 * 1024 * 1024 + 77)
        .map(|i: u32| (i * 7 % 251) as u8)
        .collect();
    std::fs::write(home.join("up.bin"), &data).unwrap();
    let put = run(
        "put",
        &[
            home.join("up.bin").to_str().unwrap(),
            "main:dir/up.bin",
            "--json",
        ],
    );
    assert_eq!(
        put.status.code(),
        Some(1),
        "no parent yet: {}",
        text(&put.stderr)
    );
    assert!(
        text(&put.stderr).contains("not_found"),
        "{}",
        text(&put.stderr)
    );
    ok(&run("mkdir", &["main:dir/deeper", "-p"]));
    let put = run(
        "put",
        &[
            home.join("up.bin").to_str().unwrap(),
            "main:dir/up.bin",
            "--json",
            "--progress",
            "--sha256",
        ],
    );
    ok(&put);
    // Progress goes to stderr (a terminal would see it redrawn in place).
    assert!(
        text(&put.stderr).contains("/ 5.0 MiB"),
        "{}",
        text(&put.stderr)
    );
    let result: serde_json::Value = serde_json::from_slice(&put.stdout).unwrap();
    assert_eq!(result["size"], data.len());
    assert_eq!(
        std::fs::read(gw.dir.join("workspace/dir/up.bin")).unwrap(),
        data
    );
    let down = home.join("down.bin");
    let get = run(
        "get",
        &[
            "main:dir/up.bin",
            down.to_str().unwrap(),
            "--json",
            "--sha256",
        ],
    );
    ok(&get);
    assert_eq!(std::fs::read(&down).unwrap(), data);
    let got: serde_json::Value = serde_json::from_slice(&get.stdout).unwrap();
    assert_eq!(got["sha256"].as_str().map(str::len), Some(64), "{got}");
    assert_eq!(got["sha256"], result["sha256"]);
    // Without --sha256: the same file, no digest asked for.
    std::fs::remove_file(&down).unwrap();
    let get = run(
        "get",
        &["main:dir/up.bin", down.to_str().unwrap(), "--json"],
    );
    ok(&get);
    assert_eq!(std::fs::read(&down).unwrap(), data);
    let got: serde_json::Value = serde_json::from_slice(&get.stdout).unwrap();
    assert_eq!(got["bytes"], data.len());
    assert!(got.get("sha256").is_none(), "{got}");
    // A failed download leaves no file behind.
    let missing = run(
        "get",
        &["main:nope.bin", home.join("nope.bin").to_str().unwrap()],
    );
    assert_eq!(missing.status.code(), Some(1));
    assert!(!home.join("nope.bin").exists());
    assert!(!home.join(".nope.bin.portcullis-part").exists());
    // So does one the local disk has no room for (a 2 MiB tmpfs, which
    // takes direct writes on this kernel, for the 5 MiB file): the
    // error says why.
    assert!(
        rustix::process::geteuid().is_root(),
        "this test mounts a small tmpfs: run the suite as root (as .ci/run does)"
    );
    let small = home.join("small");
    std::fs::create_dir(&small).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount a 2 MiB tmpfs");
    let full = run(
        "get",
        &["main:dir/up.bin", small.join("up.bin").to_str().unwrap()],
    );
    let left: Vec<_> = std::fs::read_dir(&small).unwrap().flatten().collect();
    let unmounted = Command::new("umount").arg(&small).status().unwrap();
    assert_eq!(full.status.code(), Some(1), "{}", text(&full.stderr));
    assert!(
        text(&full.stderr).contains("No space left on device"),
        "{}",
        text(&full.stderr)
    );
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(unmounted.success());

    // Small things: stdin up, stdout down, listing, stat.
    let mut put = Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args([
            "put",
            gw.url.as_str(),
            "--identity",
            alice_file.to_str().unwrap(),
        ])
        .args(["-", "main:dir/hello.txt"])
        .env("XDG_CONFIG_HOME", &home)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    put.stdin
        .take()
        .unwrap()
        .write_all(b"hello, gateway\n")
        .unwrap();
    ok(&put.wait_with_output().unwrap());
    let cat = run("cat", &["main:dir/hello.txt"]);
    ok(&cat);
    assert_eq!(text(&cat.stdout), "hello, gateway\n");
    let ls = run("ls", &["main:dir", "--json"]);
    ok(&ls);
    let names: Vec<String> = text(&ls.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["name"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(names, ["deeper", "hello.txt", "up.bin"]);
    let ls = run("ls", &["main:", "-d", "2"]);
    ok(&ls);
    assert!(
        text(&ls.stdout).contains("/workspace/main/dir/hello.txt"),
        "{}",
        text(&ls.stdout)
    );
    let stat = run("stat", &["main:dir/hello.txt", "--json"]);
    ok(&stat);
    let stat: serde_json::Value = serde_json::from_slice(&stat.stdout).unwrap();
    assert_eq!(
        (stat["kind"].as_str(), stat["size"].as_u64()),
        (Some("file"), Some(15))
    );

    // grep: matches print as path:line:text; nothing found exits 2.
    let grep = run("grep", &["gate.ay", "main:"]);
    ok(&grep);
    assert_eq!(
        text(&grep.stdout),
        "/workspace/main/dir/hello.txt:1:hello, gateway\n"
    );
    let none = run("grep", &["-F", "gate.ay", "main:"]);
    assert_eq!(none.status.code(), Some(2), "{}", text(&none.stderr));

    // rm: a directory needs -r; bad ROOT:PATH is a usage error.
    let rm = run("rm", &["main:dir"]);
    assert_eq!(rm.status.code(), Some(1));
    assert!(
        text(&rm.stderr).contains("invalid_request"),
        "{}",
        text(&rm.stderr)
    );
    ok(&run("rm", &["main:dir", "-r"]));
    assert!(!gw.dir.join("workspace/dir").exists());
    let usage = run("cat", &["no-colon"]);
    assert_eq!(usage.status.code(), Some(2));
    assert!(
        text(&usage.stderr).contains("ROOT:PATH"),
        "{}",
        text(&usage.stderr)
    );
    // Requests answered: put (refused), mkdir, put, stat+read twice, stat
    // (get of the missing file), stat+read (get onto the full disk), write,
    // read, list, list, stat, 2 searches, 2 deletes.
    gw.assert_requests_audited(19);
    let _ = std::fs::remove_dir_all(home);
}
