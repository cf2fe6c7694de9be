//! The side-by-side measurements. Each takes several rounds; inside a
//! round portcullis and OpenSSH take turns, so both see the same machine.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::task::JoinSet;

use crate::gateway::Gateway;
use crate::measure::{self, Latencies, Spread};
use crate::report::{Better, Concurrency, Results, Row};
use crate::sftp::Sftp;
use crate::sshd::Sshd;
use crate::{Args, settle};

/// Runs `command` to its end; its time.
async fn timed(command: Command) -> Result<Duration, String> {
    let what = format!("{:?}", command.get_program());
    let mut command = tokio::process::Command::from(command);
    let started = Instant::now();
    let status = command.status().await.map_err(|e| format!("{what}: {e}"))?;
    let took = started.elapsed();
    match status.success() {
        true => Ok(took),
        false => Err(format!("{what}: {status}")),
    }
}

/// Runs `one` `samples` times, one after another: the times it returns,
/// and the whole machine's busy CPU seconds meanwhile.
async fn each_timed(
    samples: usize,
    mut one: impl AsyncFnMut() -> Result<Duration, String>,
) -> Result<(Latencies, f64), String> {
    let mut latencies = Latencies::default();
    let busy = measure::machine_busy_seconds();
    for _ in 0..samples {
        latencies.push(one().await?);
    }
    Ok((latencies, measure::machine_busy_seconds() - busy))
}

/// `one`, `samples` times with `pause` after each: latencies of what runs
/// on an otherwise idle machine.
async fn each_spaced(
    samples: usize,
    pause: Duration,
    mut one: impl AsyncFnMut() -> Result<Duration, String>,
) -> Result<Latencies, String> {
    let mut latencies = Latencies::default();
    for _ in 0..samples {
        latencies.push(one().await?);
        tokio::time::sleep(pause).await;
    }
    Ok(latencies)
}

/// Between spaced execs: long enough for the gateway's pool to build the
/// next world (about 8 ms of wall time here) and for the machine to be
/// idle when the next one starts.
const EXEC_SPACING: Duration = Duration::from_millis(25);

/// A shell script printing `bytes` bytes of text as fast as `yes` can.
fn printing(bytes: u64) -> String {
    format!("yes abcdefghijklmnopqrstuvwxyz0123456789 | head -c {bytes}")
}

/// `shell.exec` or `shell.start` parameters running `script` with
/// `/bin/sh` in the bench's root.
fn sh_params(script: &str) -> serde_json::Value {
    json!({"command": ["/bin/sh", "-c", script], "root_id": "work"})
}

fn ssh_true(mut ssh: Command) -> Command {
    ssh.arg("true");
    ssh
}

/// Idle authenticated sessions: the server's memory per session and its
/// CPU time per session opened and closed (handshake, authentication,
/// teardown).
pub async fn sessions(
    args: &Args,
    gateway: &Gateway,
    sshd: &Sshd,
    results: &mut Results,
) -> Result<(), String> {
    for &count in &args.sessions {
        // A thousand sessions take minutes with sshd: those are one round.
        let rounds = if count > 200 { 1 } else { args.rounds };
        let [mut our_memory, mut our_cpu, mut ssh_memory, mut ssh_cpu]: [Spread; 4] =
            Default::default();
        for round in 0..rounds {
            eprintln!("idle sessions: {count}, round {}", round + 1);
            let (kib, cpu) = gateway_sessions(gateway, count).await?;
            our_memory.push(kib);
            our_cpu.push(cpu);
            let (kib, cpu) = sshd_sessions(sshd, count).await?;
            ssh_memory.push(kib);
            ssh_cpu.push(cpu);
        }
        results.rows.push(Row::new(
            "Sessions",
            format!("memory per idle session, {count} sessions (gateway RSS growth; sshd PSS)"),
            "KiB",
            our_memory,
            ssh_memory,
            Better::Lower,
            1,
        ));
        results.rows.push(Row::new(
            "Sessions",
            format!(
                "server CPU per session: connect, handshake, authenticate, close ({count} sessions)"
            ),
            "ms",
            our_cpu,
            ssh_cpu,
            Better::Lower,
            2,
        ));
    }
    let count = args.gateway_sessions;
    eprintln!("idle sessions: {count}, the gateway alone");
    let (kib, cpu) = gateway_sessions(gateway, count).await?;
    let (mut memory, mut time) = (Spread::default(), Spread::default());
    memory.push(kib);
    time.push(cpu);
    let what = format!("memory per idle session, {count} sessions (gateway only)");
    results.rows.push(Row::alone(
        "Sessions",
        what,
        "KiB",
        memory,
        Better::Lower,
        1,
    ));
    let what = format!("server CPU per session ({count} sessions, gateway only)");
    results
        .rows
        .push(Row::alone("Sessions", what, "ms", time, Better::Lower, 2));
    Ok(())
}

/// Opens `count` sessions (16 at a time), reads the gateway's RSS, closes
/// them: (KiB per session, CPU ms per session).
async fn gateway_sessions(gateway: &Gateway, count: usize) -> Result<(f64, f64), String> {
    let pid = gateway.pid();
    settle().await;
    let (rss_before, cpu_before) = (measure::rss_kib(pid), measure::cpu_seconds(pid, false));
    let open = gateway.sessions(count).await?;
    settle().await;
    let rss_after = measure::rss_kib(pid);
    drop(open);
    settle().await;
    let cpu = measure::cpu_seconds(pid, false) - cpu_before;
    let kib = rss_after.saturating_sub(rss_before) as f64 / count as f64;
    Ok((kib, cpu * 1e3 / count as f64))
}

/// The same with `ssh -f -N` (authenticated, no command, in the
/// background): (KiB of PSS per session, CPU ms per session, counting the
/// per-connection processes sshd reaped).
async fn sshd_sessions(sshd: &Sshd, count: usize) -> Result<(f64, f64), String> {
    let pss = |sshd: &Sshd| -> u64 { sshd.processes().iter().map(|p| measure::pss_kib(*p)).sum() };
    sshd.wait_for_connections(0, Duration::from_secs(30));
    let (pss_before, cpu_before) = (pss(sshd), measure::cpu_seconds(sshd.pid(), true));
    // The marker finds the background clients again to stop them.
    let marker = "ServerAliveInterval=1799";
    let mut opened = 0;
    while opened < count {
        let mut batch = JoinSet::new();
        for _ in 0..8.min(count - opened) {
            let mut ssh = sshd.ssh();
            ssh.args(["-f", "-N", "-o", marker]);
            batch.spawn(timed(ssh));
        }
        while let Some(joined) = batch.join_next().await {
            joined.map_err(|e| e.to_string())??;
            opened += 1;
        }
    }
    settle().await;
    let pss_after = pss(sshd);
    let dir = sshd.dir().display().to_string();
    for pid in measure::processes_with(&[marker, &dir]) {
        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
    }
    sshd.wait_for_connections(0, Duration::from_secs(60));
    let cpu = measure::cpu_seconds(sshd.pid(), true) - cpu_before;
    let kib = pss_after.saturating_sub(pss_before) as f64 / count as f64;
    Ok((kib, cpu * 1e3 / count as f64))
}

