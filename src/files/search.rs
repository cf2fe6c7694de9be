//! `file.search`: ripgrep's searcher and regex engine over a confined walk.
//!
//! The walk is [`Tree`]'s (every directory and file opened beneath the
//! root, never through a symlink), not `ignore`'s own walker, which opens
//! by path; `ignore` contributes its glob overrides (`*.rs`, `!target/`).
//! Matches stream as `match` events while the search runs; the terminal
//! result counts them and says which cap, if any, cut the search short.

use std::fs::File;
use std::io;

use grep_matcher::Matcher as _;
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkMatch};
use ignore::overrides::{Override, OverrideBuilder};
use rustix::fs::{FileType, Mode, OFlags};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::ops::{Step, Tree};
use crate::provider::{Progress, StreamSink};
use portcullis_confine::{FileError, Root};

/// Longest pattern accepted, in bytes.
const MAX_PATTERN: usize = 4096;
/// Memory the compiled pattern may use; a hostile pattern fails to compile.
const REGEX_SIZE_LIMIT: usize = 8 << 20;
/// Memory the searcher may use for one file; a longer line skips the file.
const HEAP_LIMIT: usize = 8 << 20;
/// Bytes of one matching line sent; the rest is cut and flagged.
const MAX_LINE: usize = 1024;

#[derive(Deserialize)]
pub struct SearchParams {
    pattern: String,
    /// Match `pattern` as written, not as a regular expression.
    #[serde(default)]
    literal: bool,
    #[serde(default)]
    case_insensitive: bool,
    /// ripgrep-style globs on the path below the searched directory;
    /// `!glob` excludes.
    #[serde(default)]
    globs: Vec<String>,
    #[serde(default)]
    hidden: bool,
    #[serde(default = "max_results")]
    max_results: u64,
    /// Bytes of matching lines sent, in all.
    #[serde(default = "max_bytes")]
    max_bytes: u64,
    /// Files larger than this are passed over (counted in `skipped`).
    #[serde(default = "max_filesize")]
    max_filesize: u64,
}

fn max_results() -> u64 {
    1000
}

fn max_bytes() -> u64 {
    1 << 20
}

fn max_filesize() -> u64 {
    64 << 20
}

/// What a search saw, for the terminal result.
#[derive(Default)]
struct Tally {
    files_searched: u64,
    files_matched: u64,
    matches: u64,
    bytes_sent: u64,
    bytes_searched: u64,
    skipped_binary: u64,
    skipped_large: u64,
    skipped_unreadable: u64,
    /// The cap that ended the search early.
    cut_by: Option<&'static str>,
}

pub fn search(
    root: &Root,
    path: &str,
    p: SearchParams,
    sink: &StreamSink,
    cancel: &CancellationToken,
) -> Result<Value, FileError> {
    let vpath = root.virtual_path(path);
    let matcher = compile(&p)?;
    let globs = overrides(&p.globs)?;
    let limits = Limits {
        results: p.max_results.clamp(1, 100_000),
        bytes: p.max_bytes.clamp(1, 64 << 20),
        filesize: p.max_filesize,
    };
    let mut searcher = SearcherBuilder::new()
        .line_number(true)
        .binary_detection(BinaryDetection::quit(0))
        .heap_limit(Some(HEAP_LIMIT))
        .build();
    let mut tally = Tally::default();
    let mut lost = None;
    let mut progress = Progress::default();
    let mut search_one = |file: File, rel: &str, tally: &mut Tally| {
        let mut out = Matches {
            root,
            path: rel,
            matcher: &matcher,
            sink,
            limits: &limits,
            tally,
            matched: false,
            binary: false,
        };
        let result = searcher.search_file(&matcher, &file, &mut out);
        let (matched, binary) = (out.matched, out.binary);
        tally.files_searched += 1;
        tally.files_matched += u64::from(matched);
        tally.skipped_binary += u64::from(binary);
        result
    };

    let start = root.open_at(path, OFlags::PATH, Mode::empty())?;
    let is_dir = rustix::fs::fstat(&start)
        .map(|s| FileType::from_raw_mode(s.st_mode) == FileType::Directory)
        .map_err(|e| FileError::from_errno(e, &vpath))?;
    if !is_dir {
        // One file: the globs do not apply.
        let (file, size) = super::ops::open_read(root, path)?;
        tally.bytes_searched += size;
        search_one(file, path, &mut tally).map_err(|e| session_or_io(e, &vpath))?;
    } else {
        let dir = root.open_at(path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        let tree = Tree {
            depth: super::ops::MAX_DEPTH,
            hidden: p.hidden,
        };
        let base = if path.is_empty() { 0 } else { path.len() + 1 };
        tree.walk(root, &dir, path, cancel, &mut |entry| {
            let kind = FileType::from_raw_mode(entry.stat.st_mode);
            let below = &entry.path[base..];
            if globs
                .matched(below, kind == FileType::Directory)
                .is_ignore()
            {
                return Step::Skip;
            }
            if kind != FileType::RegularFile {
                return Step::Next;
            }
            if entry.stat.st_size as u64 > limits.filesize {
                tally.skipped_large += 1;
                return Step::Next;
            }
            let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY;
            let opened = root
                .open_beneath(entry.dir, entry.name, flags, Mode::empty())
                .ok()
                .and_then(|fd| single_link_file(fd).ok());
            let Some(file) = opened else {
                tally.skipped_unreadable += 1;
                return Step::Next;
            };
            tally.bytes_searched += entry.stat.st_size as u64;
            let searched = search_one(file, entry.path, &mut tally);
            let reported = progress.tick(sink, || {
                json!({"files_searched": tally.files_searched, "bytes_searched": tally.bytes_searched,
                       "matches": tally.matches})
            });
            if reported.is_err() {
                lost = Some(io::Error::from(io::ErrorKind::BrokenPipe));
                return Step::Stop;
            }
            match searched {
                Ok(()) if tally.cut_by.is_some() => Step::Stop,
                Ok(()) => Step::Next,
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                    lost = Some(e);
                    Step::Stop
                }
                // A line longer than the heap limit, a read error.
                Err(_) => {
                    tally.skipped_unreadable += 1;
                    Step::Next
                }
            }
        })
        .map_err(|e| FileError::from_errno(e, &vpath))?;
    }
    if lost.is_some() || cancel.is_cancelled() {
        return Err(FileError::Cancelled);
    }
    Ok(json!({
        "path": vpath,
        "files_searched": tally.files_searched,
        "files_matched": tally.files_matched,
        "matches": tally.matches,
        "bytes_searched": tally.bytes_searched,
        "truncated": tally.cut_by.is_some(),
        "truncated_by": tally.cut_by,
        "skipped": {
            "binary": tally.skipped_binary,
            "too_large": tally.skipped_large,
            "unreadable": tally.skipped_unreadable,
        },
    }))
}

