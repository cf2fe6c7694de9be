//! Samples, their percentiles and spread over rounds, and what `/proc`
//! says about a process (CPU time, RSS, PSS).

use std::time::Duration;

/// Latencies of one round.
#[derive(Default)]
pub struct Latencies(Vec<Duration>);

impl Latencies {
    pub fn push(&mut self, sample: Duration) {
        self.0.push(sample);
    }

    pub fn extend(&mut self, other: Latencies) {
        self.0.extend(other.0);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The `q` quantile in milliseconds (nearest rank); 0 when empty.
    pub fn quantile_ms(&mut self, q: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.sort_unstable();
        let rank = ((self.0.len() as f64 * q) as usize).min(self.0.len() - 1);
        self.0[rank].as_secs_f64() * 1e3
    }
}

/// One figure measured once per round: reported as the median and the
/// range of the rounds.
#[derive(Clone, Default)]
pub struct Spread(Vec<f64>);

impl Spread {
    pub fn push(&mut self, value: f64) {
        self.0.push(value);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each round's value, in order.
    pub fn values(&self) -> &[f64] {
        &self.0
    }

    pub fn median(&self) -> f64 {
        let mut sorted = self.0.clone();
        sorted.sort_by(f64::total_cmp);
        match sorted.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => sorted[n / 2],
            n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
        }
    }

    /// `median [min–max]`, or the single value, with `decimals`.
    pub fn show(&self, decimals: usize) -> String {
        if self.0.is_empty() {
            return "–".into();
        }
        let min = self.0.iter().copied().fold(f64::INFINITY, f64::min);
        let max = self.0.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        match self.0.len() {
            1 => format!("{:.*}", decimals, self.0[0]),
            _ => format!(
                "{:.*} [{:.*}–{:.*}]",
                decimals,
                self.median(),
                decimals,
                min,
                decimals,
                max
            ),
        }
    }
}

/// The fields of `/proc/PID/stat` after `pid (comm)`, numbered as in
/// proc(5) from 3 (`state`) on: comm may hold spaces and parentheses.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = stat.get(stat.rfind(')')? + 2..)?;
    Some(after_comm.split_whitespace().map(String::from).collect())
}

/// Field `n` (proc(5) numbering) of a `stat_fields` answer.
fn field(fields: &[String], n: usize) -> Option<&str> {
    fields.get(n - 3).map(String::as_str)
}

/// Every process's PID.
fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
}

/// CPU time a process has used: its own (user + system), and that of the
/// children it has waited for.
pub fn cpu_seconds(pid: u32, with_children: bool) -> f64 {
    let Some(fields) = stat_fields(pid) else {
        return 0.0;
    };
    // utime, stime, cutime, cstime are fields 14 to 17.
    let ticks = |n| {
        field(&fields, n)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let own = ticks(14) + ticks(15);
    let children = if with_children {
        ticks(16) + ticks(17)
    } else {
        0.0
    };
    (own + children) / rustix::param::clock_ticks_per_second() as f64
}

/// A `/proc/PID/status` or `smaps_rollup` field in KiB.
fn kib(file: &str, pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

pub fn rss_kib(pid: u32) -> u64 {
    kib("status", pid, "VmRSS:")
}

pub fn pss_kib(pid: u32) -> u64 {
    kib("smaps_rollup", pid, "Pss:")
}

/// `pid` and all its descendants.
pub fn process_tree(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = pids()
        .filter_map(|child| {
            let ppid = field(&stat_fields(child)?, 4)?.parse().ok()?;
            Some((child, ppid))
        })
        .collect();
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        let children = parents.iter().filter(|(_, p)| *p == parent);
        tree.extend(children.map(|(c, _)| *c));
        i += 1;
    }
    tree
}

/// Processes whose command line contains every one of `needles`.
pub fn processes_with(needles: &[&str]) -> Vec<u32> {
    pids()
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            needles.iter().all(|n| cmdline.contains(n))
        })
        .collect()
}