/// `true` on an open session: `shell.exec` on a portcullis session beside
/// `ssh` over a ControlMaster connection; the local spawn floor; and the
/// launcher run directly with the bench grant's world, which is what
/// every sandboxed command costs before the gateway does anything. Each
/// with the whole machine's CPU per command (all processes and kernel
/// threads), since a command's world is torn down by processes nobody
/// waits for and by the kernel's workers.
pub async fn exec(
    args: &Args,
    gateway: &Gateway,
    sshd: &mut Sshd,
    results: &mut Results,
) -> Result<(), String> {
    let client = gateway.session().await.map_err(|e| e.to_string())?;
    let exec = json!({"command": ["/bin/true"]});
    let launcher = launcher_running_true(gateway)?;
    // p50, p99 and machine CPU per command of: ours, ssh, the floor, the
    // launcher alone.
    let mut figures: [[Spread; 3]; 4] = Default::default();
    // p50 and p99 of ours and ssh, spaced.
    let mut spaced: [[Spread; 2]; 2] = Default::default();
    // The least a spaced exec waits for (see its row), and what it is made of.
    let (mut least_ms, mut commits_per_exec, mut commit_ms) = <(Spread, Spread, Spread)>::default();
    let shell_exec_true = async || {
        let started = Instant::now();
        let result = client
            .request("shell.exec", exec.clone())
            .await
            .map_err(|e| format!("shell.exec: {e}"))?;
        match result["exit_code"] == 0 {
            true => Ok(started.elapsed()),
            false => Err(format!("shell.exec /bin/true: {result}")),
        }
    };
    for round in 0..args.rounds {
        eprintln!("exec true on an open session, round {}", round + 1);
        let shell_exec = each_timed(args.samples, shell_exec_true).await?;
        let ssh = each_timed(args.samples, async || {
            timed(ssh_true(sshd.ssh_muxed()?)).await
        })
        .await?;
        eprintln!("exec true on an open session, spaced, round {}", round + 1);
        let commits = gateway.audit_commits().await?;
        let ours_spaced = each_spaced(args.samples, EXEC_SPACING, shell_exec_true).await?;
        let after = gateway.audit_commits().await?;
        let (commit, _) = commits.until(after);
        let per_exec = commits.count_until(after) / args.samples.max(1) as f64;
        let ssh_spaced = each_spaced(args.samples, EXEC_SPACING, async || {
            timed(ssh_true(sshd.ssh_muxed()?)).await
        })
        .await?;
        for (i, mut latencies) in [ours_spaced, ssh_spaced].into_iter().enumerate() {
            spaced[i][0].push(latencies.quantile_ms(0.5));
            spaced[i][1].push(latencies.quantile_ms(0.99));
        }
        let mut spawned = each_timed(args.samples, async || {
            timed(Command::new("/bin/true")).await
        })
        .await?;
        let sandboxed = each_timed(args.samples, async || timed(launcher()).await).await?;
        let round_trip = measure::loopback_round_trips(args.samples)?.quantile_ms(0.5);
        let hand_off = measure::thread_hand_offs(args.samples)?.quantile_ms(0.5);
        least_ms.push(spawned.0.quantile_ms(0.5) + per_exec * (commit + hand_off) + round_trip);
        commits_per_exec.push(per_exec);
        commit_ms.push(commit);
        let mut measured = [shell_exec, ssh, spawned, sandboxed];
        for (i, (latencies, cpu)) in measured.iter_mut().enumerate() {
            figures[i][0].push(latencies.quantile_ms(0.5));
            figures[i][1].push(latencies.quantile_ms(0.99));
            figures[i][2].push(*cpu * 1e3 / args.samples.max(1) as f64);
        }
    }
    let [ours, theirs, floor, alone] = figures;
    let what =
        "exec `true` on an open session (portcullis: shell.exec, sandboxed; ssh: ControlMaster)";
    for (i, q) in ["p50", "p99", "CPU per command, whole machine"]
        .iter()
        .enumerate()
    {
        results.rows.push(Row::new(
            "Commands",
            format!("{what}, {q}"),
            "ms",
            ours[i].clone(),
            theirs[i].clone(),
            Better::Lower,
            2,
        ));
    }
    let [ours_spaced, ssh_spaced] = spaced;
    for (i, q) in ["p50", "p99"].iter().enumerate() {
        results.rows.push(Row::new(
            "Commands",
            format!(
                "{what}, one every {} ms (the pool's next world built meanwhile), {q}",
                EXEC_SPACING.as_millis()
            ),
            "ms",
            ours_spaced[i].clone(),
            ssh_spaced[i].clone(),
            Better::Lower,
            2,
        ));
    }
    let limits = [
        ("local spawn floor: fork+exec /bin/true here", floor),
        (
            "sandboxed spawn floor: the launcher run directly, /bin/true in the bench grant's world (bwrap, Landlock, seccomp; no gateway)",
            alone,
        ),
    ];
    let spawn_floor = limits[0].1[0].median();
    for (what, [p50, p99, cpu]) in limits {
        results.rows.push(
            Row::alone(
                "Commands",
                format!("{what}, p50"),
                "ms",
                p50,
                Better::Lower,
                2,
            )
            .noted(format!(
                "p99 {}; CPU per command, whole machine {} ms",
                p99.show(2),
                cpu.show(2)
            )),
        );
    }
    // What an audited exec cannot do without however fast the rest is:
    // its start entry is durable before the program runs and its outcome
    // before the answer (issue 13), each a group commit the request waits
    // for, beside the program's own spawn and the client's round trip.
    let times_floor = least_ms.median() / spawn_floor.max(f64::MIN_POSITIVE);
    results.rows.push(
        Row::alone(
            "Commands",
            "floor under a spaced audited exec: the local spawn floor's p50, the exec's group commits (its start entry durable before the program runs, its outcome before the answer) each with a thread's hand-off and back, and a 64-byte loopback round trip".to_owned(),
            "ms",
            least_ms,
            Better::Lower,
            2,
        )
        .noted(format!(
            "{times_floor:.2}× the local spawn floor; {} group commits per exec in the spaced phase, {} ms mean",
            commits_per_exec.show(2),
            commit_ms.show(3)
        )),
    );
    exec_result(args, gateway, sshd, results).await
}

/// The launcher as the gateway starts it for the bench grant's commands,
/// run directly: `/bin/true` in a world of its own with the grant's root
/// read-write and no network, told what of `/etc` to cover as the daemon
/// tells it.
fn launcher_running_true(gateway: &Gateway) -> Result<impl Fn() -> Command, String> {
    let launcher = crate::gateway::binary()?.with_file_name("portcullis-sandbox");
    let hidden = portcullis_sandbox::hidden_in_etc()
        .map_err(|e| format!("what of /etc a world covers: {e}"))?;
    let mut args: Vec<std::ffi::OsString> = vec![
        "--deny-network".into(),
        "--rw".into(),
        gateway.root.clone().into(),
        "--etc-looked".into(),
    ];
    for path in hidden {
        args.extend(["--hide".into(), path.into()]);
    }
    args.extend(["--".into(), "/bin/true".into()]);
    Ok(move || {
        let mut command = Command::new(&launcher);
        command.args(&args);
        command
    })
}

/// A `shell.exec` whose result carries 16 MiB of output: one frame the
/// gateway sends in parts (a record each 64 KiB), joined and parsed by the
/// client; beside `ssh` streaming the same output over a ControlMaster
/// connection.
async fn exec_result(
    args: &Args,
    gateway: &Gateway,
    sshd: &mut Sshd,
    results: &mut Results,
) -> Result<(), String> {
    const SIZE: u64 = 16 << 20;
    let mut options = gateway.options();
    options.max_frame = crate::gateway::MAX_FRAME;
    let client = gateway
        .session_with(options)
        .await
        .map_err(|e| e.to_string())?;
    let script = printing(SIZE);
    let params = sh_params(&script);
    let samples = args.samples.div_ceil(20);
    let (mut ours, mut theirs) = (Spread::default(), Spread::default());
    // The gateway's CPU per such exec, ms (the command's is not in it).
    let mut gateway_cpu = Spread::default();
    for round in 0..args.rounds {
        eprintln!("a 16 MiB shell.exec result, round {}", round + 1);
        let mut latencies = Latencies::default();
        let cpu_before = measure::cpu_seconds(gateway.pid(), false);
        for _ in 0..samples {
            let started = Instant::now();
            let result = client
                .request("shell.exec", params.clone())
                .await
                .map_err(|e| format!("shell.exec of 16 MiB: {e}"))?;
            latencies.push(started.elapsed());
            let stdout = result["stdout"].as_str().map_or(0, str::len) as u64;
            if stdout != SIZE || result["exit_code"] != 0 {
                return Err(format!(
                    "shell.exec of 16 MiB: {stdout} bytes of stdout, exit code {}",
                    result["exit_code"]
                ));
            }
        }
        ours.push(latencies.quantile_ms(0.5));
        let cpu = measure::cpu_seconds(gateway.pid(), false) - cpu_before;
        gateway_cpu.push(cpu * 1e3 / samples as f64);
        let mut latencies = Latencies::default();
        for _ in 0..samples {
            let mut ssh = sshd.ssh_muxed()?;
            ssh.arg(&script);
            latencies.push(timed(ssh).await?);
        }
        theirs.push(latencies.quantile_ms(0.5));
    }
    results.rows.push(Row::new(
        "Commands",
        "`shell.exec` with a 16 MiB result (one frame in 64 KiB records; ssh: the same output streamed), p50".into(),
        "ms",
        ours,
        theirs,
        Better::Lower,
        1,
    ).noted(format!("gateway CPU {} ms per exec", gateway_cpu.show(1))));
    Ok(())
}

