//! The file verbs against a gateway: `cat`, `get`, `put`, `ls`, `stat`,
//! `rm`, `mkdir`, `grep`. A remote file is written `ROOT:PATH`
//! (`main:src/lib.rs`; `main:` is the root itself).

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use portcullis_client::UploadOptions;
use portcullis_client::{Client, StreamItem};
use serde_json::{Value, json};

use crate::cli::connect::Target;
use crate::cli::{fail, runtime};
use portcullis::files::direct::{DIRECT_FROM, DirectFile, STAGING_BUFFER};

/// A remote path: `ROOT:PATH`.
#[derive(Clone, Debug)]
pub struct Remote {
    root: String,
    path: String,
}

impl std::str::FromStr for Remote {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            Some((root, path)) if !root.is_empty() => Ok(Self {
                root: root.into(),
                path: path.into(),
            }),
            _ => Err(format!(
                "`{s}` is not ROOT:PATH (e.g. main:src/lib.rs; `main:` for the root)"
            )),
        }
    }
}

impl Remote {
    fn params(&self, extra: Value) -> Value {
        let mut params = json!({"root_id": self.root, "path": self.path});
        if let (Some(params), Value::Object(extra)) = (params.as_object_mut(), extra) {
            params.extend(extra);
        }
        params
    }
}

#[derive(clap::Args)]
pub struct Cat {
    #[command(flatten)]
    target: Target,
    /// The file, as ROOT:PATH.
    remote: Remote,
}

#[derive(clap::Args)]
pub struct Get {
    #[command(flatten)]
    target: Target,
    /// The file, as ROOT:PATH.
    remote: Remote,
    /// Where to write it [default: its name, in the current directory].
    /// Written to a temporary name and renamed once all of it arrived; a
    /// file of 4 MiB or more straight to the disk (`O_DIRECT`, where the
    /// file system takes it), not through the page cache.
    local: Option<PathBuf>,
    /// fsync the file before renaming it into place (as rsync --fsync);
    /// off by default, like scp and rsync.
    #[arg(long)]
    fsync: bool,
    /// Ask the gateway for the SHA-256 of the bytes, and print it. Off by
    /// default: the channel already authenticates every byte, and hashing
    /// costs the gateway's host about a core-second per GiB.
    #[arg(long)]
    sha256: bool,
    /// Show progress on stderr (the default when stderr is a terminal).
    #[arg(long)]
    progress: bool,
    /// Print the result (size, throughput, any sha256) as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct Put {
    #[command(flatten)]
    target: Target,
    /// The local file (`-` for stdin).
    local: PathBuf,
    /// Where it goes, as ROOT:PATH; replaced atomically.
    remote: Remote,
    /// Append instead of replacing.
    #[arg(long)]
    append: bool,
    /// Ask the gateway for the SHA-256 of the bytes, and print it. Off by
    /// default: the channel already authenticates every byte, and hashing
    /// costs the gateway's host about a core-second per GiB.
    #[arg(long)]
    sha256: bool,
    /// Show progress on stderr (the default when stderr is a terminal).
    #[arg(long)]
    progress: bool,
    /// Print the result (size, throughput, any sha256) as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct Ls {
    #[command(flatten)]
    target: Target,
    /// The directory, as ROOT:PATH.
    remote: Remote,
    /// Levels to descend (1 = the directory's own entries).
    #[arg(short, long, default_value_t = 1)]
    depth: usize,
    /// Include dot-files.
    #[arg(short, long)]
    all: bool,
    /// Print the entries as JSON lines.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct Stat {
    #[command(flatten)]
    target: Target,
    /// The entry, as ROOT:PATH.
    remote: Remote,
    /// Print as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct Rm {
    #[command(flatten)]
    target: Target,
    /// The entry, as ROOT:PATH.
    remote: Remote,
    /// Remove a directory and everything in it.
    #[arg(short, long)]
    recursive: bool,
}

#[derive(clap::Args)]
pub struct Mkdir {
    #[command(flatten)]
    target: Target,
    /// The directory, as ROOT:PATH.
    remote: Remote,
    /// Create missing parents; an existing directory is fine.
    #[arg(short, long)]
    parents: bool,
}

#[derive(clap::Args)]
pub struct Grep {
    #[command(flatten)]
    target: Target,
    /// A regular expression (or, with -F, a literal string).
    pattern: String,
    /// Where to search, as ROOT:PATH (a directory or a file).
    remote: Remote,
    /// Take the pattern literally.
    #[arg(short = 'F', long)]
    fixed_strings: bool,
    /// Ignore case.
    #[arg(short, long)]
    ignore_case: bool,
    /// Only paths matching GLOB (`!GLOB` excludes); repeatable.
    #[arg(short, long, value_name = "GLOB")]
    glob: Vec<String>,
    /// Search dot-files too.
    #[arg(long)]
    hidden: bool,
    /// Stop after this many matching lines.
    #[arg(short, long, default_value_t = 1000)]
    max_count: u64,
    /// Print each match, then the summary, as JSON lines.
    #[arg(long)]
    json: bool,
}

