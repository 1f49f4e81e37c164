//! The suite's checks, and which of them a command
//! line runs: `cargo xtask test [--only A,B] [--skip C]` (cli.rs reads it).
//! A check left out by `--only` or `--skip` is still named, so that the
//! summary counts it as skipped: a run of one part never reads like a run
//! of everything. Unit tests: xtask/tests/selection.rs (`cargo test -p xtask`).

use crate::report::Report;
use crate::{
    figures_check, files_check, history_check, layering_check, stubs_check, teeth_check, test_checks,
    tool_checks, workbook, Context,
};

/// One check of the suite: its name (on the command line and in the
/// report), what it proves (for `--help`), whether it builds or runs the
/// crate and so needs libtorch, and the code that runs it. The one place
/// a check is named.
pub struct Check {
    pub name: &'static str,
    pub what: &'static str,
    pub needs_libtorch: bool,
    pub run: fn(&Context, &mut Report),
}

/// Every check, in the order the suite runs them.
pub static CHECKS: &[Check] = &[
    Check {
        name: "fmt",
        what: "cargo fmt --all --check",
        needs_libtorch: false,
        run: tool_checks::fmt,
    },
    Check {
        name: "book",
        what: "mdbook build exits 0 and logs no ERROR or WARN",
        needs_libtorch: false,
        run: tool_checks::book,
    },
    Check {
        name: "includes",
        what: "every {{#include}} of the book names an existing file, anchor and lines",
        needs_libtorch: false,
        run: tool_checks::includes,
    },
    Check {
        name: "browser",
        what: "the book in headless Chromium: every page loads, every image renders, every link and #anchor resolves, no script error (and the checker catches planted ones); saves the README's screenshots",
        needs_libtorch: false,
        run: tool_checks::browser,
    },
    Check {
        name: "files",
        what: "every repository path the docs and code mention exists; nothing points outside the repository",
        needs_libtorch: false,
        run: files_check::files,
    },
    Check {
        name: "history",
        what: "every commit's subject line since the rule began fits 72 characters",
        needs_libtorch: false,
        run: history_check::history,
    },
    Check {
        name: "layering",
        what: "the imports of src/ and examples/ keep the layers of docs/architecture.md: no chapter in the library, the training run or the examples; no two files of src/, examples/ or xtask/src/ use each other",
        needs_libtorch: false,
        run: layering_check::layering,
    },
    Check {
        name: "stubs",
        what: "every solution pub fn has its exercise stub, with the same doc comment and signature, whose body is only todo!(\"exercise chNN: NAME ...\")",
        needs_libtorch: false,
        run: stubs_check::stubs,
    },
    Check {
        name: "hints",
        what: "each exercise has exactly three non-empty graded hints in its hints.md, and its chapter page shows every one but never the answer, which is on the chapter's own -solution.md page",
        needs_libtorch: false,
        run: workbook::hints::suite_check,
    },
    Check {
        name: "runner",
        what: "cargo test -p xtask: the runner's and the workbook command's own tests (counted per test)",
        needs_libtorch: false,
        run: test_checks::runner,
    },
    Check {
        name: "solutions",
        what: "cargo test --features solutions,mpi,nccl: every test and doc test passes (counted per test; the GPU tests run when a GPU is present, else they are skipped with their reason)",
        needs_libtorch: true,
        run: test_checks::solutions,
    },
    Check {
        name: "figures",
        what: "cargo run --example figures -- --check: every figure in chapters/figures/ is what its code draws now",
        needs_libtorch: true,
        run: figures_check::figures,
    },
    Check {
        name: "teeth",
        what: "on the untouched stubs, every test of tests/chapter_NN.rs fails naming `exercise chNN:`, except the controls (tests in a `mod controls`), which pass, and each chapter's tests are the same with and without the solutions feature (one check per chapter)",
        needs_libtorch: true,
        run: teeth_check::teeth,
    },
    Check {
        name: "notebooks",
        what: "every notebook runs in the Rust kernel (counted per notebook), is committed clean, and the runner's own tests pass",
        needs_libtorch: true,
        run: tool_checks::notebooks,
    },
    Check {
        name: "clippy",
        what: "cargo clippy --all-targets --features solutions,mpi,nccl -- -D warnings, and the same for xtask",
        needs_libtorch: true,
        run: tool_checks::clippy,
    },
    Check {
        name: "train",
        what: "cargo run --release --features mpi,nccl --example train reaches its accuracy target",
        needs_libtorch: true,
        run: tool_checks::train,
    },
    Check {
        name: "mpi",
        what: "the same run as 2 processes: scripts/launch.sh -np 2 target/release/examples/train --backend mpi",
        needs_libtorch: true,
        run: tool_checks::train_mpi,
    },
    Check {
        name: "multinode",
        what: "cargo test --features solutions,mpi,nccl --test multinode: 2 nodes x 2 ranks made here by scripts/nodes.sh (training, a killed remote rank, a downed link, resume, --max-restarts; counted per test; skipped with the reason where nodes cannot be made)",
        needs_libtorch: true,
        run: tool_checks::multinode,
    },
];

/// The check called `name`, if there is one.
pub fn check_named(name: &str) -> Option<&'static Check> {
    CHECKS.iter().find(|check| check.name == name)
}

/// The checks to run, in suite order, and those left out with the reason.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Selection {
    pub run: Vec<&'static str>,
    pub left_out: Vec<(&'static str, &'static str)>,
}

/// Which checks `cargo xtask test --only ONLY --skip SKIP` runs: all but
/// those in `skip`, and when `only` names any, only those; in suite order
/// whatever the order of the command line.
pub fn select(only: &[String], skip: &[String]) -> Selection {
    let mut selection = Selection::default();
    for Check { name, .. } in CHECKS {
        if skip.iter().any(|skipped| skipped == name) {
            selection.left_out.push((name, "left out with --skip"));
        } else if !only.is_empty() && !only.iter().any(|chosen| chosen == name) {
            selection.left_out.push((name, "not named by --only"));
        } else {
            selection.run.push(name);
        }
    }
    selection
}