/// A new connection each time: connect, authenticate, exec `true`.
pub async fn connect(
    args: &Args,
    gateway: &Gateway,
    sshd: &Sshd,
    results: &mut Results,
) -> Result<(), String> {
    let n = (args.samples / 4).max(5);
    let exec = json!({"command": ["/bin/true"]});
    let mut figures: [Spread; 6] = Default::default();
    for round in 0..args.rounds {
        eprintln!("connect + exec true, round {}", round + 1);
        let mut library = Latencies::default();
        for _ in 0..n {
            let started = Instant::now();
            let client = gateway.session().await.map_err(|e| e.to_string())?;
            client
                .request("shell.exec", exec.clone())
                .await
                .map_err(|e| format!("shell.exec: {e}"))?;
            library.push(started.elapsed());
        }
        let mut cli = Latencies::default();
        for _ in 0..n {
            let mut command = gateway.cli("exec")?;
            command.args(["--", "/bin/true"]);
            cli.push(timed(command).await?);
        }
        let mut theirs = Latencies::default();
        for _ in 0..n {
            theirs.push(timed(ssh_true(sshd.ssh())).await?);
        }
        for (i, latencies) in [library, cli, theirs].iter_mut().enumerate() {
            figures[i * 2].push(latencies.quantile_ms(0.5));
            figures[i * 2 + 1].push(latencies.quantile_ms(0.99));
        }
    }
    let [lib50, lib99, cli50, cli99, ssh50, ssh99] = figures;
    let section = "Commands";
    let cli_what = "connect + authenticate + exec `true`, new connection (portcullis: the `portcullis exec` CLI; ssh: `ssh host true`)";
    results.rows.push(Row::new(
        section,
        format!("{cli_what}, p50"),
        "ms",
        cli50,
        ssh50.clone(),
        Better::Lower,
        2,
    ));
    results.rows.push(Row::new(
        section,
        format!("{cli_what}, p99"),
        "ms",
        cli99,
        ssh99.clone(),
        Better::Lower,
        2,
    ));
    let lib_what = "the same from an agent runtime's process (portcullis: the client library; ssh: `ssh host true`)";
    results.rows.push(Row::new(
        section,
        format!("{lib_what}, p50"),
        "ms",
        lib50,
        ssh50,
        Better::Lower,
        2,
    ));
    results.rows.push(Row::new(
        section,
        format!("{lib_what}, p99"),
        "ms",
        lib99,
        ssh99,
        Better::Lower,
        2,
    ));
    Ok(())
}

/// Small requests with 1, 16 and 256 in flight, spread over up to 16
/// connections: portcullis `file.stat` (each answered once its audit entry
/// is durable) beside SFTP `STAT` (not audited).
pub async fn requests(
    args: &Args,
    gateway: &Gateway,
    sshd: &Sshd,
    small: Small,
    results: &mut Results,
) -> Result<(), String> {
    std::fs::write(gateway.root.join(STAT_FILE), "hello\n").map_err(|e| e.to_string())?;
    let path = match small {
        Small::Stat => gateway.root.join(STAT_FILE),
        Small::Write => gateway.root.join("written-"),
    };
    let path = path.display().to_string();
    let window = Duration::from_secs_f64(args.request_seconds);
    for level in [1usize, 16, 256] {
        let mut c = Concurrency {
            level,
            ..Default::default()
        };
        // CPU per request, µs: the server's (the gateway; sshd with its
        // reaped session processes and sftp-servers) and the client's (this
        // process, with its reaped ssh clients).
        let (mut server_cpu, mut client_cpu) = <((Spread, Spread), (Spread, Spread))>::default();
        // What each answer waited for: the audit log's group commits.
        let (mut commit_ms, mut per_commit) = <(Spread, Spread)>::default();
        // The least an answer at 1 in flight waits for besides its commit.
        let (mut round_trip_ms, mut hand_off_ms, mut floor_ms) =
            <(Spread, Spread, Spread)>::default();
        // And the least CPU its commit costs (see the rows' text).
        let mut append_cpu_us = Spread::default();
        // The least CPU a stat's own system calls cost (at 256 in flight).
        let mut stat_calls_cpu_us = Spread::default();
        let own = || measure::cpu_seconds(std::process::id(), true);
        let per_request =
            |seconds: f64, latencies: &Latencies| seconds * 1e6 / latencies.len().max(1) as f64;
        for round in 0..args.rounds {
            eprintln!("{small:?}, {level} in flight, round {}", round + 1);
            let (server, client) = (measure::cpu_seconds(gateway.pid(), false), own());
            let commits = gateway.audit_commits().await?;
            let (rate, mut latencies) = portcullis_requests(gateway, small, level, window).await?;
            let (ms, entries) = commits.until(gateway.audit_commits().await?);
            commit_ms.push(ms);
            per_commit.push(entries);
            if level == 1 {
                let samples = args.samples.max(1000);
                let state = gateway.dir.join("state");
                let (mut trips, mut hand_offs, append_cpu) =
                    tokio::task::spawn_blocking(move || {
                        Ok::<_, String>((
                            measure::loopback_round_trips(samples)?,
                            measure::thread_hand_offs(samples)?,
                            measure::durable_append_cpu_us(&state, AUDIT_ENTRY_BYTES, samples)?,
                        ))
                    })
                    .await
                    .map_err(|e| e.to_string())??;
                let (trip, hand_off) = (trips.quantile_ms(0.5), hand_offs.quantile_ms(0.5));
                round_trip_ms.push(trip);
                hand_off_ms.push(hand_off);
                floor_ms.push(trip + hand_off + ms);
                append_cpu_us.push(append_cpu);
            }
            server_cpu.0.push(per_request(
                measure::cpu_seconds(gateway.pid(), false) - server,
                &latencies,
            ));
            client_cpu.0.push(per_request(own() - client, &latencies));
            if level == 256 && matches!(small, Small::Stat) {
                let (root, samples) = (gateway.root.clone(), args.samples.max(20_000));
                let cpu = tokio::task::spawn_blocking(move || {
                    measure::confined_stat_cpu_us(&root, STAT_FILE, samples)
                })
                .await
                .map_err(|e| e.to_string())??;
                stat_calls_cpu_us.push(cpu);
            }
            c.ours_rate.push(rate);
            c.ours_p50.push(latencies.quantile_ms(0.5));
            c.ours_p99.push(latencies.quantile_ms(0.99));
            let (server, client) = (measure::cpu_seconds(sshd.pid(), true), own());
            let (rate, mut latencies) = sftp_requests(sshd, small, &path, level, window).await?;
            // The connections' processes are reaped (and counted) once gone.
            settle().await;
            server_cpu.1.push(per_request(
                measure::cpu_seconds(sshd.pid(), true) - server,
                &latencies,
            ));
            client_cpu.1.push(per_request(own() - client, &latencies));
            c.theirs_rate.push(rate);
            c.theirs_p50.push(latencies.quantile_ms(0.5));
            c.theirs_p99.push(latencies.quantile_ms(0.99));
        }
        let (section, what) = match small {
            Small::Stat => (
                "Small requests",
                "stat a file, {level} in flight: {q} (portcullis: audited file.stat; ssh: SFTP STAT)",
            ),
            Small::Write => (
                "Small writes",
                "write 6 bytes to a file, {level} in flight: {q} (portcullis: file.write, its intent and outcome entries durable; ssh: SFTP OPEN, WRITE, CLOSE, not synced)",
            ),
        };
        let what = |q: &str| {
            what.replace("{level}", &level.to_string())
                .replace("{q}", q)
        };
        let figures = [
            (
                "requests/s",
                "req/s",
                &c.ours_rate,
                &c.theirs_rate,
                Better::Higher,
                0,
            ),
            ("p50", "ms", &c.ours_p50, &c.theirs_p50, Better::Lower, 3),
            ("p99", "ms", &c.ours_p99, &c.theirs_p99, Better::Lower, 3),
            (
                "server CPU per request",
                "µs",
                &server_cpu.0,
                &server_cpu.1,
                Better::Lower,
                1,
            ),
            (
                "client CPU per request",
                "µs",
                &client_cpu.0,
                &client_cpu.1,
                Better::Lower,
                1,
            ),
            (
                "audit group commit (journal write and fdatasync), mean",
                "ms",
                &commit_ms,
                &Spread::default(),
                Better::Lower,
                3,
            ),
            (
                "audit entries per group commit",
                "entries",
                &per_commit,
                &Spread::default(),
                Better::Higher,
                1,
            ),
        ];
        for (q, unit, ours, theirs, better, decimals) in figures {
            let (ours, theirs) = (ours.clone(), theirs.clone());
            results.rows.push(Row::new(
                section,
                what(q),
                unit,
                ours,
                theirs,
                better,
                decimals,
            ));
        }
        if level == 1 {
            let floors = [
                (
                    "physical floor: a 64-byte loopback TCP round trip between two threads, p50",
                    round_trip_ms,
                ),
                (
                    "physical floor: one thread's hand-off to another and back, p50",
                    hand_off_ms,
                ),
                (
                    "physical floor under an audited answer: that round trip, that hand-off (to the audit writer and back) and the mean group commit",
                    floor_ms,
                ),
            ];
            for (q, floor) in floors {
                results
                    .rows
                    .push(Row::alone(section, what(q), "ms", floor, Better::Lower, 3));
            }
            results.rows.push(Row::alone(
                section,
                what(&format!(
                    "CPU floor under an audited answer: a {AUDIT_ENTRY_BYTES}-byte append and its fdatasync in the gateway's state directory, the calling thread's CPU (the server's CPU per request above includes one per group commit)"
                )),
                "µs",
                append_cpu_us,
                Better::Lower,
                1,
            ));
        }
        if level == 256 && matches!(small, Small::Stat) {
            results.rows.push(Row::alone(
                section,
                what(
                    "CPU floor under a stat's answer: its system calls alone, as the gateway makes them (the root opened, the file opened O_PATH beneath it with openat2, statx, both closed), the calling thread's CPU",
                ),
                "µs",
                stat_calls_cpu_us,
                Better::Lower,
                1,
            ));
        }
        // The chart is of small requests (stat) only.
        if matches!(small, Small::Stat) {
            results.concurrency.push(c);
        }
    }
    Ok(())
}