/// A copy's rate and what it cost the threads that made it.
pub struct Copied {
    /// Bytes per second.
    pub rate: f64,
    /// CPU seconds, user and system, of every thread of the copy.
    pub cpu: f64,
}

/// The CPU seconds this thread has used, user and system.
fn thread_cpu_seconds() -> f64 {
    use rustix::time::{ClockId, clock_gettime};
    let t = clock_gettime(ClockId::ThreadCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// One loopback TCP connection: `bytes` written in 256 KiB writes by one
/// thread, read by another.
pub fn loopback_tcp(bytes: u64) -> Result<Copied, String> {
    use std::io::{Read as _, Write as _};
    let fail = |e: std::io::Error| format!("loopback TCP: {e}");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(fail)?;
    let addr = listener.local_addr().map_err(fail)?;
    let writer = std::thread::spawn(move || -> std::io::Result<f64> {
        let mut socket = std::net::TcpStream::connect(addr)?;
        let block = vec![7u8; 256 << 10];
        let cpu = thread_cpu_seconds();
        let mut left = bytes;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            socket.write_all(&block[..n])?;
            left -= n as u64;
        }
        Ok(thread_cpu_seconds() - cpu)
    });
    let (mut socket, _) = listener.accept().map_err(fail)?;
    let started = std::time::Instant::now();
    let cpu = thread_cpu_seconds();
    let mut block = vec![0u8; 256 << 10];
    let mut read = 0u64;
    loop {
        match socket.read(&mut block).map_err(fail)? {
            0 => break,
            n => read += n as u64,
        }
    }
    let (took, reader_cpu) = (started.elapsed(), thread_cpu_seconds() - cpu);
    let writer_cpu = writer
        .join()
        .map_err(|_| "loopback TCP: the writer panicked".to_string())?
        .map_err(fail)?;
    match read == bytes {
        true => Ok(Copied {
            rate: bytes as f64 / took.as_secs_f64(),
            cpu: reader_cpu + writer_cpu,
        }),
        false => Err(format!("loopback TCP: {read} of {bytes} bytes arrived")),
    }
}

/// The CPU seconds one thread spends sealing `bytes` with AES-256-GCM in
/// full-size Noise records (the transport both ends of a session use) and
/// opening them again: what a transfer's encryption costs its two ends
/// together.
pub fn aead_cpu(bytes: u64) -> Result<f64, String> {
    use portcullis_crypto::{Handshake, MAX_PLAINTEXT_LEN, PROLOGUE, StaticKeypair};
    let fail = |e: portcullis_crypto::Error| format!("AES-256-GCM: {e}");
    let (client_key, gateway_key) = (
        StaticKeypair::generate().map_err(fail)?,
        StaticKeypair::generate().map_err(fail)?,
    );
    let mut client = Handshake::initiator(&client_key, PROLOGUE);
    let mut gateway = Handshake::responder(&gateway_key, PROLOGUE);
    let m1 = client.write_message(b"").map_err(fail)?;
    gateway.read_message(&m1).map_err(fail)?;
    let m2 = gateway.write_message(b"").map_err(fail)?;
    client.read_message(&m2).map_err(fail)?;
    let m3 = client.write_message(b"").map_err(fail)?;
    gateway.read_message(&m3).map_err(fail)?;
    let (mut sender, _) = gateway.into_transport().map_err(fail)?.split();
    let (_, mut receiver) = client.into_transport().map_err(fail)?.split();
    let mut record = vec![7u8; MAX_PLAINTEXT_LEN];
    let cpu = thread_cpu_seconds();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(MAX_PLAINTEXT_LEN as u64) as usize;
        // Opening takes the tag off again: the record is the same length
        // for the next round, and nothing is written into it but the AEAD.
        record.truncate(n);
        sender.seal_in_place(&mut record).map_err(fail)?;
        receiver.open_in_place(&mut record).map_err(fail)?;
        left -= n as u64;
    }
    Ok(thread_cpu_seconds() - cpu)
}

