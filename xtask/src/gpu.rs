//! Whether this machine has an NVIDIA GPU, so that the
//! `solutions` check runs the GPU tests (`tests/nccl.rs` and
//! `tests/gpu_threads.rs`, ignored by default with
//! `#[ignore = "needs a GPU: ..."]`) where they can run, and reports
//! them skipped, with that reason, where they cannot.
//! Unit tests: xtask/tests/gpu.rs (`cargo test -p xtask`).

use std::path::Path;
use std::process::{Command, Stdio};

/// The test executables whose ignored tests are the GPU tests.
pub const GPU_TEST_TARGETS: &[&str] = &["nccl", "gpu_threads"];

/// How a GPU was found, in words, or `None` without one. Looks for
/// `/dev/nvidia0` (the driver's first device; no tool needed) and asks
/// `nvidia-smi -L`, which lists one `GPU n: ...` line per GPU.
pub fn find_gpu() -> Option<String> {
    let listing = Command::new("nvidia-smi")
        .arg("-L")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).into_owned());
    describe_gpus(Path::new("/dev/nvidia0").exists(), listing.as_deref())
}

/// [`find_gpu`]'s verdict from what it saw: whether the device file exists,
/// and what `nvidia-smi -L` printed when it ran and exited 0.
pub fn describe_gpus(device_file: bool, nvidia_smi_listing: Option<&str>) -> Option<String> {
    let listed = nvidia_smi_listing
        .map_or(0, |listing| listing.lines().filter(|line| line.trim_start().starts_with("GPU ")).count());
    match (listed, device_file) {
        (0, false) => None,
        (0, true) => Some("/dev/nvidia0 exists".to_string()),
        (1, _) => Some("1 GPU listed by nvidia-smi -L".to_string()),
        (count, _) => Some(format!("{count} GPUs listed by nvidia-smi -L")),
    }
}

/// The libtest arguments for test executable `target_name`: with a GPU,
/// the GPU tests' executables also run their ignored tests.
pub fn harness_args(target_name: &str, gpu_found: bool) -> Vec<&'static str> {
    if gpu_found && GPU_TEST_TARGETS.contains(&target_name) {
        vec!["--include-ignored"]
    } else {
        Vec::new()
    }
}