/// The file the stat rows ask about, in the gateway's root.
const STAT_FILE: &str = "small.txt";

/// About one journal frame of an audited `file.stat` (its entry's JSON):
/// the size of the append the CPU floor at 1 in flight measures.
const AUDIT_ENTRY_BYTES: usize = 512;

/// The small request a `requests` section measures.
#[derive(Debug, Clone, Copy)]
pub enum Small {
    /// `file.stat` of one file; SFTP `STAT`.
    Stat,
    /// `file.write` of 6 bytes, each task to its own file; SFTP open,
    /// write, close.
    Write,
}

async fn portcullis_requests(
    gateway: &Gateway,
    small: Small,
    level: usize,
    window: Duration,
) -> Result<(f64, Latencies), String> {
    let mut sessions = Vec::new();
    for _ in 0..level.min(16) {
        sessions.push(Arc::new(
            gateway.session().await.map_err(|e| e.to_string())?,
        ));
    }
    let deadline = Instant::now() + window;
    let mut tasks = JoinSet::new();
    for i in 0..level {
        let (method, params) = match small {
            Small::Stat => ("file.stat", json!({"root_id": "work", "path": STAT_FILE})),
            Small::Write => (
                "file.write",
                json!({"root_id": "work", "path": format!("written-{i}"), "content": "hello\n"}),
            ),
        };
        let client = sessions[i % sessions.len()].clone();
        tasks.spawn(async move {
            let mut latencies = Latencies::default();
            while Instant::now() < deadline {
                let started = Instant::now();
                client
                    .request(method, params.clone())
                    .await
                    .map_err(|e| format!("{method}: {e}"))?;
                latencies.push(started.elapsed());
            }
            Ok::<_, String>(latencies)
        });
    }
    let started = Instant::now();
    let mut all = Latencies::default();
    while let Some(joined) = tasks.join_next().await {
        all.extend(joined.map_err(|e| e.to_string())??);
    }
    Ok((all.len() as f64 / started.elapsed().as_secs_f64(), all))
}

async fn sftp_requests(
    sshd: &Sshd,
    small: Small,
    path: &str,
    level: usize,
    window: Duration,
) -> Result<(f64, Latencies), String> {
    let connections = level.min(16);
    let mut opened = Vec::new();
    for _ in 0..connections {
        opened.push(Sftp::open(sshd.ssh()).await?);
    }
    let deadline = Instant::now() + window;
    let mut tasks = JoinSet::new();
    for (n, mut sftp) in opened.into_iter().enumerate() {
        let path = path.to_string();
        let window = level / connections;
        tasks.spawn(async move {
            match small {
                Small::Stat => sftp.stat_until(&path, window, deadline).await,
                Small::Write => {
                    // Each connection its own files.
                    let prefix = format!("{path}sftp-{n}-");
                    sftp.write_until(&prefix, b"hello\n", window, deadline)
                        .await
                }
            }
        });
    }
    let started = Instant::now();
    let mut all = Latencies::default();
    while let Some(joined) = tasks.join_next().await {
        all.extend(joined.map_err(|e| e.to_string())??);
    }
    Ok((all.len() as f64 / started.elapsed().as_secs_f64(), all))
}

