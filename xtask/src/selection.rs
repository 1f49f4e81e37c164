//! xtask/src/selection.rs: the suite's checks, and which of them a command
//! line runs: `cargo xtask test [--only A,B] [--skip C]`. A check left out
//! by `--only` or `--skip` is still named, so that the summary counts it as
//! skipped: a run of one part never reads like a run of everything.
//! Unit tests: xtask/tests/selection.rs (`cargo test -p xtask`).

/// Every check, in the order the suite runs them, with what each one does.
pub const CHECKS: &[(&str, &str)] = &[
    ("fmt", "cargo fmt --all --check"),
    ("book", "mdbook build exits 0 and logs no ERROR"),
    ("includes", "every {{#include}} of the book names an existing file, anchor and lines"),
    ("files", "every repository path the docs and code mention exists; nothing points outside the repository"),
    ("layering", "the imports of src/ and examples/ keep the layers of docs/architecture.md: no chapter in the library, the training run or the examples"),
    ("stubs", "every solution pub fn has its exercise stub, with the same doc comment and signature, whose body is only todo!(\"exercise chNN: NAME ...\")"),
    ("hints", "each exercise has exactly three non-empty graded hints in its hints.md, and its chapter page shows every one"),
    ("runner", "cargo test -p xtask: the runner's and the workbook command's own tests (counted per test)"),
    ("solutions", "cargo test --features solutions,mpi,nccl: every test and doc test passes (counted per test; the GPU tests run when a GPU is present, else they are skipped with their reason)"),
    ("teeth", "on the untouched stubs, every test of tests/chapter_NN.rs fails naming `exercise chNN:`, except the controls (tests in a `mod controls`), which pass (one check per chapter)"),
    ("notebooks", "every notebook runs in the Rust kernel (counted per notebook), is committed clean, and the runner's own tests pass"),
    ("clippy", "cargo clippy --all-targets --features solutions,mpi,nccl -- -D warnings, and the same for xtask"),
    ("train", "cargo run --release --features mpi,nccl --example train reaches its accuracy target"),
    ("mpi", "the same run as 2 processes: scripts/launch.sh -np 2 target/release/examples/train --backend mpi"),
];

/// The checks that build or run the crate, and so need libtorch.
pub const NEED_LIBTORCH: &[&str] = &["solutions", "teeth", "notebooks", "clippy", "train", "mpi"];

/// What a command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    Help,
    Run(Selection),
}

/// The checks to run, in suite order, and those left out with the reason.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Selection {
    pub run: Vec<&'static str>,
    pub left_out: Vec<(&'static str, &'static str)>,
}

/// Reads `test [--only A,B] [--skip C]` (the words after `cargo xtask`).
pub fn parse_args(args: &[String]) -> Result<Request, String> {
    let mut args = args.iter();
    match args.next().map(String::as_str) {
        Some("test") => {}
        Some("-h" | "--help" | "help") | None => return Ok(Request::Help),
        Some(other) => return Err(format!("unknown command `{other}` (the only one is `test`)")),
    }
    let (mut only, mut skip) = (Vec::new(), Vec::new());
    while let Some(arg) = args.next() {
        let (flag, inline_value) = match arg.split_once('=') {
            Some((flag, value)) => (flag, Some(value.to_string())),
            None => (arg.as_str(), None),
        };
        let list = match flag {
            "-h" | "--help" => return Ok(Request::Help),
            "--only" => &mut only,
            "--skip" => &mut skip,
            _ => return Err(format!("unknown argument `{arg}`")),
        };
        let value =
            inline_value.or_else(|| args.next().cloned()).ok_or(format!("{flag} needs a list of checks"))?;
        for name in value.split(',').map(str::trim).filter(|name| !name.is_empty()) {
            let known = CHECKS.iter().find(|(check, _)| *check == name);
            let (check, _) =
                known.ok_or(format!("unknown check `{name}` (cargo xtask --help lists them)"))?;
            list.push(*check);
        }
    }
    let mut selection = Selection::default();
    for (name, _) in CHECKS {
        if skip.contains(name) {
            selection.left_out.push((name, "left out with --skip"));
        } else if !only.is_empty() && !only.contains(name) {
            selection.left_out.push((name, "not named by --only"));
        } else {
            selection.run.push(name);
        }
    }
    Ok(Request::Run(selection))
}

/// `cargo xtask --help`.
pub fn help() -> String {
    let mut text = String::from(
        "cargo xtask test: the ddp-workbook test suite (what scripts/test.sh and CI run)\n\n\
         Usage: cargo xtask test [--only CHECK[,CHECK...]] [--skip CHECK[,CHECK...]]\n\n\
         Checks, in the order they run (each runs even when an earlier one failed):\n",
    );
    for (name, what) in CHECKS {
        text.push_str(&format!("  {name:<10} {what}\n"));
    }
    text.push_str(
        "\nThe last line is the summary CI reads: N passed, N failed[, N skipped]; a check\n\
         left out with --only or --skip counts as skipped.\n\
         With CI set, hung steps are stopped (30 min for solutions and notebooks, 10 min\n\
         per chapter and for train); without it, a chapter whose exercise.rs you have\n\
         edited is skipped by teeth. Full logs: target/test-logs/.\n",
    );
    text
}
