//! Draws the book's figures, as SVG, into
//! `chapters/figures/`, each from the code path it shows (the library's
//! planner, sampler, process groups), never by hand. docs/figures.md lists
//! them all.
//!
//! Run: cargo run --example figures                  (rewrite the figures that changed)
//!      cargo run --example figures -- --check       (compare, write nothing)
//!      cargo run --example figures -- --only ch01,ch05   (only the figures named so)
//!      cargo run --example figures -- --check --dir /tmp/copy
//!      cargo run --example figures -- --only ch05 --stdout   (the SVG on stdout: the notebooks show it)
//!
//! `--check` draws every figure in memory and fails naming each one that
//! differs from the committed file or is missing, and each SVG in the folder
//! that no figure draws; the suite's `figures` check runs it. Every figure
//! draws in well under a second: a figure from a timed run draws from the
//! data file its benchmark wrote and the repository commits, so drawing
//! stays deterministic and the check stays cheap.
//!
//! Adding figures: a module under `examples/figures/` with
//! `pub fn figures() -> Vec<Figure>`, and one line in `figure_modules!` below.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;

#[path = "figures/chart.rs"]
mod chart;
#[allow(dead_code)] // the tests' fixture: the ring figure intercepts send and recv only
#[path = "../tests/common/forwarding.rs"]
mod forwarding;
#[allow(dead_code)] // shared by every figure module, none of which uses every shape
#[path = "figures/svg.rs"]
mod svg;
#[path = "figures/timed_data.rs"]
mod timed_data;

/// One figure of the book: its file name under `chapters/figures/` and the
/// function that draws it, from the code path it shows.
pub struct Figure {
    pub file: &'static str,
    pub draw: fn() -> anyhow::Result<String>,
}

/// Declares each figure module (a file under examples/figures/) and lists
/// them, so that a module is added with one line.
macro_rules! figure_modules {
    ($($module:ident => $path:literal,)*) => {
        $(#[path = $path] mod $module;)*
        /// Every figure of every module, in the order of the list.
        fn all_figures() -> Vec<Figure> {
            let mut all = Vec::new();
            $(all.extend($module::figures());)*
            all
        }
    };
}

figure_modules! {
    ch01_ring => "figures/ch01_ring.rs",
    ch01_alpha_beta => "figures/ch01_alpha_beta.rs",
    ch01_broadcast => "figures/ch01_broadcast.rs",
    ch02_replicas => "figures/ch02_replicas.rs",
    ch03_average => "figures/ch03_average.rs",
    ch04_no_sync => "figures/ch04_no_sync.rs",
    ch05_buckets => "figures/ch05_buckets.rs",
    ch06_timeline => "figures/ch06_timeline.rs",
    ch07_shards => "figures/ch07_shards.rs",
    ch08_training => "figures/ch08_training.rs",
    ch09_ch10_diagrams => "figures/ch09_ch10_diagrams.rs",
    ch14_bytes_alive => "figures/ch14_bytes_alive.rs",
    ch99_sizes => "figures/ch99_sizes.rs",
}

/// What rewrites the figures, for the messages of `--check`.
const REWRITE: &str = "cargo run --example figures";

fn committed_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("chapters").join("figures")
}

/// Draws the figures whose file name starts with one of `only` (all of
/// them when it is empty); a figure that fails to draw is an error naming it.
fn draw_all(only: &[String]) -> anyhow::Result<Vec<(&'static str, String)>> {
    all_figures()
        .into_iter()
        .filter(|figure| {
            only.is_empty() || only.iter().any(|prefix| figure.file.starts_with(prefix.as_str()))
        })
        .map(|figure| Ok((figure.file, (figure.draw)().with_context(|| format!("drawing {}", figure.file))?)))
        .collect()
}

/// Compares the drawn figures with the files in `dir`: one line per problem,
/// `differs: PATH`, `missing: PATH` or (when every figure was drawn,
/// `all`) `not drawn by any figure: PATH`.
fn compare(drawn: &[(&'static str, String)], dir: &Path, all: bool) -> anyhow::Result<Vec<String>> {
    let mut problems = Vec::new();
    for (file, svg) in drawn {
        let path = dir.join(file);
        match std::fs::read_to_string(&path) {
            Ok(committed) if committed == *svg => {}
            Ok(_) => problems.push(format!("differs: {}", path.display())),
            Err(_) => problems.push(format!("missing: {}", path.display())),
        }
    }
    if !all {
        return Ok(problems);
    }
    let listing = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    let mut extra: Vec<String> = listing
        .filter_map(|entry| entry.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|name| name.ends_with(".svg") && !drawn.iter().any(|(file, _)| file == name))
        .collect();
    extra.sort();
    problems
        .extend(extra.iter().map(|name| format!("not drawn by any figure: {}", dir.join(name).display())));
    Ok(problems)
}

/// The command line: `[--check | --stdout] [--dir FOLDER] [--only PREFIX[,PREFIX...]]`.
/// A flag given twice is no error: the last `--dir` counts and each
/// `--only` adds its prefixes, so a command that appends a flag to a
/// command line that has it already still runs.
#[derive(Parser)]
#[command(
    about = "Draws the book's figures, as SVG, into chapters/figures/ (docs/figures.md lists them)",
    args_override_self = true
)]
struct Args {
    /// Draw every figure in memory and compare it with the folder's file,
    /// writing nothing; fail naming each one that differs or is missing
    #[arg(long)]
    check: bool,
    /// Print the SVGs on stdout and write nothing (a notebook shows them);
    /// it wins over --check
    #[arg(long)]
    stdout: bool,
    /// The folder of the figures
    #[arg(long, value_name = "FOLDER", default_value_os_t = committed_dir())]
    dir: PathBuf,
    /// Only the figures whose file name starts with one of these
    #[arg(long, value_name = "PREFIX", value_delimiter = ',')]
    only: Vec<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (drawn, dir) = (draw_all(&args.only)?, &args.dir);
    anyhow::ensure!(!drawn.is_empty(), "no figure's file name starts with {:?}", args.only);
    if args.stdout {
        // Only the pictures: a notebook shows this output as an image.
        drawn.iter().for_each(|(_, svg)| print!("{svg}"));
    } else if args.check {
        let problems = compare(&drawn, dir, args.only.is_empty())?;
        for problem in &problems {
            println!("{problem}");
        }
        if !problems.is_empty() {
            // An exit status, not an error: an error would add a backtrace
            // under RUST_BACKTRACE, and the lines above say everything.
            eprintln!(
                "{} problems with {} figures, listed above: run `{REWRITE}` to rewrite them, look at them, \
                 and commit them",
                problems.len(),
                drawn.len()
            );
            std::process::exit(1);
        }
        println!("{} figures match {}", drawn.len(), dir.display());
    } else {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for (file, svg) in &drawn {
            let path = dir.join(file);
            if std::fs::read_to_string(&path).is_ok_and(|committed| committed == *svg) {
                continue; // unchanged: leave the file alone
            }
            std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {}", path.display());
        }
        println!("{} figures in {}", drawn.len(), dir.display());
    }
    Ok(())
}