/// A file of `--bulk-mib` down and up: `portcullis get`/`put` beside `scp`
/// and `ssh … cat`, with `cp` and `dd conv=fsync` for what the page cache
/// and the disk allow. MB/s (10^6 bytes per second).
pub async fn bulk(
    args: &Args,
    gateway: &Gateway,
    sshd: &Sshd,
    work: &std::path::Path,
    results: &mut Results,
) -> Result<(), String> {
    let bytes = args.bulk_mib * 1024 * 1024;
    let local = work.join("bulk");
    std::fs::create_dir_all(&local).map_err(|e| e.to_string())?;
    let source = local.join("source.bin");
    let remote = gateway.root.join("source.bin");
    make_file(&source, bytes)?;
    std::fs::copy(&source, &remote).map_err(|e| e.to_string())?;
    let path = |p: &std::path::Path| p.display().to_string();
    let at_host = |p: &std::path::Path| format!("127.0.0.1:{}", p.display());

    let mut transfers: Vec<Transfer> = Vec::new();
    transfers.push((
        "portcullis get",
        local.join("get.bin"),
        Box::new(|| {
            let mut c = gateway.cli("get")?;
            c.arg("work:source.bin").arg(local.join("get.bin"));
            Ok(c)
        }),
    ));
    transfers.push((
        "scp (download)",
        local.join("scp-down.bin"),
        Box::new(|| {
            let mut c = sshd.scp();
            c.arg(at_host(&remote)).arg(local.join("scp-down.bin"));
            Ok(c)
        }),
    ));
    transfers.push((
        "ssh cat (download)",
        local.join("cat-down.bin"),
        Box::new(|| {
            let mut c = sshd.ssh();
            c.arg(format!("cat {}", path(&remote)));
            let out =
                std::fs::File::create(local.join("cat-down.bin")).map_err(|e| e.to_string())?;
            c.stdout(out);
            Ok(c)
        }),
    ));
    transfers.push((
        "portcullis put",
        gateway.root.join("put.bin"),
        Box::new(|| {
            let mut c = gateway.cli("put")?;
            c.arg(&source).arg("work:put.bin");
            Ok(c)
        }),
    ));
    transfers.push((
        "scp (upload)",
        gateway.root.join("scp-up.bin"),
        Box::new(|| {
            let mut c = sshd.scp();
            c.arg(&source)
                .arg(at_host(&gateway.root.join("scp-up.bin")));
            Ok(c)
        }),
    ));
    transfers.push((
        "ssh cat (upload)",
        gateway.root.join("cat-up.bin"),
        Box::new(|| {
            let mut c = sshd.ssh();
            c.arg(format!("cat > {}", path(&gateway.root.join("cat-up.bin"))));
            c.stdin(std::fs::File::open(&source).map_err(|e| e.to_string())?);
            Ok(c)
        }),
    ));
    transfers.push((
        "cp (page cache, no fsync)",
        local.join("cp.bin"),
        Box::new(|| {
            let mut c = Command::new("cp");
            c.arg(&source).arg(local.join("cp.bin"));
            Ok(c)
        }),
    ));
    transfers.push((
        "dd conv=fsync (to disk)",
        local.join("dd.bin"),
        Box::new(|| {
            let mut c = Command::new("dd");
            c.arg(format!("if={}", path(&source)))
                .arg(format!("of={}", path(&local.join("dd.bin"))))
                .args(["bs=4M", "conv=fsync", "status=none"]);
            Ok(c)
        }),
    ));
    transfers.push((
        "dd oflag=direct (to disk, no page cache)",
        local.join("dd-direct.bin"),
        Box::new(|| {
            let mut c = Command::new("dd");
            c.arg(format!("if={}", path(&source)))
                .arg(format!("of={}", path(&local.join("dd-direct.bin"))))
                .args(["bs=1M", "oflag=direct", "conv=fsync", "status=none"]);
            Ok(c)
        }),
    ));
    // Without a file: what the transfer itself allows.
    transfers.push((
        "portcullis cat (download to /dev/null)",
        local.join("none"),
        Box::new(|| {
            let mut c = gateway.cli("cat")?;
            c.arg("work:source.bin");
            Ok(c)
        }),
    ));
    transfers.push((
        "ssh cat (download to /dev/null)",
        local.join("none"),
        Box::new(|| {
            let mut c = sshd.ssh();
            c.arg(format!("cat {}", path(&remote)));
            Ok(c)
        }),
    ));
    let mut rates: Vec<Spread> = vec![Spread::default(); transfers.len()];
    // CPU seconds per GiB of the gateway and of the client (this
    // process's reaped children) for each transfer.
    let mut cpu: Vec<[Spread; 2]> = vec![Default::default(); transfers.len()];
    let mut loopback = Spread::default();
    let mut floor = DownloadFloor::default();
    let gib = bytes as f64 / (1u64 << 30) as f64;
    let this = std::process::id();
    // Round 0 is a warm-up and not counted: it brings the source into the
    // page cache and each tool's files into the kernel's caches.
    for round in 0..=args.rounds {
        eprintln!(
            "bulk {} MiB, round {round}{}",
            args.bulk_mib,
            if round == 0 { " (warm-up)" } else { "" }
        );
        for (i, (_, output, command)) in transfers.iter().enumerate() {
            // Every tool writes a new file: replacing the last round's copy
            // would add the kernel's freeing of 1 GiB of pages (0.3-0.6 s
            // here) to tools that rename over it (portcullis, atomically)
            // and not to those that rewrite it in place (scp).
            let _ = std::fs::remove_file(output);
            timed(Command::new("sync")).await?;
            touch_free_memory(&local.join("warm.bin"), bytes + bytes / 8)?;
            let cpu_before = (
                measure::cpu_seconds(gateway.pid(), false),
                measure::cpu_seconds(this, true) - measure::cpu_seconds(this, false),
            );
            let took = timed(command()?).await?;
            if round > 0 {
                rates[i].push(bytes as f64 / took.as_secs_f64() / 1e6);
                let gateway_cpu = measure::cpu_seconds(gateway.pid(), false) - cpu_before.0;
                let children = measure::cpu_seconds(this, true) - measure::cpu_seconds(this, false);
                cpu[i][0].push(gateway_cpu / gib);
                cpu[i][1].push((children - cpu_before.1) / gib);
            }
        }
        if round > 0 {
            let measured = tokio::task::spawn_blocking(move || measure::loopback_tcp(bytes));
            let copied = measured.await.map_err(|e| e.to_string())??;
            loopback.push(copied.rate / 1e6);
            // The file is written as the transfers' outputs are: after the
            // free memory is touched.
            timed(Command::new("sync")).await?;
            touch_free_memory(&local.join("warm.bin"), bytes + bytes / 8)?;
            let (source, scratch) = (source.clone(), local.join("floor.bin"));
            let measured = tokio::task::spawn_blocking(move || {
                let write = measure::page_cache_write_cpu(&scratch, bytes)?;
                let (read, read_bytes) = measure::page_cache_read_cpu(&source)?;
                if read_bytes != bytes {
                    return Err(format!("read {read_bytes} of the source's {bytes} bytes"));
                }
                Ok::<_, String>((measure::aead_cpu(bytes)?, read, write))
            });
            let (aead, read, write) = measured.await.map_err(|e| e.to_string())??;
            floor.tcp.push(copied.cpu / gib);
            floor.aead.push(aead / gib);
            floor.read.push(read / gib);
            floor.write.push(write / gib);
        }
    }
    for (_, copy, _) in &transfers[..6] {
        let same = Command::new("cmp")
            .arg("-s")
            .arg(&source)
            .arg(copy)
            .status();
        if !same.is_ok_and(|s| s.success()) {
            return Err(format!("{} differs from the source", copy.display()));
        }
    }
    let index = |name: &str| transfers.iter().position(|(n, _, _)| *n == name);
    let rate = |name: &str| -> Spread { index(name).map(|i| rates[i].clone()).unwrap_or_default() };
    let section = "Bulk transfer";
    let size = format!("{} MiB", args.bulk_mib);
    for (what, ours, theirs) in [
        (
            "download to a file: `portcullis get` vs `scp`",
            "portcullis get",
            "scp (download)",
        ),
        (
            "download to a file: `portcullis get` vs `ssh cat`",
            "portcullis get",
            "ssh cat (download)",
        ),
        (
            "download to /dev/null: `portcullis cat` vs `ssh cat`",
            "portcullis cat (download to /dev/null)",
            "ssh cat (download to /dev/null)",
        ),
        (
            "upload (the gateway fsyncs): `portcullis put` vs `scp`",
            "portcullis put",
            "scp (upload)",
        ),
        (
            "upload (the gateway fsyncs): `portcullis put` vs `ssh cat`",
            "portcullis put",
            "ssh cat (upload)",
        ),
    ] {
        results.rows.push(Row::new(
            section,
            format!("{size} {what}"),
            "MB/s",
            rate(ours),
            rate(theirs),
            Better::Higher,
            0,
        ));
    }
    for limit in [
        "cp (page cache, no fsync)",
        "dd conv=fsync (to disk)",
        "dd oflag=direct (to disk, no page cache)",
    ] {
        let what = format!("{size} physical limit: {limit}");
        results.rows.push(Row::alone(
            section,
            what,
            "MB/s",
            rate(limit),
            Better::Higher,
            0,
        ));
    }
    results.rows.push(Row::alone(
        section,
        format!("{size} physical limit: loopback TCP, one connection (a plain socket copy)"),
        "MB/s",
        loopback,
        Better::Higher,
        0,
    ));
    floor.rows(&size, section, results);
    // Where a transfer's time goes on two cores: CPU per GiB of each side.
    for name in [
        "portcullis get",
        "portcullis cat (download to /dev/null)",
        "portcullis put",
    ] {
        let Some(i) = index(name) else { continue };
        let [gateway_cpu, client_cpu] = &cpu[i];
        results.rows.push(
            Row::alone(
                section,
                format!("{size} `{name}`: CPU seconds per GiB, gateway + client"),
                "s",
                sum_of(gateway_cpu, client_cpu),
                Better::Lower,
                2,
            )
            .noted(format!(
                "gateway {}, client {}",
                gateway_cpu.show(2),
                client_cpu.show(2)
            )),
        );
    }
    Ok(())
}

/// The least CPU a download costs on this machine, per GiB, round by
/// round: what moving its bytes takes without any protocol. The
/// transfer's TCP copy (both threads), its AES-256-GCM (sealed on one
/// side, opened on the other), reading the file from the page cache and,
/// for a download to a file, writing a new one. Their sum over the cores
/// there are is the fastest such a download can go here however little
/// else it does.
#[derive(Default)]
struct DownloadFloor {
    tcp: Spread,
    aead: Spread,
    read: Spread,
    write: Spread,
}

impl DownloadFloor {
    fn rows(&self, size: &str, section: &'static str, results: &mut Results) {
        if self.tcp.is_empty() {
            return;
        }
        let to_null = sum_of(&sum_of(&self.tcp, &self.aead), &self.read);
        let to_file = sum_of(&to_null, &self.write);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let most = |cpu: &Spread| {
            let mut rate = Spread::default();
            for seconds_per_gib in cpu.values() {
                rate.push(cores as f64 * (1u64 << 30) as f64 / seconds_per_gib / 1e6);
            }
            rate
        };
        results.rows.push(
            Row::alone(
                section,
                format!(
                    "{size} download's least CPU: a loopback TCP copy, AES-256-GCM sealed and \
                     opened, the file read from the page cache and written to a new one, \
                     seconds per GiB"
                ),
                "s",
                to_file.clone(),
                Better::Lower,
                2,
            )
            .noted(format!(
                "TCP copy {}, AES-256-GCM {}, page-cache read {}, write {}; without the write \
                 (to /dev/null) {}",
                self.tcp.show(2),
                self.aead.show(2),
                self.read.show(2),
                self.write.show(2),
                to_null.show(2)
            )),
        );
        for (what, cpu) in [("to a file", &to_file), ("to /dev/null", &to_null)] {
            results.rows.push(Row::alone(
                section,
                format!(
                    "{size} physical limit: a download {what} at that least CPU on {cores} cores"
                ),
                "MB/s",
                most(cpu),
                Better::Higher,
                0,
            ));
        }
    }
}

