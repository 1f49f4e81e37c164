//! The command line of `cargo xtask`, read by clap:
//! one enum of subcommands, `test` (the suite: which of the checks of
//! selection.rs run) and `waits` (the learner's waits, waits.rs). Unit
//! tests: xtask/tests/selection.rs.

use std::num::NonZeroUsize;
use std::path::PathBuf;

use clap::builder::PossibleValuesParser;
use clap::{Args, Parser, Subcommand};

use crate::selection::CHECKS;

#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "The ddp-workbook test suite (what scripts/test.sh and CI run), and the learner's waits",
    after_help = checks_table()
)]
pub struct Cli {
    /// None: print the help, which lists the checks.
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the suite's checks, in order, each even when an earlier one failed
    #[command(after_help = checks_table())]
    Test {
        /// Run only these checks (the others count as skipped)
        #[arg(long, value_name = "CHECK,...", value_delimiter = ',', value_parser = check_names(), hide_possible_values = true)]
        only: Vec<String>,
        /// Leave these checks out (they count as skipped)
        #[arg(long, value_name = "CHECK,...", value_delimiter = ',', value_parser = check_names(), hide_possible_values = true)]
        skip: Vec<String>,
    },
    /// Measure the learner's waits (an exercise's inner loop, a notebook's
    /// first output) and write them to docs/waits.md
    Waits(WaitsOptions),
}

/// `cargo xtask waits`'s flags.
#[derive(Debug, Args)]
pub struct WaitsOptions {
    /// Also time a kernel with no prebuilt crate (minutes)
    #[arg(long)]
    pub cold: bool,
    /// How many times to time the inner loop
    #[arg(long, value_name = "N", default_value = "3")]
    pub runs: NonZeroUsize,
    /// A log of `bash .ci/run`: also the README's two commands, from it
    #[arg(long, value_name = "FILE")]
    pub ci_log: Option<PathBuf>,
}

/// The checks' names: a name not among them is an error that lists them.
fn check_names() -> PossibleValuesParser {
    PossibleValuesParser::new(CHECKS.iter().map(|check| check.name))
}

/// Every check with what it proves, and what the run's end says.
fn checks_table() -> String {
    let mut text =
        String::from("Checks, in the order they run (each runs even when an earlier one failed):\n");
    for check in CHECKS {
        text.push_str(&format!("  {:<10} {}\n", check.name, check.what));
    }
    text.push_str(
        "\nThe last line is the summary CI reads: N passed, N failed[, N skipped]; a check\n\
         left out with --only or --skip counts as skipped. After a whole run, every skip\n\
         must be one tests/expected_skips.toml allows here, and the run must count at\n\
         least its `tests`.\n\
         With CI set, hung steps are stopped (30 min for solutions and notebooks, 10 min\n\
         per chapter and for train); without it, a chapter whose exercise.rs you have\n\
         edited is skipped by teeth. Full logs: target/test-logs/.",
    );
    text
}
