//! Started processes end to end: persistence across a dropped connection,
//! `shell.attach` replaying what was missed (and reporting what the ring
//! no longer holds), terminals with resize, the idle timeout, revocation of
//! a detached process, and a gateway restart.

mod common;

use std::time::{Duration, Instant};

use common::{Gateway, key_b64, processes_with};
use portcullis_client::{Client, ClientError, RequestHandle, StreamItem};
use portcullis_crypto::StaticKeypair;
use portcullis_wire::frame::ErrorCode;
use portcullis_wire::record::Channel;
use serde_json::{Value, json};

/// alice may keep processes and open terminals; bob's end with his session.
fn policy(alice: &StaticKeypair, bob: &StaticKeypair, alice_shell: bool) -> String {
    let shell = match alice_shell {
        true => {
            r#"shell = { commands = ["sh", "bash", "head", "sleep"], cwd_roots = ["main"], env_set = { PATH = "/usr/bin:/bin" }, persist = true, pty = true, idle_timeout = "IDLE" }"#
        }
        false => "",
    };
    format!(
        r#"
[[principal]]
id = "alice"
public_key = "{alice}"

[[principal]]
id = "bob"
public_key = "{bob}"

[[root]]
id = "main"
path = "GWDIR/workspace"
virtual_path = "/workspace/main"

[[grant]]
id = "alice"
principals = ["alice"]
fileops = {{ main = "rw" }}
resources = {{ max_resources = 16 }}
{shell}

[[grant]]
id = "bob"
principals = ["bob"]
shell = {{ commands = ["sh"], env_set = {{ PATH = "/usr/bin:/bin" }} }}
"#,
        alice = key_b64(alice),
        bob = key_b64(bob),
    )
}

struct Setup {
    gw: Gateway,
    alice: StaticKeypair,
    bob: StaticKeypair,
}

fn setup(idle: &str) -> Setup {
    let (alice, bob) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let gw = Gateway::start(&policy(&alice, &bob, true).replace("IDLE", idle), "");
    std::fs::create_dir_all(gw.dir.join("workspace")).unwrap();
    Setup { gw, alice, bob }
}

async fn connect(gw: &Gateway, who: &StaticKeypair) -> Client {
    let client = gw.connect(who).await.unwrap();
    client.accept_all().await.unwrap();
    client
}

fn sh(script: &str) -> Value {
    json!({"command": ["sh", "-c", script], "root_id": "main", "cwd": ""})
}

/// What one following request (start or attach) has seen so far.
#[derive(Default)]
struct Seen {
    frames: Vec<(String, Value)>,
    output: Vec<u8>,
    channels: Vec<Channel>,
}

impl Seen {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.output).into_owned()
    }

    fn frame(&self, name: &str) -> Option<&Value> {
        self.frames.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }
}

/// Reads stream items until the output contains `until` (or the stream
/// ends); panics after 10 s.
async fn read_until(handle: &mut RequestHandle<'_>, seen: &mut Seen, until: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen.text().contains(until) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, handle.next()).await {
            Ok(Some(StreamItem::Stream { event, data })) => seen.frames.push((event, data)),
            Ok(Some(StreamItem::Chunk { channel, data })) => {
                seen.output.extend(&data);
                seen.channels.push(channel);
            }
            Ok(None) => return,
            Err(_) => panic!("waited 10 s for {until:?}; have {:?}", seen.text()),
        }
    }
}

/// Polls until `check` holds (10 s at most).
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "waited 10 s for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn remote(result: &Result<Value, ClientError>) -> Option<(ErrorCode, String)> {
    match result {
        Err(ClientError::Remote(e)) => Some((e.code, e.message.clone())),
        _ => None,
    }
}