/// Connects, accepts every offered capability, and runs `verb`.
pub(crate) fn with_client<F>(target: &Target, verb: F) -> ExitCode
where
    F: AsyncFnOnce(&Client) -> Result<ExitCode, String>,
{
    let result = runtime().and_then(|rt| {
        let result = rt.block_on(async {
            let client = target.connect().await?;
            client.accept_all().await.map_err(|e| e.to_string())?;
            verb(&client).await
        });
        // An upload refused early may leave its reader thread waiting on
        // stdin; dropping the runtime would wait for it forever.
        rt.shutdown_timeout(std::time::Duration::from_millis(100));
        result
    });
    result.unwrap_or_else(fail)
}

fn request_error(e: portcullis_client::ClientError) -> String {
    e.to_string()
}

pub fn cat(args: Cat) -> ExitCode {
    with_client(&args.target, async |client| {
        let (root, path) = (&args.remote.root, &args.remote.path);
        client
            .download(root, path, std::io::stdout(), false, &mut |_| {})
            .await
            .map_err(request_error)?;
        Ok(ExitCode::SUCCESS)
    })
}

pub fn get(args: Get) -> ExitCode {
    let name = Path::new(&args.remote.path)
        .file_name()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(&args.remote.root));
    let local = args.local.clone().unwrap_or(name);
    let show = args.progress || std::io::stderr().is_terminal();
    with_client(&args.target, async |client| {
        let size = client
            .request("file.stat", args.remote.params(json!({})))
            .await
            .map_err(request_error)?["size"]
            .as_u64();
        let partial = local.with_file_name(format!(
            ".{}.portcullis-part",
            local.file_name().unwrap_or_default().to_string_lossy()
        ));
        let file =
            std::fs::File::create(&partial).map_err(|e| format!("{}: {e}", partial.display()))?;
        // A large download goes straight to the disk (as the gateway
        // writes a large upload); a small one through the page cache.
        let file = match size.is_some_and(|size| size >= DIRECT_FROM) {
            true => DirectFile::new(file, STAGING_BUFFER),
            false => DirectFile::buffered(file),
        };
        let mut meter = Meter::new(show, size);
        let (root, path) = (&args.remote.root, &args.remote.path);
        let result = client
            .download(root, path, file, args.sha256, &mut |n| meter.update(n))
            .await;
        let finished = result.map_err(request_error).and_then(|(result, file)| {
            let file = file.into_file();
            if args.fsync {
                file.sync_all()
                    .map_err(|e| format!("{}: {e}", partial.display()))?;
            }
            std::fs::rename(&partial, &local).map_err(|e| format!("{}: {e}", local.display()))?;
            Ok(result)
        });
        let result = match finished {
            Ok(result) => result,
            Err(e) => {
                let _ = std::fs::remove_file(&partial);
                return Err(e);
            }
        };
        meter.done(&result, args.json);
        Ok(ExitCode::SUCCESS)
    })
}

pub fn put(args: Put) -> ExitCode {
    let show = args.progress || std::io::stderr().is_terminal();
    let (input, size): (Box<dyn std::io::Read + Send>, Option<u64>) =
        if args.local == Path::new("-") {
            (Box::new(std::io::stdin()), None)
        } else {
            match std::fs::File::open(&args.local) {
                Ok(file) => {
                    let size = file.metadata().ok().map(|m| m.len());
                    (Box::new(std::io::BufReader::new(file)), size)
                }
                Err(e) => return fail(format!("{}: {e}", args.local.display())),
            }
        };
    with_client(&args.target, async |client| {
        let mut meter = Meter::new(show, size);
        let (root, path) = (&args.remote.root, &args.remote.path);
        let options = UploadOptions {
            size,
            append: args.append,
            sha256: args.sha256,
        };
        let result = client
            .upload(root, path, input, options, &mut |n| meter.update(n))
            .await
            .map_err(request_error)?;
        meter.done(&result, args.json);
        Ok(ExitCode::SUCCESS)
    })
}

pub fn ls(args: Ls) -> ExitCode {
    with_client(&args.target, async |client| {
        let mut offset = 0;
        let mut out = std::io::stdout().lock();
        loop {
            let params = args.remote.params(json!({
                "depth": args.depth, "hidden": args.all, "offset": offset,
            }));
            let page = client
                .request("file.list", params)
                .await
                .map_err(request_error)?;
            for entry in page["entries"].as_array().into_iter().flatten() {
                let line = match args.json {
                    true => entry.to_string(),
                    false => format!(
                        "{} {:>4} {:>12} {} {}",
                        entry["mode"].as_str().unwrap_or("?"),
                        entry["kind"].as_str().unwrap_or("?"),
                        entry["size"],
                        entry["mtime"].as_str().unwrap_or(""),
                        entry["path"].as_str().unwrap_or(""),
                    ),
                };
                writeln!(out, "{line}").map_err(|e| format!("stdout: {e}"))?;
            }
            match page["next_offset"].as_u64() {
                Some(next) if page["truncated"] == true => offset = next,
                _ => return Ok(ExitCode::SUCCESS),
            }
        }
    })
}