/// Reads `file` (in the page cache) to its end in 256 KiB reads: the
/// reading thread's CPU seconds and how many bytes it read.
pub fn page_cache_read_cpu(file: &std::path::Path) -> Result<(f64, u64), String> {
    use std::io::Read as _;
    let fail = |e: std::io::Error| format!("reading {}: {e}", file.display());
    let mut source = std::fs::File::open(file).map_err(fail)?;
    let mut block = vec![0u8; 256 << 10];
    let cpu = thread_cpu_seconds();
    let mut read = 0u64;
    loop {
        match source.read(&mut block).map_err(fail)? {
            0 => break,
            n => read += n as u64,
        }
    }
    Ok((thread_cpu_seconds() - cpu, read))
}

/// Writes `bytes` to the new file `file` in 256 KiB writes, not synced,
/// and removes it: the writing thread's CPU seconds (the kernel's later
/// writeback is not this thread's, as it is not a client's).
pub fn page_cache_write_cpu(file: &std::path::Path, bytes: u64) -> Result<f64, String> {
    use std::io::Write as _;
    let fail = |e: std::io::Error| format!("writing {}: {e}", file.display());
    let mut output = std::fs::File::create_new(file).map_err(fail)?;
    let block = vec![7u8; 256 << 10];
    let cpu = thread_cpu_seconds();
    let written = (|| {
        let mut left = bytes;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            output.write_all(&block[..n])?;
            left -= n as u64;
        }
        Ok::<_, std::io::Error>(())
    })();
    let used = thread_cpu_seconds() - cpu;
    drop(output);
    let removed = std::fs::remove_file(file);
    written.and(removed).map_err(fail)?;
    Ok(used)
}

/// The machine's busy CPU time so far, in seconds: every CPU's time in
/// all states but idle and iowait (`/proc/stat`), so that work done by
/// processes nobody waits for and by kernel threads (a namespace's
/// teardown) counts too.
pub fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return 0.0;
    };
    let ticks: Vec<f64> = cpu
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal guest …: steal is
    // the host's work, guest is counted in user already.
    let busy: f64 = [0, 1, 2, 5, 6].iter().filter_map(|&i| ticks.get(i)).sum();
    busy / rustix::param::clock_ticks_per_second() as f64
}

/// Round trips of a 64-byte message over one loopback TCP connection
/// (`TCP_NODELAY`), between two threads of this process: the least any
/// request and its answer cost here before either side does any work.
pub fn loopback_round_trips(samples: usize) -> Result<Latencies, String> {
    let fail = |e: std::io::Error| format!("loopback round trip: {e}");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(fail)?;
    let mut socket =
        std::net::TcpStream::connect(listener.local_addr().map_err(fail)?).map_err(fail)?;
    let (echoing, _) = listener.accept().map_err(fail)?;
    for side in [&socket, &echoing] {
        side.set_nodelay(true).map_err(fail)?;
    }
    let echo = echo_thread(echoing.try_clone().map_err(fail)?, echoing);
    let latencies = round_trips(
        &mut socket.try_clone().map_err(fail)?,
        &mut socket,
        64,
        samples,
    );
    drop(socket);
    joined(echo, "loopback round trip")?;
    latencies.map_err(fail)
}

/// One thread waking another that sleeps in the kernel, and being woken
/// by it in turn (a byte each way over two pipes, so that neither side
/// spins in user space the way a channel's receiver does briefly): what a
/// request pays to reach the audit writer, asleep between group commits,
/// and to be woken again once its entry is durable.
pub fn thread_hand_offs(samples: usize) -> Result<Latencies, String> {
    let fail = |e: std::io::Error| format!("thread hand-off: {e}");
    let (from_here, mut to_other) = std::io::pipe().map_err(fail)?;
    let (mut from_other, to_here) = std::io::pipe().map_err(fail)?;
    let other = echo_thread(from_here, to_here);
    let latencies = round_trips(&mut to_other, &mut from_other, 1, samples);
    drop(to_other);
    joined(other, "thread hand-off")?;
    latencies.map_err(fail)
}