#[tokio::test]
async fn a_persistent_process_outlives_its_connection_and_attach_replays_what_was_missed() {
    let Setup { gw, alice, bob } = setup("1h");
    let marker = format!("persist-{}", std::process::id());
    let script =
        format!("echo one; sleep 1; echo two; sleep 0.2; echo err >&2; sleep 60; : {marker}");
    let first = connect(&gw, &alice).await;
    let mut start = first.start("shell.start", sh(&script)).await.unwrap();
    let mut seen = Seen::default();
    read_until(&mut start, &mut seen, "one\n").await;
    let started = seen.frame("started").expect("a started frame").clone();
    assert_eq!(started["persist"], true);
    let id = started["process_id"].as_str().unwrap().to_string();
    drop(start);
    drop(first);

    // It runs on, and writes while nobody listens.
    tokio::time::sleep(Duration::from_millis(1700)).await;
    assert!(
        !processes_with(&marker).is_empty(),
        "the process survived the connection"
    );
    let second = connect(&gw, &alice).await;
    let listed = second.request("shell.list", json!({})).await.unwrap();
    let entry = &listed["processes"][0];
    assert_eq!(entry["process_id"], id.as_str(), "{listed}");
    assert_eq!(entry["state"], "running");
    assert_eq!(entry["next_seq"], 12, "one\\ntwo\\nerr\\n: {listed}");
    let resources = second.request("resource.list", json!({})).await.unwrap();
    assert!(
        resources["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["id"] == id.as_str() && r["kind"] == "process"),
        "{resources}"
    );

    // Attach from where the first connection stopped: the rest, in order,
    // each byte on its channel.
    let mut attach = second
        .start("shell.attach", json!({"process_id": id, "from_seq": 4}))
        .await
        .unwrap();
    let mut replay = Seen::default();
    read_until(&mut attach, &mut replay, "err\n").await;
    let attached = replay.frame("attached").unwrap();
    assert_eq!(
        (
            &attached["from_seq"],
            &attached["first_seq"],
            &attached["truncated"]
        ),
        (&json!(4), &json!(0), &json!(false)),
        "{attached}"
    );
    assert_eq!(replay.text(), "two\nerr\n");
    assert_eq!(replay.channels, [Channel::Stdout, Channel::Stderr]);

    let beyond = second
        .request("shell.attach", json!({"process_id": id, "from_seq": 999}))
        .await;
    assert_eq!(
        remote(&beyond).map(|r| r.0),
        Some(ErrorCode::InvalidRequest)
    );

    // Another principal sees nothing of it.
    let other = connect(&gw, &bob).await;
    let foreign = other
        .request("shell.attach", json!({"process_id": id}))
        .await;
    assert_eq!(remote(&foreign).map(|r| r.0), Some(ErrorCode::NotFound));

    // Ending it answers the attach with the exit, and the session hears
    // `process.exited`.
    let cancelled = second
        .request("shell.cancel", json!({"process_id": id}))
        .await
        .unwrap();
    assert_eq!(cancelled["cancelled"], true);
    let result = attach.response().await.unwrap();
    assert_eq!(result["ended_by"], "cancelled", "{result}");
    assert_eq!(result["signal"], "SIGKILL");
    assert_eq!(
        (
            result["stdout_bytes"].as_u64(),
            result["stderr_bytes"].as_u64()
        ),
        (Some(8), Some(4))
    );
    let exited = second
        .next_event(Duration::from_secs(5))
        .await
        .expect("an event");
    assert_eq!(exited.event, "process.exited");
    assert_eq!(exited.payload["process_id"], id.as_str());
    assert!(processes_with(&marker).is_empty());

    // Kept after its exit: a new attach replays all and answers at once.
    let mut again = second
        .start("shell.attach", json!({"process_id": id}))
        .await
        .unwrap();
    let mut all = Seen::default();
    read_until(&mut again, &mut all, "err\n").await;
    assert_eq!(all.text(), "one\ntwo\nerr\n");
    assert_eq!(all.frame("attached").unwrap()["state"], "exited");
    assert_eq!(again.response().await.unwrap()["ended_by"], "cancelled");
    let status = second
        .request("shell.status", json!({"process_id": id}))
        .await
        .unwrap();
    assert_eq!(status["state"], "exited", "{status}");

    // Disposed of as a resource, it is gone.
    second
        .request("resource.dispose", json!({"id": id}))
        .await
        .unwrap();
    let gone = second
        .request("shell.status", json!({"process_id": id}))
        .await;
    assert_eq!(remote(&gone).map(|r| r.0), Some(ErrorCode::NotFound));
}

#[tokio::test]
async fn without_persist_a_process_ends_with_its_connection() {
    let Setup { gw, bob, .. } = setup("1h");
    let marker = format!("transient-{}", std::process::id());
    let client = connect(&gw, &bob).await;
    let mut start = client
        .start(
            "shell.start",
            json!({"command": ["sh", "-c", format!("echo up; sleep 60; : {marker}")]}),
        )
        .await
        .unwrap();
    let mut seen = Seen::default();
    read_until(&mut start, &mut seen, "up\n").await;
    assert_eq!(seen.frame("started").unwrap()["persist"], false);
    drop(start);
    drop(client);
    eventually("the process was killed with its session", || {
        processes_with(&marker).is_empty()
    })
    .await;
    let again = connect(&gw, &bob).await;
    let listed = again.request("shell.list", json!({})).await.unwrap();
    assert_eq!(listed["processes"], json!([]));
}

#[tokio::test]
async fn a_reader_that_falls_behind_the_ring_is_told_what_it_missed() {
    let Setup { gw, alice, .. } = setup("1h");
    let client = connect(&gw, &alice).await;
    // 3 MB while the client reads nothing: the process never waits, and
    // the ring (1 MiB) keeps the newest output. (This client's reader
    // stalls on the unread stream, so another connection looks.)
    let start = client
        .start("shell.start", sh("head -c 3000000 /dev/zero; echo end"))
        .await
        .unwrap();
    let looker = connect(&gw, &alice).await;
    let id = loop {
        let listed = looker.request("shell.list", json!({})).await.unwrap();
        if let Some(p) = listed["processes"].as_array().unwrap().first()
            && p["state"] == "exited"
        {
            break p["process_id"].as_str().unwrap().to_string();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    drop(start);
    let total = 3_000_004u64;
    let mut attach = looker
        .start("shell.attach", json!({"process_id": id, "from_seq": 0}))
        .await
        .unwrap();
    let mut seen = Seen::default();
    read_until(&mut attach, &mut seen, "end\n").await;
    let attached = seen.frame("attached").unwrap().clone();
    let first = attached["first_seq"].as_u64().unwrap();
    assert_eq!(attached["truncated"], true);
    assert_eq!(attached["next_seq"], total);
    assert!(first > 0 && total - first <= 1 << 20, "{attached}");
    let report = seen.frame("output_truncated").expect("the gap is reported");
    assert_eq!(report["missed_bytes"], first, "{report}");
    assert_eq!(
        seen.output.len() as u64,
        total - first,
        "exactly what was kept"
    );
    let result = attach.response().await.unwrap();
    assert_eq!(
        (
            result["exit_code"].as_i64(),
            result["missed_bytes"].as_u64()
        ),
        (Some(0), Some(first))
    );
}

#[tokio::test]
async fn a_terminal_has_its_size_hears_resizes_and_takes_input() {
    let Setup { gw, alice, .. } = setup("1h");
    let client = connect(&gw, &alice).await;
    let script = r#"trap 'stty size' WINCH; echo "term=$TERM tty=$(tty)"; stty size; while read line; do echo "got $line"; done"#;
    let mut start = client
        .start(
            "shell.start",
            json!({"command": ["bash", "-c", script], "pty": true, "cols": 100, "rows": 30}),
        )
        .await
        .unwrap();
    let mut seen = Seen::default();
    read_until(&mut start, &mut seen, "30 100").await;
    let id = seen.frame("started").unwrap()["process_id"]
        .as_str()
        .unwrap()
        .to_string();
    // In its world the terminal is /dev/console (bwrap's /dev has a devpts
    // of its own; the terminal is the host's).
    assert!(
        seen.text().contains("term=xterm-256color tty=/dev/console"),
        "{}",
        seen.text()
    );
    assert!(seen.channels.iter().all(|c| *c == Channel::Terminal));
    client
        .request(
            "shell.resize",
            json!({"process_id": id, "cols": 120, "rows": 40}),
        )
        .await
        .unwrap();
    // SIGWINCH runs the trap once bash is back from `read`.
    client
        .request("shell.input", json!({"process_id": id, "data": "hello\n"}))
        .await
        .unwrap();
    read_until(&mut start, &mut seen, "got hello").await;
    read_until(&mut start, &mut seen, "40 120").await;
    // ^C reaches the foreground job through the terminal.
    client
        .request("shell.input", json!({"process_id": id, "data": "\u{3}"}))
        .await
        .unwrap();
    let result = tokio::time::timeout(Duration::from_secs(10), start.response())
        .await
        .expect("the terminal's process ends on ^C")
        .unwrap();
    assert_eq!(result["signal"], "SIGINT", "{result}");
    // A process without a terminal cannot be resized.
    let mut plain = client
        .start("shell.start", sh("exec sleep 5"))
        .await
        .unwrap();
    let Some(StreamItem::Stream { event, data }) = plain.next().await else {
        panic!("no started frame");
    };
    assert_eq!(event, "started");
    let running = data["process_id"].clone();
    let refused = client
        .request(
            "shell.resize",
            json!({"process_id": running, "cols": 10, "rows": 10}),
        )
        .await;
    assert_eq!(
        remote(&refused).map(|r| r.0),
        Some(ErrorCode::InvalidRequest)
    );
    plain.cancel().await.unwrap();
}

/// A signal sent as soon as the gateway says the process started — before
/// the program may have been forked in its world — still reaches it: the
/// launcher holds it and passes it on (it was lost, and `sleep 60` ran its
/// minute, about one time in three).
#[tokio::test]
async fn a_signal_sent_right_after_started_reaches_the_program() {
    let Setup { gw, alice, .. } = setup("1h");
    let client = connect(&gw, &alice).await;
    for _ in 0..5 {
        let mut start = client
            .start("shell.start", sh("exec sleep 60"))
            .await
            .unwrap();
        let mut seen = Seen::default();
        while seen.frame("started").is_none() {
            match start.next().await.expect("a started frame") {
                StreamItem::Stream { event, data } => seen.frames.push((event, data)),
                StreamItem::Chunk { .. } => {}
            }
        }
        let id = seen.frame("started").unwrap()["process_id"].clone();
        client
            .request("shell.signal", json!({"process_id": id, "signal": "TERM"}))
            .await
            .unwrap();
        let result = tokio::time::timeout(Duration::from_secs(10), start.response())
            .await
            .expect("the TERM ended it")
            .unwrap();
        assert_eq!(result["signal"], "SIGTERM", "{result}");
    }
}

#[tokio::test]
async fn a_start_with_stdin_gives_the_text_then_closes_it() {
    let Setup { gw, alice, .. } = setup("1h");
    let client = connect(&gw, &alice).await;
    for (text, expected) in [("one\ntwo\n", "one\ntwo\nend\n"), ("", "end\n")] {
        let mut params = sh("cat; echo end");
        params["stdin"] = json!(text);
        let mut start = client.start("shell.start", params).await.unwrap();
        let mut seen = Seen::default();
        read_until(&mut start, &mut seen, "end\n").await;
        assert_eq!(seen.text(), expected);
        let id = seen.frame("started").unwrap()["process_id"].clone();
        let result = tokio::time::timeout(Duration::from_secs(10), start.response())
            .await
            .expect("cat ends at the end of its input")
            .unwrap();
        assert_eq!(result["exit_code"], 0, "{result}");
        // Its stdin is closed: more input has nowhere to go.
        let more = client
            .request("shell.input", json!({"process_id": id, "data": "x"}))
            .await;
        assert_eq!(remote(&more).map(|r| r.0), Some(ErrorCode::NotFound));
    }
    // A terminal's input is typed, not given at the start.
    let refused = client
        .request(
            "shell.start",
            json!({"command": ["sh", "-c", "true"], "pty": true, "stdin": "x"}),
        )
        .await;
    let (code, message) = remote(&refused).expect("refused");
    assert_eq!(code, ErrorCode::InvalidRequest);
    assert!(message.contains("shell.input"), "{message}");
}

#[tokio::test]
async fn an_idle_detached_process_is_ended_and_a_revoked_one_killed() {
    let Setup { gw, alice, bob } = setup("2s");
    let marker = format!("idle-{}", std::process::id());
    let client = connect(&gw, &alice).await;
    let mut start = client
        .start("shell.start", sh(&format!("echo up; sleep 60; : {marker}")))
        .await
        .unwrap();
    read_until(&mut start, &mut Seen::default(), "up\n").await;
    drop(start);
    drop(client);
    // Detached and silent: ended after its idle_timeout (2 s).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !processes_with(&marker).is_empty(),
        "still within its idle time"
    );
    eventually("the idle process was ended", || {
        processes_with(&marker).is_empty()
    })
    .await;

    // A detached process whose grant is taken away is killed.
    let marker = format!("revoked-{}", std::process::id());
    let client = connect(&gw, &alice).await;
    let script = format!("while :; do echo tick; sleep 0.2; done # {marker}");
    let mut start = client.start("shell.start", sh(&script)).await.unwrap();
    read_until(&mut start, &mut Seen::default(), "tick").await;
    drop(start);
    drop(client);
    gw.write_policy(&policy(&alice, &bob, false));
    gw.signal("HUP");
    eventually("the revoked process was killed", || {
        processes_with(&marker).is_empty()
    })
    .await;
}

#[tokio::test]
async fn a_grant_that_says_survive_keeps_its_processes_through_revocation() {
    let (alice, bob) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let surviving = policy(&alice, &bob, true).replace("IDLE", "1h").replace(
        "persist = true",
        "persist = true, survive_revocation = true",
    );
    let gw = Gateway::start(&surviving, "");
    let marker = format!("survivor-{}", std::process::id());
    let client = connect(&gw, &alice).await;
    // One followed by its start request, one detached.
    let script = format!("echo up; sleep 60; : {marker}");
    let mut followed = client.start("shell.start", sh(&script)).await.unwrap();
    read_until(&mut followed, &mut Seen::default(), "up\n").await;
    let other = connect(&gw, &alice).await;
    let mut detached = other.start("shell.start", sh(&script)).await.unwrap();
    read_until(&mut detached, &mut Seen::default(), "up\n").await;
    drop(detached);
    drop(other);

    gw.write_policy(&policy(&alice, &bob, false));
    gw.signal("HUP");
    // The start request is answered (its grant is gone), the process not
    // killed.
    let answer = tokio::time::timeout(Duration::from_secs(10), followed.response())
        .await
        .expect("the revoked start request was answered");
    assert_eq!(
        remote(&answer).map(|r| r.0),
        Some(ErrorCode::PermissionDenied),
        "{answer:?}"
    );
    // Several keeper rounds later both still run.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(processes_with(&marker).len(), 2, "both processes survive");
    // They are still the principal's: with the grant back, listed.
    gw.write_policy(&surviving);
    gw.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    let (client, list) = loop {
        let client = connect(&gw, &alice).await;
        if let Ok(list) = client.request("shell.list", json!({})).await {
            break (client, list);
        }
        assert!(Instant::now() < deadline, "the shell grant came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let running: Vec<&Value> = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["state"] == "running")
        .collect();
    assert_eq!(running.len(), 2, "{list}");
    for process in running {
        let id = json!({"process_id": process["process_id"]});
        client.request("shell.cancel", id).await.unwrap();
    }
    eventually("cancelled survivors are gone", || {
        processes_with(&marker).is_empty()
    })
    .await;
}

#[tokio::test]
async fn after_a_restart_old_process_ids_answer_not_found_with_why() {
    let Setup { mut gw, alice, .. } = setup("1h");
    let marker = format!("restart-{}", std::process::id());
    let client = connect(&gw, &alice).await;
    let instance = client.hello().instance_id.clone();
    let mut start = client
        .start("shell.start", sh(&format!("echo up; sleep 60; : {marker}")))
        .await
        .unwrap();
    let mut seen = Seen::default();
    read_until(&mut start, &mut seen, "up\n").await;
    let id = seen.frame("started").unwrap()["process_id"]
        .as_str()
        .unwrap()
        .to_string();
    drop(start);
    drop(client);
    gw.restart();
    assert!(
        processes_with(&marker).is_empty(),
        "stopped with the gateway"
    );
    let client = connect(&gw, &alice).await;
    assert_ne!(client.hello().instance_id, instance, "a fresh instance id");
    let old = client
        .request("shell.attach", json!({"process_id": id}))
        .await;
    let (code, message) = remote(&old).expect("an error");
    assert_eq!(code, ErrorCode::NotFound);
    assert!(message.contains("earlier run of the gateway"), "{message}");
}

/// `portcullis shell` in a local terminal: raw mode (keys go through as
/// typed), the remote terminal has the local size, the exit code comes
/// back, and the local terminal is restored.
#[test]
fn the_shell_verb_gives_an_interactive_terminal() {
    use rustix::pty::OpenptFlags;
    use rustix::termios::{LocalModes, Winsize, tcgetattr, tcsetwinsize};
    use std::io::{Read as _, Write as _};

    let home_dir = tempfile::Builder::new()
        .prefix("portcullis-shell-verb-")
        .tempdir()
        .unwrap();

    let home = home_dir.path().to_path_buf();
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    let alice = portcullis_wire::keyfile::generate(&home.join("alice.key"), false).unwrap();
    let bob = StaticKeypair::generate().unwrap();
    let gw = Gateway::start(&policy(&alice, &bob, true).replace("IDLE", "1h"), "");
    std::fs::create_dir_all(gw.dir.join("workspace")).unwrap();

    // A local terminal for the client, 100 columns by 30 rows.
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags).unwrap();
    rustix::pty::grantpt(&master).unwrap();
    rustix::pty::unlockpt(&master).unwrap();
    let user = rustix::pty::ioctl_tiocgptpeer(&master, flags).unwrap();
    let size = Winsize {
        ws_row: 30,
        ws_col: 100,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    tcsetwinsize(&master, size).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args([
            "shell",
            gw.url.as_str(),
            "--gateway-key",
            &gw.key.to_base64(),
        ])
        .args(["--identity", home.join("alice.key").to_str().unwrap()])
        .args([
            "--cwd",
            "main:",
            "--",
            "bash",
            "--norc",
            "--noprofile",
            "-i",
        ])
        .env("XDG_CONFIG_HOME", &home)
        .stdin(std::process::Stdio::from(user.try_clone().unwrap()))
        .stdout(std::process::Stdio::from(user.try_clone().unwrap()))
        .stderr(std::process::Stdio::from(user.try_clone().unwrap()))
        .spawn()
        .unwrap();
    let mut terminal = std::fs::File::from(master);
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let mut reader = terminal.try_clone().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = reader.read(&mut buf) {
            let _ = tx.send(buf[..n].to_vec());
        }
    });
    let mut seen = String::new();
    let mut wait_for = |needle: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !seen.contains(needle) {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(data) => seen.push_str(&String::from_utf8_lossy(&data)),
                Err(_) => panic!("waited 10 s for {needle:?}; saw {seen:?}"),
            }
        }
    };
    terminal.write_all(b"stty size; echo $TERM\r").unwrap();
    wait_for("30 100");
    wait_for("xterm-256color");
    // In raw mode locally, so ^C goes to the remote foreground job.
    let raw = tcgetattr(&user).unwrap();
    assert!(
        !raw.local_modes.contains(LocalModes::ICANON),
        "raw while it runs"
    );
    terminal.write_all(b"sleep 30; echo slept\r").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    terminal.write_all(b"\x03").unwrap();
    terminal.write_all(b"echo after-interrupt\r").unwrap();
    wait_for("after-interrupt\r\n");
    assert!(
        !seen.contains("\nslept"),
        "the sleep was interrupted: {seen}"
    );
    terminal.write_all(b"exit 3\r").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the client did not exit; saw {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(3), "{seen}");
    let restored = tcgetattr(&user).unwrap();
    assert!(
        restored.local_modes.contains(LocalModes::ICANON),
        "the terminal was restored"
    );
    let _ = std::fs::remove_dir_all(home);
}