pub fn stat(args: Stat) -> ExitCode {
    with_client(&args.target, async |client| {
        let result = client
            .request("file.stat", args.remote.params(json!({})))
            .await
            .map_err(request_error)?;
        print_result(&result, args.json);
        Ok(ExitCode::SUCCESS)
    })
}

pub fn rm(args: Rm) -> ExitCode {
    let params = args.remote.params(json!({"recursive": args.recursive}));
    quietly(&args.target, "file.delete", params)
}

pub fn mkdir(args: Mkdir) -> ExitCode {
    let params = args.remote.params(json!({"parents": args.parents}));
    quietly(&args.target, "file.mkdir", params)
}

/// One request whose success needs no output.
fn quietly(target: &Target, method: &str, params: Value) -> ExitCode {
    with_client(target, async |client| {
        client
            .request(method, params)
            .await
            .map_err(request_error)?;
        Ok(ExitCode::SUCCESS)
    })
}

/// Prints `path:line:text` per match (JSON lines with --json). Exit 0 when
/// something matched, 2 when nothing did (grep's 1 is taken by errors here).
pub fn grep(args: Grep) -> ExitCode {
    with_client(&args.target, async |client| {
        let params = args.remote.params(json!({
            "pattern": args.pattern,
            "literal": args.fixed_strings,
            "case_insensitive": args.ignore_case,
            "globs": args.glob,
            "hidden": args.hidden,
            "max_results": args.max_count,
        }));
        let mut handle = client
            .start("file.search", params)
            .await
            .map_err(request_error)?;
        let mut out = std::io::stdout().lock();
        while let Some(item) = handle.next().await {
            let StreamItem::Stream { data, .. } = item else {
                continue;
            };
            let line = match args.json {
                true => data.to_string(),
                false => format!(
                    "{}:{}:{}",
                    data["path"].as_str().unwrap_or(""),
                    data["line"],
                    data["text"].as_str().unwrap_or("")
                ),
            };
            writeln!(out, "{line}").map_err(|e| format!("stdout: {e}"))?;
        }
        let result = handle.response().await.map_err(request_error)?;
        if args.json {
            writeln!(out, "{result}").map_err(|e| format!("stdout: {e}"))?;
        } else if let Some(cap) = result["truncated_by"].as_str() {
            eprintln!("portcullis: stopped early at {cap}; more may match");
        }
        Ok(match result["matches"].as_u64() {
            Some(1..) => ExitCode::SUCCESS,
            _ => ExitCode::from(crate::cli::EXIT_NO),
        })
    })
}

fn print_result(result: &Value, json: bool) {
    if json {
        println!("{result}");
        return;
    }
    for (key, value) in result.as_object().into_iter().flatten() {
        match value.as_str() {
            Some(text) => println!("{key}: {text}"),
            None => println!("{key}: {value}"),
        }
    }
}

/// Progress on stderr, at most ten updates a second, and the summary.
struct Meter {
    show: bool,
    total: Option<u64>,
    started: Instant,
    shown: Instant,
    bytes: u64,
}

impl Meter {
    fn new(show: bool, total: Option<u64>) -> Self {
        let now = Instant::now();
        Self {
            show,
            total,
            started: now,
            shown: now,
            bytes: 0,
        }
    }

    fn update(&mut self, bytes: u64) {
        self.bytes = bytes;
        if self.show && self.shown.elapsed().as_millis() >= 100 {
            self.shown = Instant::now();
            eprint!("\r{}", self.line());
        }
    }

    fn line(&self) -> String {
        let secs = self.started.elapsed().as_secs_f64().max(1e-9);
        let rate = self.bytes as f64 / secs / 1e6;
        let done = mib(self.bytes);
        match self.total {
            Some(total) if total > 0 => format!(
                "{done:.1} / {:.1} MiB  {:3}%  {rate:.0} MB/s   ",
                mib(total),
                self.bytes * 100 / total
            ),
            _ => format!("{done:.1} MiB  {rate:.0} MB/s   "),
        }
    }

    /// The final line (or JSON), with size, throughput and any sha256.
    fn done(&self, result: &Value, json: bool) {
        let secs = self.started.elapsed().as_secs_f64();
        if self.show {
            eprintln!("\r{}", self.line());
        }
        let mut summary = result.clone();
        summary["bytes"] = json!(self.bytes);
        summary["seconds"] = json!((secs * 1000.0).round() / 1000.0);
        summary["mb_per_s"] = json!((self.bytes as f64 / secs.max(1e-9) / 1e6).round());
        if json {
            println!("{summary}");
        } else if self.show {
            let path = result["path"].as_str().unwrap_or("");
            match result["sha256"].as_str() {
                Some(sha256) => eprintln!("{path}: {} bytes, sha256 {sha256}", self.bytes),
                None => eprintln!("{path}: {} bytes", self.bytes),
            }
        }
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
