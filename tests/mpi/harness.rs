//! How a test runs on several processes. The test
//! binary starts itself under `scripts/launch.sh` (mpirun), filtered to the
//! one test, with a marker in the environment; in those copies the same test
//! function finds the marker and runs its body as one rank. Compiled into
//! `cargo test --features mpi --test mpi`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ddp_workbook::dist::{self, Group};

/// Set in the processes that a test starts: "run the body as a rank".
pub const RANK_MARKER: &str = "DDP_MPI_TEST_RANK";
/// Each rank prints it when its body returned; the test counts them.
const FINISHED: &str = "mpi-test-rank-finished";

/// How a job ended.
pub struct Job {
    pub success: bool,
    pub code: Option<i32>,
    /// Everything the ranks and mpirun printed, stdout then stderr.
    pub output: String,
    pub elapsed: Duration,
}

/// Runs `body` on `np` processes and returns how the job ended; inside the
/// job (a rank), runs `body` and returns `None`. `test` is the test's full
/// name (`module::function`), `env` extra variables for the ranks.
pub fn launch(
    np: usize,
    test: &str,
    env: &[(&str, &str)],
    body: impl FnOnce(Group) -> anyhow::Result<()>,
) -> Option<Job> {
    if std::env::var_os(RANK_MARKER).is_some() {
        dist::mpi::run(|pg| {
            let rank = pg.rank();
            body(pg)?;
            println!("{FINISHED} {rank}");
            Ok(())
        });
        return None;
    }
    Some(start(np, test, env))
}

/// [`launch`], and every rank must finish its body and the job exit 0.
pub fn on_ranks(np: usize, test: &str, body: impl FnOnce(Group) -> anyhow::Result<()>) {
    let Some(job) = launch(np, test, &[], body) else { return };
    let finished = job.output.matches(FINISHED).count();
    assert!(
        job.success && finished == np,
        "{test} on {np} processes: exit {:?}, {finished} of {np} ranks finished; output:\n{}",
        job.code,
        job.output
    );
}

/// One `#[test]` per `name: processes` line, each running `body` as the
/// ranks of a job of that many processes (`module` is the test's module).
/// (tests/torch_oracle.rs includes this file too, and makes no such tests.)
#[allow(unused_macros)]
macro_rules! tests_on_processes {
    ($module:literal, $body:expr; $($name:ident: $np:expr;)*) => {$(
        #[test]
        fn $name() {
            crate::harness::on_ranks($np, concat!($module, "::", stringify!($name)), $body);
        }
    )*};
}
#[allow(unused_imports)]
pub(crate) use tests_on_processes;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Starts the job and waits for it, at most `DDP_TIMEOUT_SECS` plus a minute.
/// One job at a time, whatever the test threads: the failure tests time
/// their jobs, and this machine has two cores for all the ranks.
fn start(np: usize, test: &str, env: &[(&str, &str)]) -> Job {
    let _turn = turn();
    let logs =
        std::env::temp_dir().join(format!("ddp-mpi-{}-{}", std::process::id(), test.replace("::", "-")));
    std::fs::create_dir_all(&logs).expect("a temporary folder");
    let (out, err) = (logs.join("stdout"), logs.join("stderr"));
    let mut command = job_command(np, test, env);
    command
        .stdout(std::fs::File::create(&out).expect("a log file"))
        .stderr(std::fs::File::create(&err).expect("a log file"));
    let timeout: u64 =
        env.iter().find(|(n, _)| *n == "DDP_TIMEOUT_SECS").map_or(20, |(_, v)| v.parse().unwrap());
    let limit = Duration::from_secs(timeout + 60);
    let started = Instant::now();
    let mut child = command.spawn().expect("bash runs scripts/launch.sh");
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for mpirun") {
            break status;
        }
        if started.elapsed() > limit {
            // mpirun passes SIGTERM on to its ranks; then make sure.
            _ = Command::new("kill").arg(child.id().to_string()).status();
            std::thread::sleep(Duration::from_secs(5));
            _ = child.kill();
            let output = read(&[out, err]);
            panic!("{test}: the mpirun job still ran after {limit:?}: a hang. Output:\n{output}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = read(&[out, err]);
    _ = std::fs::remove_dir_all(&logs);
    Job { success: status.success(), code: status.code(), output, elapsed: started.elapsed() }
}

/// Held while a job runs: one job at a time (see [`start`]).
pub fn turn() -> std::sync::MutexGuard<'static, ()> {
    static ONE_JOB_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE_JOB_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// The command that starts the job: scripts/launch.sh running this test
/// binary, filtered to `test`, as `np` ranks, with `env` (for a test that
/// starts and ends jobs itself; [`launch`] waits for one).
pub fn job_command(np: usize, test: &str, env: &[(&str, &str)]) -> Command {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = Command::new("bash");
    command
        .arg(repo().join("scripts/launch.sh"))
        .args(["-np", &np.to_string()])
        .arg(&exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(RANK_MARKER, "1")
        .env("DDP_TIMEOUT_SECS", "20")
        .env("DDP_DEBUG", "detail")
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    command
}

fn read(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| std::fs::read_to_string(p).unwrap_or_default()).collect::<Vec<_>>().join("")
}