/// The CPU one durable append costs the thread that makes it: a
/// `bytes`-long write to the end of a new file in `dir` and its
/// `fdatasync`, `samples` times (after a hundred not counted), in µs per
/// append. What the audit writer spends on each group commit before any
/// work of its own; at one request in flight every entry is a group.
pub fn durable_append_cpu_us(
    dir: &std::path::Path,
    bytes: usize,
    samples: usize,
) -> Result<f64, String> {
    use std::io::Write as _;
    let path = dir.join("bench-durable-append");
    let fail = |e: std::io::Error| format!("durable append in {}: {e}", dir.display());
    let mut file = std::fs::OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(&path)
        .map_err(fail)?;
    let entry = vec![b'x'; bytes];
    let appended = thread_cpu_us_per_call(samples, || {
        file.write_all(&entry)?;
        file.sync_data()
    });
    let removed = std::fs::remove_file(&path);
    let used = appended.and_then(|used| removed.map(|()| used));
    used.map_err(fail)
}

/// The calling thread's CPU, in µs, per call of `call`, over `samples`
/// calls after 100 that warm it up; the first error ends it.
fn thread_cpu_us_per_call<E>(
    samples: usize,
    mut call: impl FnMut() -> Result<(), E>,
) -> Result<f64, E> {
    let thread_cpu = || thread_cpu_seconds() * 1e6;
    (0..100).try_for_each(|_| call())?;
    let started = thread_cpu();
    (0..samples).try_for_each(|_| call())?;
    Ok((thread_cpu() - started) / samples.max(1) as f64)
}

/// The calling thread's CPU, in µs, for the system calls a `file.stat`
/// makes on a runtime worker in the gateway: the root's directory opened,
/// `name` found beneath it and `statx`ed, both closed, through the same
/// `portcullis-confine` calls as `files::ops::stat_cached`.
pub fn confined_stat_cpu_us(
    root: &std::path::Path,
    name: &str,
    samples: usize,
) -> Result<f64, String> {
    use portcullis_confine::{Root, RootSpec, STAT_ATTRIBUTES};
    let spec = RootSpec {
        id: "bench",
        host_root: root,
        virtual_root: "bench:",
        follow_symlinks: false,
    };
    let stat = || Root::open_cached(&spec)?.statx_cached_at(name, STAT_ATTRIBUTES);
    thread_cpu_us_per_call(samples, || {
        stat()
            .map(drop)
            .ok_or_else(|| format!("cannot stat {name} beneath {}", root.display()))
    })
}

/// A thread that writes back to `to` what it reads from `from`, until
/// the end of its input.
fn echo_thread(
    mut from: impl std::io::Read + Send + 'static,
    mut to: impl std::io::Write + Send + 'static,
) -> std::thread::JoinHandle<std::io::Result<()>> {
    std::thread::spawn(move || {
        let mut message = [0u8; 64];
        loop {
            match from.read(&mut message)? {
                0 => return Ok(()),
                n => to.write_all(&message[..n])?,
            }
        }
    })
}

/// `samples` round trips of a `bytes`-long message (at most 64) to an
/// [`echo_thread`]: sent through `to`, back through `from`. The first
/// hundred wake a cold path and are not counted.
fn round_trips(
    to: &mut impl std::io::Write,
    from: &mut impl std::io::Read,
    bytes: usize,
    samples: usize,
) -> std::io::Result<Latencies> {
    let mut latencies = Latencies::default();
    let mut message = [7u8; 64];
    let message = &mut message[..bytes.min(64)];
    for i in 0..samples + 100 {
        let started = std::time::Instant::now();
        to.write_all(message)?;
        from.read_exact(message)?;
        if i >= 100 {
            latencies.push(started.elapsed());
        }
    }
    Ok(latencies)
}

