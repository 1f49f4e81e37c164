//! Finding a GPU, and running the GPU tests only where
//! one is. Run: cargo test -p xtask --test gpu

use xtask::gpu::{describe_gpus, harness_args};

#[test]
fn a_gpu_is_found_by_its_device_file_or_by_nvidia_smi() {
    assert_eq!(describe_gpus(false, None), None, "no device file, no nvidia-smi: no GPU");
    let no_devices = "No devices were found\n";
    assert_eq!(describe_gpus(false, Some(no_devices)), None, "nvidia-smi without a GPU line");
    assert_eq!(describe_gpus(true, None).as_deref(), Some("/dev/nvidia0 exists"));
    let two = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)\n";
    assert_eq!(describe_gpus(false, Some(two)).as_deref(), Some("2 GPUs listed by nvidia-smi -L"));
}

#[test]
fn only_the_gpu_tests_run_their_ignored_tests_and_only_with_a_gpu() {
    assert_eq!(harness_args("nccl", true), ["--include-ignored"]);
    assert!(harness_args("nccl", false).is_empty(), "without a GPU they stay skipped, with their reason");
    assert!(harness_args("dist", true).is_empty(), "other executables' ignored tests stay ignored");
}
