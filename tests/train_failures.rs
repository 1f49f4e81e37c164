//! The training run when something is wrong: a checkpoint path that cannot
//! be written is refused before any step, two writers never share a
//! temporary file, a damaged checkpoint points at the one before it, errors
//! are one line of words, and the example's flags are refused with exit
//! status 2 and a message, never a panic.
//!
//! Run: `cargo test --test train_failures`

use std::path::PathBuf;
use std::process::Command;

use ddp_workbook::train::{self, checkpoint, TrainConfig};

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
    assert!(!message.contains("Internal torch error") && !message.contains("Buffer"), "{message}");
    std::fs::copy(&previous, &path).unwrap();
    let resumed =
        train::train(&TrainConfig { stop_after: None, ..resume }, &|_| {}).expect("resumes from it");
    assert_eq!(resumed[0].last_step, 2);
    std::fs::remove_dir_all(&dir).ok();
}

/// Runs the `train` example with `args` (and `env`), which `cargo test`
/// builds next to the test binaries; returns (exit status, stderr).
fn train_example(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let deps = std::env::current_exe().expect("the test knows its path");
    let example = deps.parent().and_then(|d| d.parent()).expect("target/<profile>").join("examples/train");
    if !example.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let built = Command::new(cargo).args(["build", "--example", "train"]).status().expect("cargo runs");
        assert!(built.success(), "cargo build --example train failed");
    }
    let output = Command::new(example).args(args).envs(env.iter().copied()).output().expect("it runs");
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn running_out_of_memory_is_one_clear_error_that_says_what_to_lower() {
    // A data set of 10^11 sequences: every rank's first allocation fails at
    // once. Under `ulimit -v` so that no kernel setting lets it take memory.
    let deps = std::env::current_exe().expect("the test knows its path");
    train_example(&["--help"], &[]); // builds the example if needed
    let example = deps.parent().and_then(|d| d.parent()).expect("target/<profile>").join("examples/train");
    let script = format!(
        "ulimit -v 16000000; exec {} --train-sequences 100000000000 --batch-size 1000 --steps 1",
        example.display()
    );
    let output = Command::new("sh").args(["-c", &script]).output().expect("sh runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stderr}");
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("out of memory") && stderr.contains("lower --batch-size"), "{stderr}");
    assert!(
        !stderr.contains("frame #") && stderr.lines().count() <= 3,
        "one line per rank, then the error: {stderr}"
    );
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
