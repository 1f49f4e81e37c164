//! The training run when something is wrong: a checkpoint path that cannot
//! be written is refused before any step, two writers never share a
//! temporary file, a save killed after any of its steps loses nothing and
//! the next save removes what it left, a damaged checkpoint points at the
//! one before it, errors are one line of words, and the example's flags are
//! refused with exit status 2 and a message, never a panic.
//!
//! Run: `cargo test --test train_failures`

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use ddp_workbook::tch::{Device, Kind, Tensor};
use ddp_workbook::train::{self, checkpoint, Checkpoint, LoopPosition, SaveStep, TrainConfig};

/// A run small enough for a debug build (as in `tests/train.rs`).
fn small_run(checkpoint: Option<PathBuf>) -> TrainConfig {
    TrainConfig {
        batch_size: 4,
        steps: 2,
        warmup_steps: 1,
        train_sequences: 40,
        eval_sequences: 16,
        checkpoint,
        threads_per_rank: Some(1),
        ..TrainConfig::default()
    }
}

fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ddp-workbook-failures-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("cannot create a scratch folder");
    dir
}

#[test]
fn an_unwritable_checkpoint_path_is_refused_before_training() {
    let dir = scratch("unwritable");
    let cases = [
        (dir.join("no/such/folder/run.safetensors"), "does not exist"),
        (dir.clone(), "it is a folder"),
        (PathBuf::from("/proc/ddp-workbook.safetensors"), "a test write"),
    ];
    for (path, want) in cases {
        let error = small_run(Some(path.clone())).validate().expect_err("must be refused up front");
        let message = error.to_string();
        assert!(message.contains(want), "{}: {message}", path.display());
    }
    assert!(checkpoint::leftover_temporaries(&dir.join("run")).is_empty(), "the check left a file behind");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn every_write_has_its_own_temporary_file() {
    let path = PathBuf::from("run.safetensors");
    let (a, b) = (checkpoint::temporary_path(&path), checkpoint::temporary_path(&path));
    assert_ne!(a, b, "two writers of one path must never share a temporary file");
    assert!(a.to_string_lossy().contains(&std::process::id().to_string()), "{}", a.display());
}

/// A small checkpoint whose step and weights say which save wrote it.
fn numbered_checkpoint(step: i64) -> Checkpoint {
    let weights = Tensor::full([4], step as f64, (Kind::Float, Device::Cpu));
    let progress = LoopPosition { step, epoch: 0, position: 0 };
    Checkpoint { model: vec![("w".into(), weights)], optimizer: vec![], progress, settings: vec![] }
}

/// The names of the files in `dir`, sorted.
fn files_in(dir: &Path) -> Vec<String> {
    let entries = std::fs::read_dir(dir).expect("the scratch folder can be listed");
    let mut names: Vec<String> =
        entries.map(|entry| entry.expect("an entry").file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

/// Set in the copy of this test binary that saves and is killed: the step
/// after which it kills itself, and the checkpoint's path.
const KILL_AFTER: &str = "DDP_TEST_SAVE_KILLED_AFTER";
const KILL_PATH: &str = "DDP_TEST_SAVE_PATH";

#[test]
fn a_save_killed_after_any_step_loses_nothing_and_the_next_save_cleans_up() {
    let name = "a_save_killed_after_any_step_loses_nothing_and_the_next_save_cleans_up";
    if let Ok(kill_after) = std::env::var(KILL_AFTER) {
        // The copy: save number 3, killed (SIGKILL: nothing is cleaned up) right after `kill_after`.
        let path = PathBuf::from(std::env::var(KILL_PATH).expect("the test names the path"));
        let saved = checkpoint::save_step_by_step(&path, &numbered_checkpoint(3), &mut |done| {
            if format!("{done:?}") == kill_after {
                // SAFETY: kill(2) on this process; no memory is touched.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
        });
        panic!("the save ended ({saved:?}) without passing step {kill_after}");
    }
    let this_test = std::env::current_exe().expect("the test knows its path");
    for step in SaveStep::ALL {
        let dir = scratch(&format!("killed-after-{step:?}"));
        let path = dir.join("run.safetensors");
        checkpoint::save(&path, &numbered_checkpoint(1)).unwrap();
        checkpoint::save(&path, &numbered_checkpoint(2)).unwrap();
        let copy = Command::new(&this_test)
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(KILL_AFTER, format!("{step:?}"))
            .env(KILL_PATH, &path)
            .output()
            .expect("the test binary starts");
        let stderr = String::from_utf8_lossy(&copy.stderr);
        assert_eq!(
            copy.status.signal(),
            Some(libc::SIGKILL),
            "the save was not killed after {step:?}: {stderr}"
        );

        // What --resume reads: this save's checkpoint once it replaced the
        // old one, the one before it until then; never nothing, never half.
        let resumable = checkpoint::load(&path)
            .unwrap_or_else(|e| panic!("killed after {step:?}, nothing to resume from: {e}"))
            .progress
            .step;
        let replaced = matches!(step, SaveStep::Replaced | SaveStep::Finished);
        assert_eq!(
            resumable,
            if replaced { 3 } else { 2 },
            "killed after {step:?}: resumes from the wrong save"
        );
        let left = files_in(&dir);

        // The next save leaves the checkpoint and the one before it, nothing else.
        checkpoint::save(&path, &numbered_checkpoint(4)).unwrap();
        let files = files_in(&dir);
        assert_eq!(
            files,
            ["run.safetensors", "run.safetensors.prev"],
            "killed after {step:?}, which left {left:?}; one more save must leave exactly these two"
        );
        assert_eq!(checkpoint::load(&path).unwrap().progress.step, 4);
        let previous = checkpoint::load(&checkpoint::previous_path(&path)).unwrap().progress.step;
        assert_eq!(previous, resumable, "killed after {step:?}: .prev must be the checkpoint it replaced");
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn a_save_leaves_alone_the_temporary_file_of_a_save_still_running() {
    let dir = scratch("running-save");
    let path = dir.join("run.safetensors");
    // Another run's save in progress: its temporary file, locked while it writes.
    let running = dir.join("run.safetensors.999999-0.tmp");
    let held = std::fs::File::create(&running).unwrap();
    held.lock().expect("this file system has file locks");
    checkpoint::save(&path, &numbered_checkpoint(1)).unwrap();
    assert!(running.is_file(), "a save deleted the temporary file of a save still running");
    drop(held); // that save "dies": the next save removes its file
    checkpoint::save(&path, &numbered_checkpoint(2)).unwrap();
    assert_eq!(files_in(&dir), ["run.safetensors", "run.safetensors.prev"]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_damaged_checkpoint_points_at_the_previous_one_which_resumes() {
    let dir = scratch("previous");
    let path = dir.join("run.safetensors");
    let config = TrainConfig { checkpoint_every: 1, ..small_run(Some(path.clone())) };
    train::train(&config, &|_| {}).expect("the run trains");
    let previous = checkpoint::previous_path(&path);
    assert_eq!(checkpoint::load(&previous).expect("the previous checkpoint is whole").progress.step, 1);
    std::fs::write(&path, b"damaged").unwrap();
    let resume = TrainConfig { resume: true, ..config.clone() };
    let message = format!("{:#}", train::train(&resume, &|_| {}).expect_err("a damaged file cannot resume"));
    println!("{message}");
    assert!(message.contains(&format!("cp {} {}", previous.display(), path.display())), "{message}");
    assert_eq!(message.lines().count(), 1, "one line of cause, in words: {message}");
    let cause = message.split(" The file is damaged").next().unwrap_or_default();
    let named = cause.matches(&*path.to_string_lossy()).count();
    assert_eq!(named, 1, "the cause names the file {named} times, once is enough: {cause}");
    assert!(!message.contains("Internal torch error") && !message.contains("Buffer"), "{message}");
    std::fs::copy(&previous, &path).unwrap();
    let resumed =
        train::train(&TrainConfig { stop_after: None, ..resume }, &|_| {}).expect("resumes from it");
    assert_eq!(resumed[0].last_step, 2);
    std::fs::remove_dir_all(&dir).ok();
}

/// The `train` example, built (once per test run, so never stale) with the
/// features and profile of this test binary: the same build as the suite's.
fn example_binary() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let features: Vec<&str> = [
                ("solutions", cfg!(feature = "solutions")),
                ("mpi", cfg!(feature = "mpi")),
                ("nccl", cfg!(feature = "nccl")),
            ]
            .into_iter()
            .filter_map(|(name, on)| on.then_some(name))
            .collect();
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut build = Command::new(cargo);
            build.args(["build", "--example", "train", "--features", &features.join(",")]);
            // The suite's runner sets it for test binaries only; cargo tracks
            // it, and would rebuild every crate with it.
            build.env_remove("RUSTC_BOOTSTRAP");
            if !cfg!(debug_assertions) {
                build.arg("--release");
            }
            assert!(build.status().expect("cargo runs").success(), "cargo build --example train failed");
            let deps = std::env::current_exe().expect("the test knows its path");
            deps.parent().and_then(|d| d.parent()).expect("target/<profile>").join("examples/train")
        })
        .clone()
}

/// Runs the `train` example with `args` (and `env`); returns (exit status, stderr).
fn train_example(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let output =
        Command::new(example_binary()).args(args).envs(env.iter().copied()).output().expect("it runs");
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn running_out_of_memory_is_one_clear_error_that_says_what_to_lower() {
    // A data set of 10^11 sequences: every rank's first allocation fails at
    // once. Under `ulimit -v` so that no kernel setting lets it take memory.
    let example = example_binary();
    let script = format!(
        "ulimit -v 16000000; exec {} --train-sequences 100000000000 --batch-size 1000 --steps 1",
        example.display()
    );
    let output = Command::new("sh").args(["-c", &script]).output().expect("sh runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stderr}");
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("out of memory") && stderr.contains("lower --batch-size"), "{stderr}");
    // Every rank panics in libtorch's allocator; the error above reports the
    // first rank's, so a line per rank would only repeat it.
    assert_eq!(stderr.trim().lines().count(), 1, "the error alone, in one line: {stderr}");
    assert!(stderr.starts_with("error: training failed: out of memory"), "{stderr}");
}

#[test]
fn the_examples_bad_flags_and_variables_exit_2_with_a_message_not_a_panic() {
    // (flags, environment, what the message must say)
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 4] = [
        (&["--world-size", "0", "--global-batch-size", "32"], &[], "the world size"),
        (&["--global-batch-size", "18446744073709551615"], &[], "too large"),
        (&["--steps", "1"], &[("DDP_TIMEOUT_SECS", "abc")], "DDP_TIMEOUT_SECS"),
        (&["--weight-decay", "-1", "--steps", "1"], &[], "weight_decay must be"),
    ];
    for (args, env, want) in cases {
        let (status, stderr) = train_example(args, env);
        assert_eq!(status, Some(2), "{args:?} {env:?}: {stderr}");
        assert!(stderr.contains(want) && !stderr.contains("panicked"), "{args:?} {env:?}: {stderr}");
    }
}
