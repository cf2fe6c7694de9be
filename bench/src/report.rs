//! `bench/RESULTS.md` and the chart: what was measured, on what machine,
//! when, with which command.

use std::fmt::Write as _;
use std::path::Path;

use crate::Args;
use crate::measure::Spread;
use crate::scale::ScaleResult;

#[derive(Clone, Copy)]
pub enum Better {
    Lower,
    Higher,
}

/// One line of the table: a figure for portcullis beside OpenSSH's.
pub struct Row {
    pub section: &'static str,
    pub what: String,
    pub unit: &'static str,
    pub ours: Spread,
    pub theirs: Spread,
    pub better: Better,
    pub decimals: usize,
    pub note: String,
}

impl Row {
    pub fn new(
        section: &'static str,
        what: String,
        unit: &'static str,
        ours: Spread,
        theirs: Spread,
        better: Better,
        decimals: usize,
    ) -> Self {
        Self {
            section,
            what,
            unit,
            ours,
            theirs,
            better,
            decimals,
            note: String::new(),
        }
    }

    /// A row with no peer beside it: a floor, a limit, a figure of ours.
    pub fn alone(
        section: &'static str,
        what: String,
        unit: &'static str,
        ours: Spread,
        better: Better,
        decimals: usize,
    ) -> Self {
        Self::new(
            section,
            what,
            unit,
            ours,
            Spread::default(),
            better,
            decimals,
        )
    }

    /// The row with `note` beside its figures.
    pub fn noted(mut self, note: String) -> Self {
        self.note = note;
        self
    }

    /// How many times better portcullis is (below 1: worse), when both
    /// sides were measured.
    fn advantage(&self) -> Option<f64> {
        if self.ours.is_empty() || self.theirs.is_empty() {
            return None;
        }
        let (ours, theirs) = (self.ours.median(), self.theirs.median());
        let ratio = match self.better {
            Better::Lower => theirs / ours,
            Better::Higher => ours / theirs,
        };
        ratio.is_finite().then_some(ratio)
    }
}

/// Requests per second and latency at one concurrency, both sides.
#[derive(Default)]
pub struct Concurrency {
    pub level: usize,
    pub ours_rate: Spread,
    pub ours_p50: Spread,
    pub ours_p99: Spread,
    pub theirs_rate: Spread,
    pub theirs_p50: Spread,
    pub theirs_p99: Spread,
}

pub struct Results {
    command: String,
    rounds: usize,
    pub openssh: String,
    pub rows: Vec<Row>,
    pub concurrency: Vec<Concurrency>,
    pub scale: Option<ScaleResult>,
}