fn compile(p: &SearchParams) -> Result<RegexMatcher, FileError> {
    if p.pattern.is_empty() || p.pattern.len() > MAX_PATTERN {
        return Err(FileError::Invalid(format!(
            "`pattern` must be 1 to {MAX_PATTERN} bytes"
        )));
    }
    RegexMatcherBuilder::new()
        .fixed_strings(p.literal)
        .case_insensitive(p.case_insensitive)
        .line_terminator(Some(b'\n'))
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .build(&p.pattern)
        .map_err(|e| FileError::Invalid(format!("`pattern`: {e}")))
}

fn overrides(globs: &[String]) -> Result<Override, FileError> {
    if globs.len() > 64 {
        return Err(FileError::Invalid("at most 64 `globs`".into()));
    }
    let mut builder = OverrideBuilder::new("");
    for glob in globs {
        builder
            .add(glob)
            .map_err(|e| FileError::Invalid(format!("`globs`: {e}")))?;
    }
    builder
        .build()
        .map_err(|e| FileError::Invalid(format!("`globs`: {e}")))
}

/// The same checks as a read: a regular file with one link.
fn single_link_file(fd: std::os::fd::OwnedFd) -> Result<File, ()> {
    let stat = rustix::fs::fstat(&fd).map_err(drop)?;
    let regular = FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile;
    (regular && stat.st_nlink == 1)
        .then(|| File::from(fd))
        .ok_or(())
}

fn session_or_io(e: io::Error, vpath: &str) -> FileError {
    match e.kind() {
        io::ErrorKind::BrokenPipe => FileError::Cancelled,
        _ => FileError::Io(format!("{vpath}: {e}")),
    }
}

struct Limits {
    results: u64,
    bytes: u64,
    filesize: u64,
}

/// Sends each matching line of one file as a `match` event.
struct Matches<'a> {
    root: &'a Root,
    path: &'a str,
    matcher: &'a RegexMatcher,
    sink: &'a StreamSink,
    limits: &'a Limits,
    tally: &'a mut Tally,
    matched: bool,
    binary: bool,
}

impl Sink for Matches<'_> {
    type Error = io::Error;

    fn matched(&mut self, _: &Searcher, mat: &SinkMatch<'_>) -> Result<bool, io::Error> {
        let line = mat.bytes();
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let column = self
            .matcher
            .find(line)
            .ok()
            .flatten()
            .map(|m| m.start() + 1);
        let cut = line.len() > MAX_LINE;
        let text = String::from_utf8_lossy(&line[..line.len().min(MAX_LINE)]);
        if self.tally.bytes_sent + text.len() as u64 > self.limits.bytes {
            self.tally.cut_by = Some("max_bytes");
            return Ok(false);
        }
        let event = json!({
            "path": self.root.virtual_path(self.path),
            "line": mat.line_number(),
            "column": column,
            "text": text,
            "text_truncated": cut,
        });
        self.sink
            .event_blocking("match", event)
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))?;
        self.matched = true;
        self.tally.matches += 1;
        self.tally.bytes_sent += text.len() as u64;
        if self.tally.matches >= self.limits.results {
            self.tally.cut_by = Some("max_results");
            return Ok(false);
        }
        Ok(true)
    }

    fn binary_data(&mut self, _: &Searcher, _: u64) -> Result<bool, io::Error> {
        self.binary = true;
        Ok(false)
    }
}
