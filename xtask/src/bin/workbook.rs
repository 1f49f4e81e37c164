//! `cargo workbook`, the learner's command, in
//! the spirit of rustlings' CLI (`cargo workbook` is an alias in
//! .cargo/config.toml; it builds in seconds and needs no libtorch itself):
//!
//!     cargo workbook                  # the chapters and how far you are
//!     cargo workbook test 03          # run chapter 3's tests on your code, with a verdict
//!     cargo workbook test 03 2        # the same, with the second most telling failure in full
//!     cargo workbook hint 03          # the next hint, one at a time
//!     cargo workbook hint 03 sync_gradients 2
//!     cargo workbook watch 03         # run `test 03` again whenever you save
//!
//! Underneath it is `cargo test --test chapter_NN`, which stays the
//! documented way to check a chapter.

use std::num::NonZeroUsize;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::Parser;
use xtask::libtest_json::SuiteTally;
use xtask::workbook::{self, hints, verdict, Chapter};
use xtask::{test_executables, Context};

#[derive(Parser)]
#[command(
    name = "cargo workbook",
    bin_name = "cargo workbook",
    about = "Work through the ddp-workbook chapters",
    after_help = "Plain `cargo test --test chapter_NN` runs the same tests. The hints you have\n\
                  seen are remembered in target/workbook/ (`cargo clean` forgets them)."
)]
struct Cli {
    /// None: `list`.
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// The chapters, their exercises and state (what plain `cargo workbook` shows)
    List,
    /// Run chapter NN's tests on your exercise, with a verdict
    Test {
        /// The chapter: 3, 03, ch03 or chapter_03
        #[arg(value_name = "NN")]
        chapter: String,
        /// Show the K-th most telling failure in full
        #[arg(value_name = "K", default_value = "1")]
        shown: NonZeroUsize,
    },
    /// The next hint for chapter NN, or the next of function FN, or its hint K
    Hint {
        /// The chapter: 3, 03, ch03 or chapter_03
        #[arg(value_name = "NN")]
        chapter: String,
        /// One of the chapter's exercise functions
        #[arg(value_name = "FN")]
        function: Option<String>,
        /// Which of its hints: 1 (the idea), 2 (the API), 3 (near-code)
        #[arg(value_name = "K")]
        step: Option<usize>,
    },
    /// Run `test NN` again each time a file of the chapter changes
    Watch {
        /// The chapter: 3, 03, ch03 or chapter_03
        #[arg(value_name = "NN")]
        chapter: String,
    },
}