/// Round by round, `a + b`.
fn sum_of(a: &Spread, b: &Spread) -> Spread {
    let mut sum = Spread::default();
    for (a, b) in a.values().iter().zip(b.values()) {
        sum.push(a + b);
    }
    sum
}

/// A transfer's name, the file it writes, and how to make its command
/// (afresh each round).
type Transfer<'a> = (
    &'static str,
    std::path::PathBuf,
    Box<dyn Fn() -> Result<Command, String> + 'a>,
);

/// Writes `bytes` of zeros to `path` and deletes it, so that the pages
/// the next transfer's output takes from the free lists are ones this
/// guest touched a moment ago.
///
/// Why: a VM whose balloon device reports free pages to the host (Linux
/// free page reporting: `virtio_balloon` with `REPORTING`, 2 MiB blocks
/// free for about 2 s) gets those pages back from the host on first
/// touch, at a cost per page. On the 2-vCPU VM of bench/RESULTS.md,
/// `dd if=/dev/zero bs=1M count=1024` into the page cache took 1.4-2.2 s
/// when it followed 8 s of quiet and 0.2 s right after the same amount
/// was freed. Which of the two a transfer gets is chance, and it doubled
/// the spread of every tool's figure between rounds. Touching the memory
/// first, for every tool alike, measures the tools as on a host without
/// such a balloon.
fn touch_free_memory(path: &std::path::Path, bytes: u64) -> Result<(), String> {
    use std::io::Write as _;
    let fail = |e: std::io::Error| format!("{}: {e}", path.display());
    let block = vec![0u8; 4 << 20];
    let mut file = std::fs::File::create(path).map_err(fail)?;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        file.write_all(&block[..n]).map_err(fail)?;
        left -= n as u64;
    }
    drop(file);
    std::fs::remove_file(path).map_err(fail)
}

/// `bytes` of random data (incompressible, like the worst case).
fn make_file(path: &std::path::Path, bytes: u64) -> Result<(), String> {
    let status = Command::new("head")
        .arg("-c")
        .arg(bytes.to_string())
        .arg("/dev/urandom")
        .stdout(std::fs::File::create(path).map_err(|e| e.to_string())?)
        .status()
        .map_err(|e| format!("head: {e}"))?;
    match status.success() {
        true => Ok(()),
        false => Err(format!("head -c {bytes} /dev/urandom: {status}")),
    }
}

/// Requests on each connection before the dial-out row's timed ones.
const DIAL_WARM_UP: usize = 50;

