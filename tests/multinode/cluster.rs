//! The nodes a test runs on (scripts/nodes.sh,
//! cluster `test`: network namespaces, so root) and the jobs it starts on
//! them through scripts/launch.sh. One cluster at a time on this machine:
//! a lock file serialises the tests of this binary and of any other run of
//! the suite; the cluster comes down when the test ends, even by a panic, and
//! a leftover of a killed run is removed by the next `up`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

pub const NAME: &str = "test";
/// Where each node sees its own disk (scripts/nodes.sh: a folder per node).
pub const LOCAL_DISK: &str = "/run/ddpwb/test/local";

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `scripts/nodes.sh ARGS --name test`-style commands; panics with the
/// script's words when it fails.
pub fn nodes_sh(args: &[&str]) -> String {
    let (command, rest) = args.split_first().expect("a command");
    let output = Command::new("bash")
        .arg(repo().join("scripts/nodes.sh"))
        .args([command, "--name", NAME])
        .args(rest)
        .output()
        .expect("bash runs scripts/nodes.sh");
    let text =
        String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "scripts/nodes.sh {}: {text}", args.join(" "));
    text
}

/// The training example, built once (release, the suite's features), as
/// the `train` and `mpi` checks build it, into the build folder of this test
/// binary: with CARGO_TARGET_DIR set, `target/` may hold an old one.
fn built_train_example() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let binary = std::env::current_exe().expect("the path of this test binary");
        let target = binary.ancestors().nth(3).expect("the test binary in TARGET/PROFILE/deps/");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--release", "--features", "mpi,nccl", "--example", "train", "--target-dir"])
            .arg(target)
            .current_dir(repo())
            .env_remove("RUSTC_BOOTSTRAP") // the runner sets it for test binaries; cargo would rebuild all
            .status()
            .expect("cargo runs");
        assert!(status.success(), "cargo build --release --features mpi,nccl --example train failed");
        target.join("release/examples/train")
    })
}

/// A cluster of `nodes` nodes with `slots` slots each, up while it lives.
pub struct Cluster {
    /// The training example, copied for this cluster: a build elsewhere in
    /// the checkout cannot replace it under a running job.
    pub train: PathBuf,
    _lock: File,
    _turn: MutexGuard<'static, ()>,
}

impl Cluster {
    pub fn up(nodes: usize, slots: usize) -> Cluster {
        static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
        let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let program = built_train_example();
        std::fs::create_dir_all("/run/ddpwb").expect("/run/ddpwb can be made (root)");
        let lock = File::create("/run/ddpwb/test.lock").expect("the cluster's lock file");
        if lock.try_lock().is_err() {
            // Another run of these tests (another checkout too) has the nodes: wait, saying why.
            eprintln!("another run of tests/multinode.rs holds /run/ddpwb/test.lock: waiting for it");
            lock.lock().expect("the cluster's lock");
        }
        nodes_sh(&["up", "--nodes", &nodes.to_string(), "--slots", &slots.to_string()]);
        let train = PathBuf::from(format!("/run/ddpwb/{NAME}/train"));
        std::fs::copy(program, &train).expect("a copy of the training example");
        Cluster { train, _lock: lock, _turn: turn }
    }

    pub fn hostfile(&self) -> String {
        format!("/run/ddpwb/{NAME}/hosts")
    }

    /// Node `node`'s disk, as this test (outside the nodes) sees it.
    pub fn disk(&self, node: usize) -> PathBuf {
        PathBuf::from(format!("/run/ddpwb/{NAME}/disks/node{node}"))
    }

    /// The processes on `node` (1, 2, ...), as (pid, command name).
    pub fn processes(&self, node: usize) -> Vec<(u32, String)> {
        let listed = nodes_sh(&["pids", &format!("node{node}")]);
        let pid_and_name = |line: &str| {
            let (pid, name) = line.split_once(' ')?;
            Some((pid.parse().ok()?, name.to_string()))
        };
        listed.lines().filter_map(pid_and_name).collect()
    }

