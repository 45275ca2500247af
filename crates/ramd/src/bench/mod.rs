//! `ramd bench TARGET [TARGET…]`: the measurements RAM-disk users publish
//! side by side on each target, alternating between targets so that a
//! host busy with something else slows them all alike.
//!
//! - `target`: what a target is, the checks before anything is written;
//! - `workloads`: dd, sysbench fileio, pg_test_fsync, IOMeter, RedHawk,
//!   untar/stat/remove;
//! - `report`: medians, ratios to the first target, the table and JSON;
//! - `svg`: the bar chart.

mod report;
mod svg;
mod target;
mod workloads;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use target::Target;
pub use workloads::Workload;
use workloads::{Outcome, Plan};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// What to measure: a directory (files in a fresh `ramd-bench.*`
    /// subdirectory, removed afterwards), a regular file or block device
    /// (used as a raw disk), or an NBD URI (`nbd://HOST[:PORT]/EXPORT`,
    /// `nbd+unix:///EXPORT?socket=PATH`). Ratios are to the first.
    #[arg(required = true, value_name = "TARGET")]
    pub targets: Vec<String>,

    /// Run only these workloads (comma-separated; default: all).
    #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
    pub only: Vec<Workload>,

    /// The data set each workload scales from: dd writes this much,
    /// sysbench spreads it over 16 files, IOMeter spans it.
    #[arg(long, default_value = "256M", value_parser = parse_bench_size, value_name = "SIZE")]
    pub size: u64,

    /// IOMeter's outstanding I/Os: threads doing pread/pwrite on files and
    /// raw disks, requests in flight on one NBD connection.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=1024), value_name = "N")]
    pub qd: u16,

    /// Repetitions of every measurement; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=1000), value_name = "N")]
    pub runs: u16,

    /// Print one JSON object (for scripts) instead of the table.
    #[arg(long)]
    pub json: bool,

    /// Also draw the results as a bar chart in this SVG file.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,

    /// Write to a file, block device or export even when its first MiB
    /// is not all zeros (what it holds is lost).
    #[arg(long)]
    pub destructive: bool,
}

/// At least 16 MiB, so that each of sysbench's 16 files holds 1 MiB.
fn parse_bench_size(s: &str) -> Result<u64, String> {
    let n = ramd_daemon::units::parse_size(s)?;
    if n < 16 << 20 {
        return Err(format!("{s} is below the smallest bench size, 16M"));
    }
    Ok(n)
}

pub fn run(args: BenchArgs) -> Result<()> {
    let mut chosen = if args.only.is_empty() {
        Workload::all()
    } else {
        args.only.clone()
    };
    chosen.sort();
    chosen.dedup();
    let plan = Plan {
        size: args.size,
        qd: usize::from(args.qd),
    };
    if let Some(svg) = &args.svg {
        let parent = svg
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        if !parent.is_dir() {
            bail!(
                "--svg {}: {} is not a directory",
                svg.display(),
                parent.display()
            );
        }
    }

    // Every target is checked before any is written.
    let need_raw = plan.need_raw(&chosen);
    let need_dir = plan.need_dir(&chosen);
    let sizes = plan.describe();
    let mut targets = Vec::new();
    for spec in &args.targets {
        targets.push(Target::open(
            spec,
            need_raw,
            need_dir,
            args.destructive,
            &sizes,
        )?);
    }
    for (i, t) in targets.iter().enumerate() {
        if args.targets[..i].contains(&t.spec) {
            bail!("{}: given twice", t.spec);
        }
    }
    // Ctrl-C ends the bench between two measurements, so that the
    // targets are cleaned up; a second one ends it at once.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(sig, 130, stop.clone())
            .and_then(|_| signal_hook::flag::register(sig, stop.clone()))
            .context("installing signal handlers")?;
    }
    for t in &mut targets {
        t.prepare()?;
    }

    let runs = usize::from(args.runs);
    let steps = (chosen.len() * targets.len() * runs) as u64;
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::with_draw_target(Some(steps), ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{wide_bar}] {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );

    // cells[w][t]: every run of workload w on target t.
    let mut cells: Vec<Vec<report::Cell>> = chosen
        .iter()
        .map(|_| targets.iter().map(|_| report::Cell::default()).collect())
        .collect();
    for run in 0..runs {
        for (wi, &w) in chosen.iter().enumerate() {
            for (ti, t) in targets.iter_mut().enumerate() {
                if stop.load(Ordering::Relaxed) {
                    bar.finish_and_clear();
                    for t in &mut targets {
                        t.finish()?;
                    }
                    bail!("interrupted; the targets were cleaned up");
                }
                bar.set_message(format!("run {}/{runs} {} on {}", run + 1, w.name(), t.spec));
                // The same data and offsets on every target, new each run.
                let seed = (run as u64) << 8 | wi as u64;
                let cell = &mut cells[wi][ti];
                match workloads::run(w, t, &plan, seed)? {
                    Outcome::Done { metrics, note } => {
                        cell.runs.push(metrics);
                        if note.is_some() {
                            cell.note = note;
                        }
                    }
                    Outcome::Skipped(why) => cell.skipped = Some(why),
                }
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    for t in &mut targets {
        t.finish()?;
    }

    let report = report::Report::new(&args, &plan, &targets, &chosen, cells);
    if let Some(path) = &args.svg {
        std::fs::write(path, svg::render(&report))
            .with_context(|| format!("--svg {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.json())?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}
