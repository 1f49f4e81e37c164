//! The training run on 2 processes ends with the
//! same final checkpoint file, byte for byte, as the same run on 2 rank
//! threads (the in-process backend); killed with SIGKILL after a checkpoint
//! and resumed, it runs only the steps after that checkpoint and ends
//! bitwise where the uninterrupted run ends; its DDP's buckets are summed
//! in place in shared memory (`alloc_buffer`). Reaching the accuracy target
//! is the runner's `mpi` check: the full run of examples/train.rs under
//! scripts/launch.sh.

use std::path::PathBuf;

use ddp_workbook::train::{self, Event, TrainConfig};

use crate::harness::{launch, on_ranks};

const STEPS: usize = 16;

fn config(checkpoint: PathBuf, resume: bool) -> TrainConfig {
    TrainConfig {
        steps: STEPS,
        train_sequences: 512,
        warmup_steps: 4,
        log_every: STEPS,
        checkpoint: Some(checkpoint),
        checkpoint_every: 4,
        resume,
        threads_per_rank: Some(1),
        ..TrainConfig::default()
    }
}

/// What the ranks of each job are told, through their environment.
const CHECKPOINT: &str = "RESUME_TEST_CHECKPOINT";
const KILL_AT_STEP: &str = "RESUME_TEST_KILL_AT_STEP";
const RESUME: &str = "RESUME_TEST_RESUME";

/// One rank of one of the three jobs: train, writing checkpoints to the
/// file named by CHECKPOINT; with KILL_AT_STEP, rank 0 (the rank that sees
/// events) kills itself right after that step's checkpoint.
fn rank_of_a_job(pg: ddp_workbook::dist::Group) -> anyhow::Result<()> {
    let var = |name| std::env::var(name).ok();
    let checkpoint = PathBuf::from(var(CHECKPOINT).expect("the runner names the checkpoint"));
    let kill_at: Option<usize> = var(KILL_AT_STEP).map(|s| s.parse().expect("a step"));
    let config = config(checkpoint, var(RESUME).is_some());
    let rank = pg.rank();
    let outcome = train::train_as_process(pg, &config, &|event| {
        if let (Event::Checkpointed { step, .. }, Some(at)) = (event, kill_at) {
            if step == at && rank == 0 {
                let pid = std::process::id().to_string();
                _ = std::process::Command::new("kill").args(["-9", &pid]).status();
                std::thread::sleep(std::time::Duration::from_secs(60)); // the signal comes first
            }
        }
    })?;
    // What the test reads to tell a resume from a fresh start (which, the
    // run being deterministic, would end with the same bytes).
    let first = outcome.last_step + 1 - outcome.losses.len();
    println!("{}", ran_steps(rank, first, outcome.last_step));
    // DDP's buckets came from alloc_buffer: summed in place in shared memory.
    let in_place = ddp_workbook::dist::mpi::zero_copy_all_reduces();
    anyhow::ensure!(in_place > 0, "rank {rank}: no all-reduce went in place in shared memory");
    Ok(())
}

/// The line each rank prints when its run ends.
fn ran_steps(rank: usize, first: usize, last: usize) -> String {
    format!("rank {rank} ran steps {first} to {last}")
}

/// Panics unless both ranks of `job` say they ran steps `first` to `last`.
fn assert_ran_steps(job: &crate::harness::Job, what: &str, first: usize, last: usize) {
    for rank in 0..2 {
        let line = ran_steps(rank, first, last);
        assert!(job.output.contains(&line), "{what}: no line \"{line}\" in its output:\n{}", job.output);
    }
}

#[test]
fn the_run_on_2_processes_equals_the_in_process_run_and_resumes_after_a_kill() {
    let name = "training::the_run_on_2_processes_equals_the_in_process_run_and_resumes_after_a_kill";
    let dir = std::env::temp_dir().join(format!("ddp-mpi-resume-{}", std::process::id()));
    // Only the test's own process makes the folder: each rank of its jobs
    // runs this function too, and writes where CHECKPOINT says.
    if std::env::var_os(crate::harness::RANK_MARKER).is_none() {
        std::fs::create_dir_all(&dir).expect("a temporary folder");
    }
    let (whole, cut) = (dir.join("whole.safetensors"), dir.join("cut.safetensors"));
    let (whole_path, cut_path) = (whole.to_string_lossy().into_owned(), cut.to_string_lossy().into_owned());
    let Some(first) = launch(2, name, &[(CHECKPOINT, &whole_path)], rank_of_a_job) else { return };
    assert!(first.success, "the uninterrupted run failed:\n{}", first.output);
    assert_ran_steps(&first, "the uninterrupted run", 1, STEPS);

    // The same run on 2 rank threads of this process (the in-process
    // backend) ends with the same file: MPI changed nothing but the transport.
    let threads = dir.join("threads.safetensors");
    train::train(&config(threads.clone(), false), &|_| {}).expect("the in-process run trains");
    let (on_processes, on_threads) =
        (std::fs::read(&whole).expect("a checkpoint"), std::fs::read(&threads).expect("a checkpoint"));
    assert!(
        on_processes == on_threads,
        "the final checkpoint of the run on 2 MPI processes differs from the in-process run's ({} vs {} bytes)",
        on_processes.len(),
        on_threads.len()
    );

    let killed =
        launch(2, name, &[(CHECKPOINT, &cut_path), (KILL_AT_STEP, "8")], rank_of_a_job).expect("runner");
    assert!(
        !killed.success && killed.output.contains("signal 9"),
        "the run should have been killed:\n{}",
        killed.output
    );
    assert!(cut.exists(), "the killed run wrote no checkpoint before it died");
    let resumed = launch(2, name, &[(CHECKPOINT, &cut_path), (RESUME, "1")], rank_of_a_job).expect("runner");
    assert!(resumed.success, "the resumed run failed:\n{}", resumed.output);
    assert_ran_steps(&resumed, "the resumed run (killed after step 8's checkpoint)", 9, STEPS);
    let (a, b) = (
        std::fs::read(&whole).expect("the whole run's checkpoint"),
        std::fs::read(&cut).expect("the resumed run's checkpoint"),
    );
    assert!(
        a == b,
        "the resumed run's final checkpoint differs from the uninterrupted run's ({} vs {} bytes)",
        a.len(),
        b.len()
    );
    _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ranks_started_with_different_threads_fail_before_the_first_step() {
    // Each process parses its own flags: here rank 1 has 2 libtorch threads
    // and rank 0 has 1 (as different core counts would give them by
    // default). The job must stop before any step, naming the setting.
    let name = "training::ranks_started_with_different_threads_fail_before_the_first_step";
    on_ranks(2, name, |pg| {
        let rank = pg.rank();
        let config = TrainConfig {
            steps: 4,
            train_sequences: 64,
            warmup_steps: 1,
            threads_per_rank: Some(rank + 1),
            ..TrainConfig::default()
        };
        let stepped = std::sync::atomic::AtomicBool::new(false);
        let run = train::train_as_process(pg, &config, &|event| {
            if let Event::Stepped { .. } = event {
                stepped.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        });
        let Err(error) = run else {
            anyhow::bail!("rank {rank}: ranks with 1 and 2 threads trained to the end")
        };
        let message = format!("{error:#}");
        let want = "threads_per_rank is 1 on rank(s) 0, 2 on rank(s) 1";
        anyhow::ensure!(message.contains(want), "rank {rank}: no \"{want}\" in: {message}");
        anyhow::ensure!(!stepped.into_inner(), "rank {rank}: the run took a step before it failed");
        Ok(())
    });
}