/// Dial-out beside dial-in (issue 37): one gateway listens and dials a
/// runtime listener in this process; a small request's round trip (an
/// audited `file.stat`, one in flight) over the connection it dialed,
/// beside the same over a connection the runtime dialed, one request on
/// each in turn. The compared column is dial-in, not OpenSSH.
pub async fn dial(
    args: &Args,
    work: &std::path::Path,
    results: &mut Results,
) -> Result<(), String> {
    use portcullis_client::ClientOptions;
    use portcullis_client::listen::ProviderListener;
    let token = "bench-relay-token";
    let dir = work.join("dial");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    std::fs::write(dir.join("relay.token"), token).map_err(|e| format!("the token: {e}"))?;
    let listener = ProviderListener::bind("127.0.0.1:0", zeroize::Zeroizing::new(token.into()))
        .await
        .map_err(|e| format!("the runtime listener: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let relay = format!(
        "\n[[relay]]\nurl = \"ws://127.0.0.1:{port}/api/v1/relay/connect\"\ntoken_file = \"{}\"\n",
        dir.join("relay.token").display()
    );
    let gateway = Gateway::start_with(&dir, &relay)?;
    let options = ClientOptions::new("ws://unused", gateway.key, gateway.identity.clone());
    let dialed = listener
        .accept(options)
        .await
        .map_err(|e| format!("the gateway's dial: {e}"))?;
    dialed.accept_all().await.map_err(|e| e.to_string())?;
    let direct = gateway.session().await.map_err(|e| e.to_string())?;
    std::fs::write(gateway.root.join("small.txt"), "x").map_err(|e| e.to_string())?;
    let stat = json!({"root_id": "work", "path": "small.txt"});
    let clients = [&dialed, &direct];
    // Untimed: each connection's first requests (its buffers, the
    // session's first turns) would otherwise land on whichever is first.
    for client in clients {
        for _ in 0..DIAL_WARM_UP {
            client
                .request("file.stat", stat.clone())
                .await
                .map_err(|e| format!("file.stat: {e}"))?;
        }
    }
    let mut figures: [Spread; 4] = Default::default();
    for round in 0..args.rounds {
        eprintln!("dial-out beside dial-in, round {}", round + 1);
        // One request on each in turn: the two differ by a few percent,
        // less than the machine drifts over a block of samples.
        let mut latencies: [Latencies; 2] = Default::default();
        for _ in 0..args.samples {
            for (client, latencies) in clients.iter().zip(&mut latencies) {
                let started = Instant::now();
                client
                    .request("file.stat", stat.clone())
                    .await
                    .map_err(|e| format!("file.stat: {e}"))?;
                latencies.push(started.elapsed());
            }
        }
        for (i, mut latencies) in latencies.into_iter().enumerate() {
            figures[i].push(latencies.quantile_ms(0.5));
            figures[i + 2].push(latencies.quantile_ms(0.99));
        }
    }
    let [out50, in50, out99, in99] = figures;
    let note = "compared column: the same gateway, dialed in (not OpenSSH)";
    for (q, out, inward) in [("p50", out50, in50), ("p99", out99, in99)] {
        results.rows.push(
            Row::new(
                "Dial-out",
                format!(
                    "file.stat round trip over the connection the gateway dialed, 1 in flight, {q}"
                ),
                "ms",
                out,
                inward,
                Better::Lower,
                3,
            )
            .noted(note.into()),
        );
    }
    Ok(())
}

/// The Python client (issue 38) beside the Rust client on one gateway:
/// exec `true` latency (the Python package's `shell.exec`, through asyncio
/// and PyO3, against `Client::request`), and download/upload throughput
/// of `bulk_mib` (both stream through the same Rust transfer code; the
/// Python one is awaited from asyncio). The Python side is
/// `python/bench.py`, run with `--python` each round; the compared column
/// is the Rust client, not OpenSSH.
pub async fn python(
    args: &Args,
    gateway: &Gateway,
    work: &std::path::Path,
    results: &mut Results,
) -> Result<(), String> {
    let bytes = args.bulk_mib * 1024 * 1024;
    let local = work.join("python");
    std::fs::create_dir_all(&local).map_err(|e| e.to_string())?;
    make_file(&gateway.root.join("py-source.bin"), bytes)?;
    let client = gateway.session().await.map_err(|e| e.to_string())?;
    let exec = json!({"command": ["/bin/true"]});
    // Rust p50, Python p50, Rust p99, Python p99, then MB/s down and up.
    let mut figures: [Spread; 8] = Default::default();
    for round in 0..args.rounds {
        eprintln!("Python client beside the Rust client, round {}", round + 1);
        // As python/bench.py does (its `--warm-up`): a few execs first,
        // not counted, so both sides measure a warm session.
        for _ in 0..PYTHON_WARM_UP {
            client
                .request("shell.exec", exec.clone())
                .await
                .map_err(|e| format!("shell.exec: {e}"))?;
        }
        let mut latencies = Latencies::default();
        for _ in 0..args.samples {
            let started = Instant::now();
            client
                .request("shell.exec", exec.clone())
                .await
                .map_err(|e| format!("shell.exec: {e}"))?;
            latencies.push(started.elapsed());
        }
        figures[0].push(latencies.quantile_ms(0.5));
        figures[2].push(latencies.quantile_ms(0.99));
        let theirs = python_figures(args, gateway, &local, "exec")?;
        figures[1].push(figure(&theirs, "exec_p50_ms")?);
        figures[3].push(figure(&theirs, "exec_p99_ms")?);

        // Each transfer starts alike: old copies gone, dirty pages
        // written, free memory touched (see `touch_free_memory`).
        let prepare = |paths: &[&std::path::Path]| -> Result<(), String> {
            for path in paths {
                let _ = std::fs::remove_file(path);
            }
            let _ = std::process::Command::new("sync").status();
            touch_free_memory(&local.join("warm.bin"), bytes + bytes / 8)
        };
        let (rust_down, python_down) = (local.join("rust-down.bin"), local.join("python-down.bin"));
        let (rust_up, python_up) = (
            gateway.root.join("rust-up.bin"),
            gateway.root.join("python-up.bin"),
        );
        prepare(&[&rust_down])?;
        let file = std::fs::File::create(&rust_down).map_err(|e| e.to_string())?;
        let started = Instant::now();
        client
            .download("work", "py-source.bin", file, true, &mut |_| {})
            .await
            .map_err(|e| format!("download: {e}"))?;
        figures[4].push(bytes as f64 / started.elapsed().as_secs_f64() / 1e6);
        prepare(&[&python_down])?;
        let theirs = python_figures(args, gateway, &local, "download")?;
        figures[5].push(figure(&theirs, "download_mb_s")?);

        prepare(&[&rust_up])?;
        let input = std::fs::File::open(&rust_down).map_err(|e| e.to_string())?;
        let options = portcullis_client::UploadOptions {
            size: Some(bytes),
            append: false,
            sha256: true,
        };
        let started = Instant::now();
        client
            .upload("work", "rust-up.bin", input, options, &mut |_| {})
            .await
            .map_err(|e| format!("upload: {e}"))?;
        figures[6].push(bytes as f64 / started.elapsed().as_secs_f64() / 1e6);
        prepare(&[&python_up])?;
        let theirs = python_figures(args, gateway, &local, "upload")?;
        figures[7].push(figure(&theirs, "upload_mb_s")?);
        for path in [&rust_down, &python_down, &rust_up, &python_up] {
            let _ = std::fs::remove_file(path);
        }
    }
    let [
        rust50,
        py50,
        rust99,
        py99,
        rust_down,
        py_down,
        rust_up,
        py_up,
    ] = figures;
    let note = "compared column: the Rust client on the same gateway (not OpenSSH)";
    let size = format!("{} MiB", args.bulk_mib);
    for (what, unit, python, rust, better, decimals) in [
        (
            "exec `true` (shell.exec), p50",
            "ms",
            py50,
            rust50,
            Better::Lower,
            2,
        ),
        (
            "exec `true` (shell.exec), p99",
            "ms",
            py99,
            rust99,
            Better::Lower,
            2,
        ),
        (
            &*format!("{size} download to a file"),
            "MB/s",
            py_down,
            rust_down,
            Better::Higher,
            0,
        ),
        (
            &*format!("{size} upload from a file"),
            "MB/s",
            py_up,
            rust_up,
            Better::Higher,
            0,
        ),
    ] {
        results.rows.push(
            Row::new(
                "Python client",
                format!("{what}: the Python package vs the Rust client"),
                unit,
                python,
                rust,
                better,
                decimals,
            )
            .noted(note.into()),
        );
    }
    Ok(())
}

/// Whether `--python` has the package: the `python` part needs it.
pub fn python_ready(args: &Args) -> Result<(), String> {
    let imports = Command::new(&args.python)
        .args(["-c", "import portcullis"])
        .output();
    match imports {
        Ok(out) if out.status.success() => Ok(()),
        _ => Err(format!(
            "{} cannot import the portcullis package, which the `python` part needs: \
             run `bash python/test.sh` (it installs it in target/python-venv), pass \
             --python PATH, or leave the part out with --only",
            args.python.display()
        )),
    }
}

fn figure(figures: &serde_json::Value, key: &str) -> Result<f64, String> {
    figures[key]
        .as_f64()
        .ok_or_else(|| format!("python/bench.py gave no {key}: {figures}"))
}

/// Execs each side of the Python comparison runs first, not counted
/// (passed to python/bench.py as `--warm-up`).
const PYTHON_WARM_UP: usize = 3;

/// One run of `python/bench.py --what WHAT` against `gateway`: its JSON
/// figures.
fn python_figures(
    args: &Args,
    gateway: &Gateway,
    local: &std::path::Path,
    what: &str,
) -> Result<serde_json::Value, String> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/bench.py");
    let out = Command::new(&args.python)
        .arg(&script)
        .args(["--url", &gateway.url])
        .args(["--gateway-key", &gateway.key.to_base64()])
        .arg("--identity")
        .arg(&gateway.identity_file)
        .args(["--samples", &args.samples.to_string()])
        .args(["--warm-up", &PYTHON_WARM_UP.to_string()])
        .args(["--remote", "work:py-source.bin", "--what", what])
        .arg("--local-dir")
        .arg(local)
        .output()
        .map_err(|e| format!("{}: {e}", args.python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} python/bench.py failed ({}): {}\n(the Python part needs the package installed: \
             bash python/test.sh makes target/python-venv; or pass --python)",
            args.python.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("python/bench.py printed: {e}"))
}

/// ya-environment-protocol.v1 (issue 39) beside relay.v1 dialed in: one
/// round trip at a time of `shell.exec` `/bin/true` and of an audited
/// `file.stat`, over stdio (`portcullis stdio`, the runtime's child, with a
/// store of its own) and over the environment socket of a daemon, beside
/// the same requests from the Rust client over the daemon's WebSocket.
/// The compared column is dial-in, not OpenSSH.
pub async fn envproto(
    args: &Args,
    work: &std::path::Path,
    results: &mut Results,
) -> Result<(), String> {
    use crate::jsonrpc::JsonRpc;
    let dir = work.join("envproto");
    let gateway = Gateway::start_with(&dir, "environment_socket = \"env.sock\"\n")?;
    let stdio_config = dir.join("stdio.toml");
    std::fs::write(
        &stdio_config,
        "key_file = \"gateway.key\"\npolicy = \"policy.toml\"\nstate_dir = \"stdio-state\"\n\
         admin_socket = \"stdio-admin.sock\"\n",
    )
    .map_err(|e| format!("the stdio config: {e}"))?;
    let mut stdio = JsonRpc::stdio(&crate::gateway::binary()?, &stdio_config, "bench").await?;
    let mut unix = JsonRpc::unix(&dir.join("env.sock")).await?;
    let direct = gateway.session().await.map_err(|e| e.to_string())?;
    std::fs::write(gateway.root.join("small.txt"), "x").map_err(|e| e.to_string())?;
    let exec_relay = json!({"command": ["/bin/true"], "root_id": "work"});
    let exec_rpc = json!({"command": ["/bin/true"], "cwd": "/work"});
    let stat_relay = json!({"root_id": "work", "path": "small.txt"});
    let stat_rpc = json!({"mount_id": "work", "path": "small.txt"});
    // [stdio, unix, dial-in] × [exec, stat], p50 each round.
    let mut figures: [[Spread; 2]; 3] = Default::default();
    for round in 0..args.rounds {
        eprintln!(
            "ya-environment-protocol.v1 beside relay.v1, round {}",
            round + 1
        );
        for (m, (method, relay, rpc)) in [
            ("shell.exec", &exec_relay, &exec_rpc),
            ("file.stat", &stat_relay, &stat_rpc),
        ]
        .into_iter()
        .enumerate()
        {
            for (t, client) in [&mut stdio, &mut unix].into_iter().enumerate() {
                let mut latencies = Latencies::default();
                for _ in 0..args.samples {
                    let started = Instant::now();
                    client.call(method, rpc).await?;
                    latencies.push(started.elapsed());
                }
                figures[t][m].push(latencies.quantile_ms(0.5));
            }
            let mut latencies = Latencies::default();
            for _ in 0..args.samples {
                let started = Instant::now();
                direct
                    .request(method, relay.clone())
                    .await
                    .map_err(|e| format!("{method}: {e}"))?;
                latencies.push(started.elapsed());
            }
            figures[2][m].push(latencies.quantile_ms(0.5));
        }
    }
    stdio.close().await;
    let [stdio_figures, unix_figures, direct_figures] = figures;
    let [direct_exec, direct_stat] = direct_figures;
    let note = "compared column: relay.v1 over the daemon's WebSocket, dialed in (not OpenSSH)";
    for (transport, [exec, stat]) in [("stdio", stdio_figures), ("a Unix socket", unix_figures)] {
        for (what, ours, theirs) in [
            ("shell.exec `/bin/true`", exec, direct_exec.clone()),
            ("file.stat", stat, direct_stat.clone()),
        ] {
            results.rows.push(
                Row::new(
                    "ya-environment-protocol.v1",
                    format!("{what} over {transport}, JSON-RPC, 1 in flight, p50"),
                    "ms",
                    ours,
                    theirs,
                    Better::Lower,
                    3,
                )
                .noted(note.into()),
            );
        }
    }
    Ok(())
}