fn main() -> ExitCode {
    // A bad command line: clap says what is wrong and exits with status 2.
    let command = Cli::parse().command.unwrap_or(Command::List);
    let ctx = match Context::new() {
        Ok(ctx) => ctx,
        Err(error) => return fail(&format!("cannot create target/test-logs: {error}")),
    };
    let chapters = match workbook::chapters(&ctx.root) {
        Ok(chapters) => chapters,
        Err(error) => return fail(&format!("cannot read the chapters under src/: {error}")),
    };
    let chapter = |asked: &str| {
        workbook::find(&chapters, asked).ok_or_else(|| {
            let known: Vec<&str> = chapters.iter().map(|c| c.number.as_str()).collect();
            format!("there is no chapter {asked:?} with an exercise; the chapters are {}", known.join(", "))
        })
    };
    let result = match command {
        Command::List => list(&ctx, &chapters),
        Command::Test { chapter: asked, shown } => {
            chapter(&asked).and_then(|c| test(&ctx, c, shown.get()).map(|_| ()))
        }
        Command::Hint { chapter: asked, function, step } => {
            chapter(&asked).and_then(|c| hint(&ctx, c, function.as_deref(), step))
        }
        Command::Watch { chapter: asked } => chapter(&asked).and_then(|c| watch(&ctx, c)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => fail(&message),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("cargo workbook: {message}");
    ExitCode::from(2)
}

/// The chapters: untouched ones without running anything, the others by
/// running their tests.
fn list(ctx: &Context, chapters: &[Chapter]) -> Result<(), String> {
    println!("chapter  exercises                                   state");
    for chapter in chapters {
        let state = if chapter.untouched() {
            "not started".to_string()
        } else {
            match run_tests(ctx, chapter, false)? {
                Some((t, _)) if verdict::chapter_passes(&t) => {
                    format!("passing: all {} claims hold", verdict::claims_holding(&t).1)
                }
                Some((t, _)) => {
                    let (held, total) = verdict::claims_holding(&t);
                    format!("failing: {held} of {total} claims hold")
                }
                None => "does not compile (cargo workbook test shows why)".to_string(),
            }
        };
        println!("   {}    {:<42}  {state}", chapter.number, chapter.exercises.join(", "));
    }
    println!(
        "\nNext: `cargo workbook test NN` for a chapter's verdict, `cargo workbook hint NN` when stuck."
    );
    Ok(())
}

/// Builds and runs chapter `chapter`'s tests on the learner's code; `None`
/// when they do not compile (the errors are printed when `echo` is set).
fn run_tests(
    ctx: &Context,
    chapter: &Chapter,
    echo: bool,
) -> Result<Option<(SuiteTally, Vec<String>)>, String> {
    if !ctx.root.join(".cargo").join("libtorch.toml").is_file() {
        return Err("libtorch is not set up in this checkout: run scripts/setup.sh once (see README)".into());
    }
    let log_path = ctx.log(&format!("workbook-{}.log", chapter.test_target()));
    let mut log =
        std::fs::File::create(&log_path).map_err(|e| format!("cannot write {}: {e}", log_path.display()))?;
    let io = |e: std::io::Error| format!("cannot run cargo: {e}");
    let (built, outcome) =
        test_executables::build(ctx, &["--test", &chapter.test_target()], None, &mut log, false)
            .map_err(io)?;
    let Some(executable) = outcome.executables_in_run_order().into_iter().next().filter(|_| built.success())
    else {
        if echo {
            test_executables::print_errors(&outcome, 40);
            println!("(full log: {})", ctx.display(&log_path));
        }
        return Ok(None);
    };
    let (_, tally) = test_executables::run(ctx, &executable, &[], None, &mut log).map_err(io)?;
    Ok(Some((tally, outcome.warnings)))
}

/// `cargo workbook test NN [K]`: the verdict, with the `shown`-th most
/// telling failure in full, then what to do next. Returns whether every
/// claim holds.
fn test(ctx: &Context, chapter: &Chapter, shown: usize) -> Result<bool, String> {
    println!("running `cargo test --test {}` on your code ...", chapter.test_target());
    let Some((tally, warnings)) = run_tests(ctx, chapter, true)? else {
        println!("\nYour code does not compile yet: the first errors are above.");
        return Ok(false);
    };
    println!();
    verdict::describe(chapter, &tally, shown).iter().for_each(|line| println!("{line}"));
    let yours = verdict::warnings_in_chapter(chapter, &warnings);
    if !yours.is_empty() {
        println!("\nThe compiler has {} warning(s) about your code:\n", yours.len());
        yours.iter().for_each(|warning| println!("{}", warning.trim_end()));
    }
    let page =
        workbook::solution_page(&ctx.root, &chapter.number).map(|page| ctx.display(&page).into_owned());
    println!();
    verdict::next_step(chapter, &tally, page.as_deref()).iter().for_each(|line| println!("{line}"));
    Ok(verdict::chapter_passes(&tally))
}

/// `cargo workbook hint NN [FN [K]]`.
fn hint(ctx: &Context, chapter: &Chapter, function: Option<&str>, step: Option<usize>) -> Result<(), String> {
    let file = chapter.hints_file();
    let text =
        std::fs::read_to_string(&file).map_err(|e| format!("cannot read {}: {e}", ctx.display(&file)))?;
    let all = hints::parse(&text);
    let mut seen = hints::Seen::load(&ctx.root);
    let chosen = match (function, step) {
        (None, _) => {
            // The exercises still unwritten first, then the others.
            let written = chapter.exercises.iter().filter(|f| !chapter.unwritten.contains(f));
            let order: Vec<String> = chapter.unwritten.iter().chain(written).cloned().collect();
            hints::next(&all, &order, |f| seen.count(&chapter.number, f))
        }
        (Some(function), None) => {
            all.iter().find(|h| h.function == function && h.step == seen.count(&chapter.number, function) + 1)
        }
        (Some(function), Some(step)) => all.iter().find(|h| h.function == function && h.step == step),
    };
    let Some(hint) = chosen else {
        let functions: Vec<&str> = chapter.exercises.iter().map(String::as_str).collect();
        println!(
            "No further hint there: ask for one by name and step, e.g. `cargo workbook hint {} {} 1`",
            chapter.number, functions[0]
        );
        return Ok(());
    };
    let steps = all.iter().filter(|h| h.function == hint.function).count();
    println!(
        "chapter {}, `{}`: hint {} of {steps}\n\n{}\n",
        chapter.number, hint.function, hint.step, hint.text
    );
    seen.saw(&chapter.number, &hint.function, hint.step)
        .map_err(|e| format!("cannot record the hint: {e}"))?;
    if hint.step < steps {
        println!("(`cargo workbook hint {}` again for the next one)", chapter.number);
    }
    Ok(())
}

/// `cargo workbook watch NN`: test, then wait for a change in the chapter's
/// folder, and again, until Ctrl-C.
fn watch(ctx: &Context, chapter: &Chapter) -> Result<(), String> {
    let newest = || -> SystemTime {
        std::fs::read_dir(&chapter.folder)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.metadata().ok()?.modified().ok())
            .max()
            .unwrap_or(SystemTime::UNIX_EPOCH)
    };
    loop {
        let seen = newest();
        test(ctx, chapter, 1)?;
        println!("\nwatching {} for changes (Ctrl-C to stop) ...", ctx.display(&chapter.folder));
        while newest() == seen {
            std::thread::sleep(Duration::from_millis(500));
        }
        println!("\n{}\n", "-".repeat(72));
    }
}