fn shell(command: &str, args: &[&str]) -> String {
    std::process::Command::new(command)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

impl Results {
    pub fn new(args: &Args) -> Self {
        let given: Vec<String> = std::env::args().skip(1).collect();
        Self {
            command: format!("bash bench/run.sh {}", given.join(" "))
                .trim()
                .to_string(),
            rounds: args.rounds,
            openssh: String::new(),
            rows: Vec::new(),
            concurrency: Vec::new(),
            scale: None,
        }
    }

    pub fn write(&self, out: &Path, chart: &Path) -> Result<(), String> {
        let mut md = String::new();
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
            })
            .unwrap_or_default();
        let memory = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .next()
            .map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse::<f64>()
                    .unwrap_or(0.0)
                    / 1048576.0
            })
            .unwrap_or(0.0);
        let _ = writeln!(md, "# portcullis beside OpenSSH: results\n");
        let _ = writeln!(
            md,
            "Produced by `{}` (see `bench/README.md`); every figure below is from that one run.\n",
            self.command
        );
        let _ = writeln!(
            md,
            "- date: {}",
            shell("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
        );
        let _ = writeln!(
            md,
            "- machine: {} CPUs ({cpu}), {memory:.1} GiB, kernel {}, {}",
            shell("nproc", &[]),
            shell("uname", &["-r"]),
            shell("sh", &["-c", ". /etc/os-release && echo $PRETTY_NAME"])
        );
        let _ = writeln!(
            md,
            "- portcullis: {} (release build)",
            shell("git", &["describe", "--always", "--dirty"])
        );
        let _ = writeln!(md, "- launcher: {}", launcher_linking());
        let _ = writeln!(md, "- OpenSSH: {}", self.openssh);
        let _ = writeln!(
            md,
            "- both servers, the clients and this harness share the machine; everything on 127.0.0.1"
        );
        let _ = writeln!(
            md,
            "\nEach cell is the median of {} rounds with the range in brackets (one value: one round). \"advantage\" is how many times better portcullis is than OpenSSH on that row (below 1×: worse).\n",
            self.rounds
        );
        let mut section = "";
        for row in &self.rows {
            if row.section != section {
                section = row.section;
                let _ = writeln!(md, "\n## {section}\n");
                let _ = writeln!(md, "| | unit | portcullis | OpenSSH | advantage | |");
                let _ = writeln!(md, "|---|---|---|---|---|---|");
            }
            let advantage = row.advantage().map_or("–".into(), |a| format!("{a:.2}×"));
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} |",
                row.what,
                row.unit,
                row.ours.show(row.decimals),
                row.theirs.show(row.decimals),
                advantage,
                row.note
            );
        }
        // A chart that cannot be drawn must not cost the run's figures:
        // the Markdown is written in any case, then the error reported.
        let mut unwritten = Vec::new();
        if !self.concurrency.is_empty() {
            let drawn = self.chart(chart);
            embed(
                &mut md,
                drawn,
                chart,
                "requests per second and latency against requests in flight",
                &mut unwritten,
            );
        }
        md.push_str(&self.scale_section(&chart.with_file_name("scale.svg"), &mut unwritten));
        std::fs::write(out, md).map_err(|e| format!("{}: {e}", out.display()))?;
        match unwritten.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "wrote {}, but not its charts: {}",
                out.display(),
                unwritten.join("; ")
            )),
        }
    }

    /// The scale test's section; a chart that could not be drawn goes to
    /// `unwritten`.
    fn scale_section(&self, chart: &Path, unwritten: &mut Vec<String>) -> String {
        let Some(scale) = &self.scale else {
            return String::new();
        };
        let mut md = String::new();
        let _ = writeln!(md, "\n## Scale test\n");
        let _ = writeln!(
            md,
            "Sessions at once, each sending one request after another with a {} ms pause (0.5–1.5 times it): {} (portcullis only). Each load runs {} s: first at each session count (so the offered load grows with the sessions), then at the largest count again once `file.stat`s ({} in flight) have filled the audit log to each length. Disk is the gateway's state directory (sled and the journal) at the end of the load.\n",
            scale.pause_ms,
            scale.mix,
            scale.seconds,
            crate::scale::FILL_IN_FLIGHT
        );
        let _ = writeln!(
            md,
            "**{} requests, {} failed** over every load.\n",
            scale.loads.iter().map(|l| l.requests).sum::<usize>(),
            scale.errors,
        );
        for error in &scale.first_errors {
            let _ = writeln!(md, "- failed: {error}");
        }
        let _ = writeln!(
            md,
            "| sessions | audit entries at start | requests | failed | requests/s | p50 ms | p99 ms | gateway RSS MiB | disk MiB | gateway CPU (cores) | log filled at (entries/s) |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|");
        for load in &scale.loads {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.1} | {:.0} | {:.2} | {} |",
                load.sessions,
                load.log_entries,
                load.requests,
                load.errors,
                load.requests as f64 / scale.seconds as f64,
                load.p50,
                load.p99,
                load.rss_kib as f64 / 1024.0,
                load.disk_bytes as f64 / 1_048_576.0,
                load.cpu,
                load.filled_at
                    .map_or("–".to_string(), |r| format!("{r:.0}"))
            );
        }
        let drawn = self.scale_chart(scale, chart);
        embed(
            &mut md,
            drawn,
            chart,
            "gateway RSS, disk and p99 against sessions and against the audit log's length",
            unwritten,
        );
        let _ = writeln!(
            md,
            "{} sessions, per {}-second window:\n",
            scale.sessions,
            crate::scale::WINDOW.as_secs()
        );
        let _ = writeln!(
            md,
            "| seconds | requests | requests/s | p50 ms | p99 ms | gateway RSS MiB | gateway CPU (cores) |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|");
        for w in &scale.windows {
            let _ = writeln!(
                md,
                "| {}–{} | {} | {:.0} | {:.2} | {:.2} | {:.1} | {:.2} |",
                w.from,
                w.to,
                w.requests,
                w.requests as f64 / (w.to - w.from) as f64,
                w.p50,
                w.p99,
                w.rss_kib as f64 / 1024.0,
                w.cpu
            );
        }
        let _ = writeln!(md, "\n| request | count | p50 ms | p99 ms |");
        let _ = writeln!(md, "|---|---|---|---|");
        for (name, count, p50, p99) in &scale.by_kind {
            let _ = writeln!(md, "| {name} | {count} | {p50:.2} | {p99:.2} |");
        }
        let _ = writeln!(
            md,
            "\nGateway RSS: {:.1} MiB before the sessions connected, {:.1} MiB once all {} had connected and loaded.",
            scale.rss_before_kib as f64 / 1024.0,
            scale.rss_connected_kib as f64 / 1024.0,
            scale.sessions,
        );
        md
    }

    /// Six panels: the gateway's RSS, its disk and p99 against sessions
    /// (top) and against the audit log's length (bottom, the largest
    /// session count).
    fn scale_chart(&self, scale: &ScaleResult, path: &Path) -> Result<(), String> {
        use plotters::prelude::*;
        let root = SVGBackend::new(path, (1200, 700)).into_drawing_area();
        root.fill(&WHITE).map_err(chart_error)?;
        let rows = root.split_evenly((2, 3));
        let blue = RGBColor(31, 119, 180);
        let by_sessions: Vec<_> = scale
            .loads
            .iter()
            .filter(|l| l.filled_at.is_none())
            .collect();
        let by_length: Vec<_> = scale
            .loads
            .iter()
            .filter(|l| l.sessions == scale.sessions)
            .collect();
        let figures: [(&str, &str, LoadFigure); 3] = [
            ("Gateway RSS", "MiB", |l| l.rss_kib as f64 / 1024.0),
            ("Disk", "MiB", |l| l.disk_bytes as f64 / 1_048_576.0),
            ("p99 of the mix", "ms", |l| l.p99),
        ];
        for (i, (caption, unit, figure)) in figures.iter().enumerate() {
            let line = |loads: &[&crate::scale::Load], x: LoadFigure| {
                vec![Line(
                    "portcullis",
                    blue,
                    2,
                    loads.iter().map(|l| (x(l), figure(l))).collect(),
                )]
            };
            panel(
                &rows[i],
                &format!("{caption} by sessions"),
                "sessions",
                unit,
                &line(&by_sessions, |l| l.sessions as f64),
            )?;
            panel(
                &rows[3 + i],
                &format!("{caption} by log length"),
                "audit entries",
                unit,
                &line(&by_length, |l| l.log_entries.max(1) as f64),
            )?;
        }
        root.present().map_err(chart_error)
    }

    /// Two panels: requests per second, and p50/p99 latency, against the
    /// requests in flight (both axes logarithmic).
    fn chart(&self, path: &Path) -> Result<(), String> {
        use plotters::prelude::*;
        let root = SVGBackend::new(path, (1000, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(chart_error)?;
        let (left, right) = root.split_horizontally(500);
        let (blue, orange) = (RGBColor(31, 119, 180), RGBColor(255, 127, 14));
        let points = |pick: fn(&Concurrency) -> &Spread| -> Vec<(f64, f64)> {
            self.concurrency
                .iter()
                .map(|c| (c.level as f64, pick(c).median()))
                .collect()
        };
        let rates = [
            Line(
                "portcullis (audited file.stat)",
                blue,
                2,
                points(|c| &c.ours_rate),
            ),
            Line("OpenSSH (SFTP STAT)", orange, 2, points(|c| &c.theirs_rate)),
        ];
        panel(
            &left,
            "Small requests per second",
            "requests in flight",
            "requests / s",
            &rates,
        )?;
        let latencies = [
            Line("portcullis p50", blue, 2, points(|c| &c.ours_p50)),
            Line("portcullis p99", blue, 1, points(|c| &c.ours_p99)),
            Line("OpenSSH p50", orange, 2, points(|c| &c.theirs_p50)),
            Line("OpenSSH p99", orange, 1, points(|c| &c.theirs_p99)),
        ];
        panel(&right, "Latency", "requests in flight", "ms", &latencies)?;
        root.present().map_err(chart_error)
    }
}

/// A figure of a scale-test load, for the chart.
type LoadFigure = fn(&crate::scale::Load) -> f64;

/// A series on the chart: label, colour, stroke width, (x, y) points.
struct Line(
    &'static str,
    plotters::style::RGBColor,
    u32,
    Vec<(f64, f64)>,
);

fn chart_error(e: impl std::fmt::Display) -> String {
    format!("the chart: {e}")
}

/// One panel: `lines` against `x_desc`, log-log.
fn panel(
    area: &plotters::drawing::DrawingArea<
        plotters::backend::SVGBackend<'_>,
        plotters::coord::Shift,
    >,
    caption: &str,
    x_desc: &str,
    unit: &str,
    lines: &[Line],
) -> Result<(), String> {
    use plotters::prelude::*;
    let xs = || lines.iter().flat_map(|l| l.3.iter().map(|p| p.0));
    let ys = || lines.iter().flat_map(|l| l.3.iter().map(|p| p.1));
    let x_max = xs().fold(2.0, f64::max);
    let x_min = xs().fold(x_max / 2.0, f64::min).max(1.0);
    let y_max = ys().fold(0.01, f64::max);
    let y_min = ys().filter(|y| *y > 0.0).fold(y_max, f64::min);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{caption} (log scale)"), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (x_min..x_max).log_scale(),
            (y_min / 2.0..y_max * 2.0).log_scale(),
        )
        .map_err(chart_error)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(unit)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| match *y >= 10.0 {
            true => format!("{y:.0}"),
            false => format!("{y}"),
        })
        .draw()
        .map_err(chart_error)?;
    for Line(label, color, width, points) in lines {
        let style = color.stroke_width(*width);
        chart
            .draw_series(LineSeries::new(points.clone(), style))
            .map_err(chart_error)?
            .label(*label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart
            .draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(chart_error)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .draw()
        .map_err(chart_error)
}

/// How the launcher beside the gateway was linked: a command starts it
/// twice, and a start of a program linked with glibc costs a VM about
/// 0.7 ms of CPU more than a static musl one (bench/README.md), so the
/// exec rows depend on it.
fn launcher_linking() -> String {
    let Ok(launcher) = crate::gateway::binary().map(|b| b.with_file_name("portcullis-sandbox"))
    else {
        return "not found".into();
    };
    match std::fs::read(&launcher).map(|elf| has_interpreter(&elf)) {
        Ok(Some(false)) => "portcullis-sandbox, statically linked (sandbox/build-static.sh)".into(),
        Ok(Some(true)) => "portcullis-sandbox, dynamically linked (as cargo builds it)".into(),
        Ok(None) => "portcullis-sandbox, not a 64-bit ELF file".into(),
        Err(e) => format!("{}: {e}", launcher.display()),
    }
}

/// Whether a 64-bit little-endian ELF file names a program interpreter
/// (a `PT_INTERP` program header: the dynamic loader); `None` for
/// anything else.
fn has_interpreter(elf: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    let bytes = |at: usize, n: usize| elf.get(at..at + n);
    if bytes(0, 6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let u16_at = |at| bytes(at, 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let phoff = usize::try_from(u64::from_le_bytes(bytes(0x20, 8)?.try_into().ok()?)).ok()?;
    let (size, count) = (u16_at(0x36)?, u16_at(0x38)?);
    (0..count)
        .map(|i| bytes(phoff.checked_add(i.checked_mul(size)?)?, 4))
        .map(|p| p.map(|p| u32::from_le_bytes([p[0], p[1], p[2], p[3]]) == PT_INTERP))
        .try_fold(false, |found, is| Some(found || is?))
}

/// Links a drawn chart from the Markdown, or notes why it is missing.
fn embed(
    md: &mut String,
    drawn: Result<(), String>,
    chart: &Path,
    alt: &str,
    unwritten: &mut Vec<String>,
) {
    match drawn {
        Ok(()) => {
            let name = chart.file_name().unwrap_or_default().to_string_lossy();
            let _ = writeln!(md, "\n![{alt}]({name})\n");
        }
        Err(e) => unwritten.push(format!("{}: {e}", chart.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::has_interpreter;

    #[test]
    fn a_dynamic_program_names_its_interpreter_and_a_static_one_none() {
        // This test binary is linked as cargo links it for the host.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let dynamic = cfg!(target_env = "gnu");
        assert_eq!(has_interpreter(&me), Some(dynamic));
        assert_eq!(has_interpreter(b"#!/bin/sh\n"), None);
        assert_eq!(has_interpreter(&me[..0x30]), None);
    }
}