/// A tool call through `portcullis mcp` (an MCP client's stdio server in
/// front of the gateway) beside the same request on an open relay.v1
/// session: `stat` and `run_command` `/bin/true`, one at a time.
pub async fn mcp(
    args: &Args,
    gateway: &Gateway,
    work: &std::path::Path,
    results: &mut Results,
) -> Result<(), String> {
    let home = work.join("mcp-home");
    std::fs::create_dir_all(&home).map_err(|e| format!("{}: {e}", home.display()))?;
    let mut mcp = crate::mcp::Mcp::start(
        &crate::gateway::binary()?,
        &gateway.url,
        &gateway.key.to_base64(),
        &gateway.identity_file,
        &home,
    )
    .await?;
    let direct = gateway.session().await.map_err(|e| e.to_string())?;
    std::fs::write(gateway.root.join("small.txt"), "x").map_err(|e| e.to_string())?;
    let calls = [
        (
            "stat",
            json!({"path": "/work/small.txt"}),
            "file.stat",
            json!({"root_id": "work", "path": "small.txt"}),
        ),
        (
            "run_command",
            json!({"command": ["/bin/true"], "cwd": "/work"}),
            "shell.exec",
            json!({"command": ["/bin/true"], "root_id": "work"}),
        ),
    ];
    // [mcp, dial-in] per call, p50 each round.
    let mut figures: [[Spread; 2]; 2] = Default::default();
    for round in 0..args.rounds {
        eprintln!("portcullis mcp beside relay.v1, round {}", round + 1);
        for (c, (tool, arguments, method, params)) in calls.iter().enumerate() {
            let mut latencies = Latencies::default();
            for _ in 0..args.samples {
                let started = Instant::now();
                mcp.tool(tool, arguments).await?;
                latencies.push(started.elapsed());
            }
            figures[c][0].push(latencies.quantile_ms(0.5));
            let mut latencies = Latencies::default();
            for _ in 0..args.samples {
                let started = Instant::now();
                direct
                    .request(method, params.clone())
                    .await
                    .map_err(|e| format!("{method}: {e}"))?;
                latencies.push(started.elapsed());
            }
            figures[c][1].push(latencies.quantile_ms(0.5));
        }
    }
    mcp.close().await;
    for ((tool, _, method, _), [ours, theirs]) in calls.iter().zip(figures) {
        let what = match *tool {
            "stat" => "`stat`",
            _ => "`run_command` `/bin/true`",
        };
        results.rows.push(Row::new(
            "MCP",
            format!(
                "an MCP tool call, {what} (relay {method}), over `portcullis mcp` on stdio, 1 in flight, p50"
            ),
            "ms",
            ours,
            theirs,
            Better::Lower,
            3,
        ).noted("compared column: the same relay request on an open relay.v1 session, dialed in (not OpenSSH)".into()));
    }
    Ok(())
}

/// A command printing `--bulk-mib` MiB (`yes … | head -c`, through
/// `shell.start`) on a session that takes output as binary chunks (the
/// client library's choice) and on one that takes the relay spec's
/// `stream` frames: MB/s of output received, and how much of it arrived
/// (the command never waits for a reader: one slower than it loses what
/// falls out of the gateway's 1 MiB ring). Beside them, the command alone
/// here, into `/dev/null`.
pub async fn output(args: &Args, gateway: &Gateway, results: &mut Results) -> Result<(), String> {
    use portcullis_client::{Client, StreamItem};
    let size = args.bulk_mib * 1024 * 1024;
    let script = printing(size);
    let chunks = gateway.session().await.map_err(|e| e.to_string())?;
    let frames = Client::connect(gateway.options())
        .await
        .map_err(|e| e.to_string())?;
    let offered = frames.offered();
    let names: Vec<&str> = offered.iter().map(String::as_str).collect();
    frames
        .accept_output(&names, "frames")
        .await
        .map_err(|e| e.to_string())?;
    let params = sh_params(&script);
    // [chunks, frames, the command alone] MB/s; [chunks, frames] % received.
    let (mut rate, mut received): ([Spread; 3], [Spread; 2]) = Default::default();
    let mb_per_s = |bytes: u64, took: Duration| bytes as f64 / took.as_secs_f64() / 1e6;
    for round in 0..args.rounds {
        eprintln!("output of {} MiB, round {}", args.bulk_mib, round + 1);
        for (i, client) in [&chunks, &frames].into_iter().enumerate() {
            let started = Instant::now();
            let mut handle = client
                .start("shell.start", params.clone())
                .await
                .map_err(|e| format!("shell.start: {e}"))?;
            let mut bytes = 0u64;
            while let Some(item) = handle.next().await {
                bytes += match item {
                    StreamItem::Chunk { data, .. } => data.len() as u64,
                    StreamItem::Stream { event, data } if event == "stdout" => {
                        data.as_str().map_or(0, str::len) as u64
                    }
                    StreamItem::Stream { .. } => 0,
                };
            }
            let result = handle
                .response()
                .await
                .map_err(|e| format!("shell.start: {e}"))?;
            let took = started.elapsed();
            if result["stdout_bytes"].as_u64() != Some(size) {
                return Err(format!(
                    "the command printed {} bytes",
                    result["stdout_bytes"]
                ));
            }
            rate[i].push(mb_per_s(bytes, took));
            received[i].push(bytes as f64 * 100.0 / size as f64);
        }
        let started = Instant::now();
        let status = Command::new("/bin/sh")
            .args(["-c", &format!("{script} > /dev/null")])
            .status()
            .map_err(|e| format!("sh: {e}"))?;
        if !status.success() {
            return Err(format!("the command alone: {status}"));
        }
        rate[2].push(mb_per_s(size, started.elapsed()));
    }
    let note =
        "compared column: the same command on a session that takes `stream` frames (not OpenSSH)";
    let [chunks_rate, frames_rate, alone] = rate;
    let [chunks_received, frames_received] = received;
    for (what, unit, ours, theirs, decimals) in [
        ("output received", "MB/s", chunks_rate, frames_rate, 0),
        (
            "of the output received",
            "%",
            chunks_received,
            frames_received,
            1,
        ),
    ] {
        results.rows.push(Row::new(
            "Command output",
            format!(
                "a command printing {} MiB (shell.start): {what}, binary chunks (frames beside)",
                args.bulk_mib
            ),
            unit,
            ours,
            theirs,
            Better::Higher,
            decimals,
        ).noted(note.into()));
    }
    results.rows.push(Row::alone(
        "Command output",
        format!(
            "physical limit: the same command here, into /dev/null ({} MiB)",
            args.bulk_mib
        ),
        "MB/s",
        alone,
        Better::Higher,
        0,
    ));
    Ok(())
}

/// Disk per audit entry: every entry this run's gateway logged, over the
/// size of its state directory (sled's trees and the journal, in blocks
/// allocated) once it has stopped and written everything out. Reported
/// only past 100,000 entries: below, a store's fixed size (sled's first
/// segments) is most of it.
pub async fn audit_size(gateway: Gateway, results: &mut Results) -> Result<(), String> {
    let entries = gateway.audit_commits().await?.entries;
    let state = gateway.stop()?;
    if entries < 100_000.0 {
        return Ok(());
    }
    let bytes =
        measure::disk_usage(&state).map_err(|e| format!("the size of {}: {e}", state.display()))?;
    let mut ours = Spread::default();
    ours.push(bytes as f64 / entries);
    results.rows.push(Row::alone(
        "Audit log",
        format!(
            "disk per audit entry: the gateway's state directory once stopped, over the {entries:.0} entries of this run"
        ),
        "B",
        ours,
        Better::Lower,
        0,
    ));
    Ok(())
}
