//! `cargo bench --bench gateway`: the real gateway binary on 127.0.0.1,
//! driven by the client library from this process (both share the
//! machine's cores).
//!
//! - connect + WebSocket upgrade + Noise handshake + hello, new connection
//!   each time: p50/p90/p99 over 1,000 connections;
//! - a small request (`resource.list`) on an open session: p50/p99;
//! - the daemon's RSS growth with 1,000 idle authenticated sessions;
//! - audited small requests per second with 1, 16 and 256 requests in
//!   flight at once (spread over up to 16 sessions), each answered only
//!   after its audit entry is durable;
//! - `shell.exec /bin/true` on an open session (network denied: a network
//!   namespace per command, and allowed: none) and with a new connection
//!   each time, beside the floor: spawning `/bin/true` from this process.
//!
//! Figures are printed, never asserted.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use portcullis_client::{Client, ClientOptions};
use portcullis_crypto::StaticKeypair;
use portcullis_wire::keyfile;
use serde_json::json;

const CONNECTIONS: usize = 1000;
const IDLE_SESSIONS: usize = 1000;
const REQUESTS: usize = 5000;
const EXECS: usize = 1000;

fn main() {
    // `cargo bench` passes --bench; a filter argument is not supported here.
    let dir = std::env::temp_dir().join(format!("portcullis-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let gateway_key = keyfile::generate(&dir.join("gateway.key"), false).unwrap();
    let client_key = StaticKeypair::generate().unwrap();
    let policy = format!(
        "[[principal]]\nid = \"bench\"\npublic_key = \"{}\"\n\n[[grant]]\nid = \"g\"\nprincipals = [\"bench\"]\nresources = {{}}\nshell = {{ commands = [\"/bin/true\"], max_processes = 64 }}\n\n[[grant]]\nid = \"net\"\nprincipals = [\"bench\"]\nshell = {{ commands = [\"/usr/bin/true\"], max_processes = 64, network = \"allow\" }}\n\n[[grant]]\nid = \"tools\"\nprincipals = [\"bench\"]\ntools = {{ allow = [\"add\"] }}\nscripts = {{ max_tool_calls = 100000, max_wall_time = \"60s\" }}\n\n[[tool]]\nname = \"add\"\ndescription = \"adds\"\ninput_schema = {{ type = \"object\", required = [\"a\", \"b\"], properties = {{ a = {{ type = \"integer\" }}, b = {{ type = \"integer\" }} }} }}\nrisk = \"low\"\napproval_policy = \"allow\"\nscript = \"add.rhai\"\n",
        client_key.public().to_base64()
    );
    std::fs::write(dir.join("policy.toml"), policy).unwrap();
    std::fs::write(dir.join("add.rhai"), "args.a + args.b").unwrap();
    std::fs::write(
        dir.join("portcullis.toml"),
        "listen = [\"127.0.0.1:0\"]\nkey_file = \"gateway.key\"\npolicy = \"policy.toml\"\nstate_dir = \"state\"\n\
         admin_socket = \"admin.sock\"\n[limits]\nmax_sessions_per_principal = 5000\nidle_timeout = \"10m\"\nmax_in_flight = 64\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(["serve", "--config"])
        .arg(dir.join("portcullis.toml"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the gateway");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = format!(
        "ws://{}",
        line.trim()
            .strip_prefix("listening on ")
            .expect("gateway address")
    );
    let pid = child.id();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let options = || ClientOptions::new(&url, *gateway_key.public(), client_key.clone());

        for _ in 0..50 {
            drop(Client::connect(options()).await.unwrap());
        }
        let mut connect = Vec::with_capacity(CONNECTIONS);
        for _ in 0..CONNECTIONS {
            let started = Instant::now();
            let client = Client::connect(options()).await.unwrap();
            connect.push(started.elapsed());
            drop(client);
        }
        report("connect+handshake+hello (new connection each)", &mut connect);

        let client = Client::connect(options()).await.unwrap();
        client.accept_all().await.unwrap();
        let mut requests = Vec::with_capacity(REQUESTS);
        for _ in 0..REQUESTS {
            let started = Instant::now();
            client.request("resource.list", json!({})).await.unwrap();
            requests.push(started.elapsed());
        }
        report("resource.list round trip on an open session", &mut requests);

        let mut floor = Vec::with_capacity(EXECS);
        for _ in 0..EXECS {
            let started = Instant::now();
            let status = Command::new("/bin/true").status().unwrap();
            floor.push(started.elapsed());
            assert!(status.success());
        }
        report("spawn /bin/true from this process (the floor)", &mut floor);
        let exec = json!({"command": ["/bin/true"]});
        let mut execs = time_execs(&client, &exec).await;
        report("shell.exec /bin/true on an open session", &mut execs);
        // The same under a grant with network = "allow": no network
        // namespace to make.
        let mut execs = time_execs(&client, &json!({"command": ["/usr/bin/true"]})).await;
        report("shell.exec /usr/bin/true, network allowed (no namespace)", &mut execs);
        // Tools: one tool.call request per call, against calls made from
        // inside one script; and what starting a script costs.
        let add = json!({"name": "add", "arguments": {"a": 1, "b": 2}});
        let mut calls = Vec::with_capacity(EXECS);
        for _ in 0..EXECS {
            let started = Instant::now();
            client.request("tool.call", add.clone()).await.unwrap();
            calls.push(started.elapsed());
        }
        let per_request: Duration = calls.iter().sum::<Duration>() / calls.len() as u32;
        report("tool.call round trip on an open session", &mut calls);
        let mut starts = Vec::with_capacity(EXECS);
        for _ in 0..EXECS {
            let started = Instant::now();
            client.request("script.run", json!({"source": "1"})).await.unwrap();
            starts.push(started.elapsed());
        }
        report("script.run of `1` (the cost of starting a script)", &mut starts);
        let in_script = json!({"source": "for i in 0..5000 { call_tool(\"add\", #{a: i, b: 1}); }"});
        let started = Instant::now();
        client.request("script.run", in_script).await.unwrap();
        let took = started.elapsed();
        println!(
            "tool calls: {:.0}/s inside one script (5,000 calls in {:.1} ms) vs {:.0}/s as one tool.call request each",
            5000.0 / took.as_secs_f64(),
            took.as_secs_f64() * 1e3,
            1.0 / per_request.as_secs_f64()
        );
        drop(client);
        let mut connect_exec = Vec::with_capacity(EXECS / 5);
        for _ in 0..EXECS / 5 {
            let started = Instant::now();
            let client = Client::connect(options()).await.unwrap();
            client.accept_all().await.unwrap();
            client.request("shell.exec", exec.clone()).await.unwrap();
            connect_exec.push(started.elapsed());
        }
        report("connect + shell.exec /bin/true (new connection each)", &mut connect_exec);

        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = rss_kib(pid);
        let mut idle = Vec::with_capacity(IDLE_SESSIONS);
        for _ in 0..IDLE_SESSIONS {
            let client = Client::connect(options()).await.unwrap();
            client.accept_all().await.unwrap();
            idle.push(client);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after = rss_kib(pid);
        println!(
            "gateway RSS: {before} KiB before, {after} KiB with {IDLE_SESSIONS} idle sessions: {:.1} KiB per session",
            (after.saturating_sub(before)) as f64 / IDLE_SESSIONS as f64
        );
        drop(idle);

        for concurrency in [1usize, 16, 256] {
            let sessions: Vec<std::sync::Arc<Client>> = {
                let mut all = Vec::new();
                for _ in 0..concurrency.min(16) {
                    let client = Client::connect(options()).await.unwrap();
                    client.accept_all().await.unwrap();
                    all.push(std::sync::Arc::new(client));
                }
                all
            };
            let deadline = Instant::now() + Duration::from_secs(3);
            let tasks: Vec<_> = (0..concurrency)
                .map(|i| {
                    let client = sessions[i % sessions.len()].clone();
                    tokio::spawn(async move {
                        let mut latencies = Vec::new();
                        while Instant::now() < deadline {
                            let started = Instant::now();
                            client.request("resource.list", json!({})).await.unwrap();
                            latencies.push(started.elapsed());
                        }
                        latencies
                    })
                })
                .collect();
            let mut latencies = Vec::new();
            for task in tasks {
                latencies.extend(task.await.unwrap());
            }
            let rate = latencies.len() as f64 / 3.0;
            report(&format!("audited requests, {concurrency} in flight ({rate:.0}/s)"), &mut latencies);
        }
    });
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `EXECS` round trips of `shell.exec` with `params`, one at a time.
async fn time_execs(client: &Client, params: &serde_json::Value) -> Vec<Duration> {
    let mut execs = Vec::with_capacity(EXECS);
    for _ in 0..EXECS {
        let started = Instant::now();
        let result = client.request("shell.exec", params.clone()).await.unwrap();
        execs.push(started.elapsed());
        assert_eq!(result["exit_code"], 0);
    }
    execs
}

fn report(what: &str, samples: &mut [Duration]) {
    samples.sort();
    let pick = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{what}: n={} p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        samples.len(),
        ms(pick(0.50)),
        ms(pick(0.90)),
        ms(pick(0.99)),
        ms(samples[samples.len() - 1])
    );
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