/// How an [`echo_thread`] of the measurement `what` ended, once its
/// input did.
fn joined(thread: std::thread::JoinHandle<std::io::Result<()>>, what: &str) -> Result<(), String> {
    match thread.join() {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("{what}: the echo thread: {e}")),
        Err(_) => Err(format!("{what}: the echo thread panicked")),
    }
}

/// Bytes allocated on disk to the files under `dir` (which may be in
/// use).
pub fn disk_usage(dir: &std::path::Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt as _;
    let mut total = 0;
    for item in std::fs::read_dir(dir)? {
        // A live store renames and removes files as it goes: one gone
        // since the listing holds no disk.
        let meta = match item.and_then(|item| item.metadata().map(|meta| (item, meta))) {
            Ok(found) => found,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        total += match meta.1.is_dir() {
            true => disk_usage(&meta.0.path())?,
            false => meta.1.blocks() * 512,
        };
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_pick_the_nearest_rank() {
        let mut l = Latencies::default();
        for ms in 1..=100 {
            l.push(Duration::from_millis(ms));
        }
        assert_eq!(l.quantile_ms(0.5), 51.0);
        assert_eq!(l.quantile_ms(0.99), 100.0);
        assert_eq!(Latencies::default().quantile_ms(0.5), 0.0);
    }

    #[test]
    fn a_spread_shows_its_median_and_range() {
        let mut s = Spread::default();
        assert_eq!(s.show(1), "–");
        s.push(3.0);
        assert_eq!(s.show(1), "3.0");
        s.push(1.0);
        s.push(2.0);
        assert_eq!(s.show(1), "2.0 [1.0–3.0]");
        s.push(4.0);
        assert_eq!(s.median(), 2.5);
    }

    #[test]
    fn this_process_uses_cpu_and_memory() {
        let pid = std::process::id();
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(30) {}
        assert!(cpu_seconds(pid, false) > 0.0);
        assert!(rss_kib(pid) > 0);
        assert_eq!(process_tree(pid)[0], pid);
    }

    /// The machine's busy time counts this process's: spun until this
    /// process has used 0.2 s of CPU (by its own count, not the clock's).
    #[test]
    fn the_machine_s_busy_time_includes_this_process_s() {
        let (machine, own) = (
            machine_busy_seconds(),
            cpu_seconds(std::process::id(), false),
        );
        while cpu_seconds(std::process::id(), false) - own < 0.2 {}
        assert!(machine_busy_seconds() - machine >= 0.15);
    }

    #[test]
    fn the_floors_measure_as_many_round_trips_as_asked() {
        assert_eq!(loopback_round_trips(50).unwrap().len(), 50);
        assert_eq!(thread_hand_offs(50).unwrap().len(), 50);
    }

    /// Each part of a download's floor moves the bytes asked for and
    /// reports the CPU that took, and the write leaves no file behind.
    #[test]
    fn the_download_floor_s_parts_move_their_bytes() {
        let bytes = 8 << 20;
        let copied = loopback_tcp(bytes).unwrap();
        assert!(copied.rate > 0.0 && copied.cpu > 0.0);
        assert!(aead_cpu(bytes).unwrap() > 0.0);
        let dir = std::env::temp_dir().join(format!("bench-floor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("written.bin");
        assert!(page_cache_write_cpu(&file, bytes).unwrap() > 0.0);
        assert!(!file.exists());
        std::fs::write(&file, vec![1u8; 3 << 20]).unwrap();
        let (cpu, read) = page_cache_read_cpu(&file).unwrap();
        assert!(cpu >= 0.0);
        assert_eq!(read, 3 << 20);
        assert!(
            page_cache_write_cpu(&file, 1).is_err(),
            "the file exists: not overwritten"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