    /// The process of MPI rank `rank` on `node`, if it runs there.
    pub fn rank_pid(&self, node: usize, rank: usize) -> Option<u32> {
        let wanted = format!("OMPI_COMM_WORLD_RANK={rank}");
        self.processes(node).into_iter().map(|(pid, _)| pid).find(|pid| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            environ.split(|&b| b == 0).any(|entry| entry == wanted.as_bytes())
        })
    }

    /// Bytes that node `node` received over its link so far.
    pub fn received_bytes(&self, node: usize) -> u64 {
        let path = "/sys/class/net/eth0/statistics/rx_bytes";
        nodes_sh(&["exec", &format!("node{node}"), "cat", path]).trim().parse().expect("a byte count")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ =
            Command::new("bash").arg(repo().join("scripts/nodes.sh")).args(["down", "--name", NAME]).status();
    }
}

/// A job started by scripts/launch.sh; its stdout and stderr go to one log.
pub struct Job {
    child: Child,
    log: PathBuf,
    started: Instant,
}

/// How a job ended.
pub struct Ended {
    pub success: bool,
    pub output: String,
    pub elapsed: Duration,
}

impl Job {
    /// `scripts/launch.sh ARGS`, with the workbook's deadline `timeout_secs`.
    pub fn start(args: &[String], timeout_secs: u64) -> Job {
        static JOBS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let number = JOBS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = std::env::temp_dir().join(format!("ddpwb-multinode-{}-{number}.log", std::process::id()));
        let file = File::create(&log).expect("a log file");
        let child = Command::new("bash")
            .arg(repo().join("scripts/launch.sh"))
            .args(args)
            .current_dir(repo())
            .env("DDP_TIMEOUT_SECS", timeout_secs.to_string())
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("the log file"))
            .stderr(file)
            .spawn()
            .expect("bash runs scripts/launch.sh");
        Job { child, log, started: Instant::now() }
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the output contains `words` (true), or the job ended or
    /// `limit` passed first (false).
    pub fn wait_for(&mut self, words: &str, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if self.output().contains(words) {
                return true;
            }
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return self.output().contains(words);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Waits for the job to end, at most `limit` from its start: past that it
    /// is a hang, and the test fails with the output so far.
    pub fn finish(mut self, limit: Duration) -> Ended {
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("waiting for scripts/launch.sh") {
                break status;
            }
            if self.started.elapsed() > limit {
                // launch.sh passes SIGTERM on to mpirun; then make sure.
                _ = Command::new("kill").arg(self.child.id().to_string()).status();
                std::thread::sleep(Duration::from_secs(10));
                _ = self.child.kill();
                let output = self.output();
                _ = std::fs::remove_file(&self.log);
                panic!("the job still ran after {limit:?}: a hang. Output:\n{output}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let ended =
            Ended { success: status.success(), output: self.output(), elapsed: self.started.elapsed() };
        _ = std::fs::remove_file(&self.log);
        ended
    }
}

/// The arguments of scripts/launch.sh for `ranks` ranks of the training
/// example on the cluster, then the example's own arguments.
pub fn on_cluster(cluster: &Cluster, ranks: usize, train_args: &[&str]) -> Vec<String> {
    let mut args = vec!["-np".to_string(), ranks.to_string(), "--hostfile".into(), cluster.hostfile()];
    args.push(cluster.train.display().to_string());
    args.extend(train_args.iter().map(|s| s.to_string()));
    args
}

/// The fingerprint of the run's `replicas: bitwise equal ... fingerprint 0x...`
/// line: the run prints it only once every rank's final state matched.
pub fn fingerprint(output: &str) -> Option<String> {
    let line = output.lines().find(|line| line.starts_with("replicas: bitwise equal"))?;
    let after = line.split("fingerprint ").nth(1)?;
    after.split([' ', ',']).next().map(str::to_string)
}
