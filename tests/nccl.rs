//! The NCCL backend. The tests in this file need no GPU
//! (NCCL's library, its unique id, the errors a machine without a GPU
//! gives, and the GPU tests' DDP step on CPU ranks); they run everywhere,
//! CI included. On a machine with GPUs, the two
//! that check what a machine without one says run in a copy of this binary
//! that sees no GPU (`CUDA_VISIBLE_DEVICES` empty), so they still check it.
//!
//! The tests under `tests/nccl/` need a GPU. They are ignored, with the
//! reason, so that a machine without one reports them as skipped; the
//! suite's runner includes them where it finds a GPU. Run them by hand with
//!   cargo test --features nccl --test nccl -- --include-ignored
//! Asked for without a GPU, each fails and says so. They use every GPU the
//! machine has, one rank per GPU. With one GPU, a world of one: every call
//! runs and is checked, but a reduction over one rank keeps its value, so
//! the five operations, and averaging across ranks, are told apart only with
//! two or more (each test's ignore reason says what it checks with one).

use std::process::Command;

use ddp_workbook::dist::nccl::{self, UniqueId};
use ddp_workbook::dist::{spawn, Group};
use ddp_workbook::tch::Device;

#[path = "nccl/collectives.rs"]
mod collectives;
#[path = "nccl/failures.rs"]
mod failures;
#[path = "nccl/one_step.rs"]
mod one_step;
#[path = "nccl/training.rs"]
mod training;

/// Set in the copy of this binary that runs with the GPUs hidden.
const GPUS_HIDDEN: &str = "DDP_NCCL_TEST_GPUS_HIDDEN";
/// The copy prints it when the test's body has finished; the parent looks
/// for it, so a filter that matched no test cannot pass.
const FINISHED: &str = "nccl-test-finished-with-no-gpu";

/// Runs `body` where NCCL finds no GPU. On a machine without one, here; on
/// a machine with GPUs, in a copy of this test binary, filtered to `test`
/// (the test's full name), that sees none. Either way the body runs.
fn with_no_gpu(test: &str, body: impl FnOnce()) {
    if std::env::var_os(GPUS_HIDDEN).is_some() || nccl::available().is_err() {
        body();
        return println!("{FINISHED}");
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let copy = Command::new(exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(GPUS_HIDDEN, "1")
        .env("CUDA_VISIBLE_DEVICES", "") // no GPU visible to CUDA, hence to NCCL
        .output()
        .expect("the test binary starts a copy of itself");
    let output = String::from_utf8_lossy(&copy.stdout).into_owned() + &String::from_utf8_lossy(&copy.stderr);
    assert!(
        copy.status.success() && output.contains(FINISHED),
        "{test}, run with the GPUs hidden: exit {:?}; output:\n{output}",
        copy.status.code()
    );
}

#[test]
fn nccl_loads_from_the_wheel_and_says_its_version() {
    let version = nccl::version().expect("scripts/setup.sh links .nccl/libnccl.so");
    // The wheel's NCCL is the one libtorch itself was built with, and it
    // takes the communicator config this backend fills in.
    assert_eq!(version, "2.28.9", "pip's torch 2.11.0 installs NCCL 2.28.9");
}

#[test]
fn unique_ids_are_made_without_a_gpu_and_differ() {
    let (a, b) = (UniqueId::new().unwrap(), UniqueId::new().unwrap());
    assert_ne!(a, b, "every communicator needs a fresh id");
    assert!(a.0.iter().any(|&byte| byte != 0));
}

/// Without a GPU every way in fails at once, in words, and never panics.
#[test]
fn without_a_gpu_every_entry_point_says_why() {
    with_no_gpu("without_a_gpu_every_entry_point_says_why", || {
        let why = nccl::available().expect_err("CUDA_VISIBLE_DEVICES was empty, yet NCCL found a GPU");
        assert!(why.contains("CUDA") || why.contains("GPU"), "{why}");
        let ran = std::sync::atomic::AtomicBool::new(false);
        let spawned = nccl::spawn_on_gpus(1, |_| {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        });
        assert_eq!(spawned.unwrap_err(), why);
        assert!(!ran.into_inner(), "no rank may start without a GPU");
        let joined = nccl::join(0, 1, 0, &UniqueId::new().unwrap()).err().unwrap().to_string();
        assert!(joined.contains(&why), "{joined}");
    });
}

/// The MPI path without MPI: rank 0 makes the id and broadcasts it over a
/// CPU group, then every rank joins; without a GPU every rank gets the same
/// clear error instead of a hang.
#[test]
fn bootstrap_over_a_cpu_group_fails_cleanly_without_a_gpu() {
    with_no_gpu("bootstrap_over_a_cpu_group_fails_cleanly_without_a_gpu", || {
        let errors =
            spawn(2, |pg: Group| Ok(nccl::bootstrap(pg.as_ref(), pg.rank()).err().unwrap().to_string()));
        for error in errors.unwrap() {
            assert!(error.contains("joining NCCL"), "{error}");
        }
    });
}

/// The body of the GPU DDP tests (`one_step.rs`: the finished wrapper's
/// step, then the replicas against one process on the global batch), on
/// ranks that are threads of this process with CPU tensors: the same code
/// as `ddp_on_cuda_matches_one_process_on_the_global_batch` but for the
/// device and the backend, so that a mistake in it fails here, on every
/// machine, and not only where a GPU runs it.
#[test]
fn the_gpu_tests_ddp_step_on_cpu_ranks_matches_one_process() {
    for world in [1, 2, 3] {
        let weights = spawn(world, |pg: Group| one_step::ddp_step_on(pg, Device::Cpu)).unwrap();
        one_step::assert_replicas_match_one_process(&weights);
    }
}

/// The GPU tests take turns: two communicators spinning on the same GPUs
/// at once can deadlock each other (NCCL's documentation warns of it).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// How many GPUs there are, while this test holds them for itself. Panics,
/// saying so, where there is none: a GPU test must not pass by doing nothing.
fn gpus() -> (usize, std::sync::MutexGuard<'static, ()>) {
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let gpus = nccl::available().unwrap_or_else(|why| {
        panic!(
            "this test needs a GPU, and this machine has none usable: {why}. Run the GPU tests \
             where there is one: cargo test --features nccl --test nccl -- --include-ignored"
        )
    });
    (gpus, turn)
}

/// Says, in the test's output, what a world of one GPU cannot check.
fn with_one_gpu(world: usize, unchecked: &str) {
    if world == 1 {
        eprintln!("one GPU, so a world of one: {unchecked} is checked only with two or more GPUs");
    }
}
