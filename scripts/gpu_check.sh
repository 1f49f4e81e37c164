#!/usr/bin/env bash
# The GPU check in one command (chapter 10). On a
# machine with NVIDIA GPUs it runs every GPU test (tests/nccl.rs and
# tests/gpu_threads.rs with --include-ignored), bench_nccl, the training run
# on CUDA with one GPU and with every GPU (and on the CPU, for comparison),
# two rank threads on one GPU plain, with ZeRO-1, with bf16 gradients, and
# stopped half-way then resumed (ZeRO-1's and the resumed run's final state
# must equal the plain run's, bitwise), and PyTorch's DDP with NCCL on the same work (scripts/bench_torch_ddp.py),
# and writes one Markdown report with the numbers, the GPU, its driver and
# the date. Where there is no GPU it refuses in one line and exits 2.
#
#   scripts/gpu_check.sh                    build here (cargo), run, write the report
#   scripts/gpu_check.sh --build-only DIR   build the binaries into DIR (no GPU needed)
#   scripts/gpu_check.sh --prebuilt DIR     run DIR's binaries (no cargo needed)
#
# The carried mode, for a GPU machine without a Rust toolchain: build here
# with --build-only DIR, copy the checkout and DIR there, and run
# --prebuilt DIR. The binaries load libtorch and NCCL from that machine's
# PyTorch (LD_LIBRARY_PATH is set from --python's torch), which must be the
# version they were built against (DIR/MANIFEST says which).
#
# Options: --out FILE (the report; default docs/gpu-reports/<date>-<gpu>.md),
# --steps N (the training runs' steps; default the run's own, and 200 for
# PyTorch's twin), --python PATH (the Python with PyTorch; default
# .venv/bin/python, else python3), --timeout S (each step's limit, default
# 900). Exit: 0 all passed, 1 a step failed (the report says which), 2 bad
# arguments or a machine that cannot run it.
# Its own tests (refusals, arguments, the build): cargo test --test gpu_check

set -uo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
invocation="$*"
# shellcheck source=scripts/gpu_check_steps.sh
source scripts/gpu_check_steps.sh
trap remove_temporary_folders EXIT

# The binaries a run needs: the name in DIR, and what cargo calls it.
BINARIES=(nccl_tests gpu_threads bench_nccl train)
# The libtorch every binary links: tch 0.24's.
TORCH_VERSION=2.11.0

refuse() { # one line on stderr, exit 2
    echo "gpu_check: $*" >&2
    exit 2
}

usage() {
    sed -n '2,/^$/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
}

mode=build-and-run dir="" out="" steps="" python="" step_timeout=900
while (($#)); do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --build-only | --prebuilt)
            [[ $mode == build-and-run ]] || refuse "--build-only and --prebuilt exclude each other: pick one"
            [[ $# -ge 2 && -n $2 && $2 != -* ]] || refuse "$1 needs a folder: $1 DIR"
            mode=${1#--} dir=$2
            shift 2 ;;
        --out | --steps | --python | --timeout)
            [[ $# -ge 2 && -n $2 ]] || refuse "$1 needs a value (see --help)"
            case "$1" in
                --out) out=$2 ;;
                --steps) steps=$2 ;;
                --python) python=$2 ;;
                --timeout) step_timeout=$2 ;;
            esac
            shift 2 ;;
        *) refuse "unknown argument '$1' (see scripts/gpu_check.sh --help)" ;;
    esac
done
[[ -z $steps || $steps =~ ^[1-9][0-9]*$ ]] || refuse "--steps must be a positive whole number, not '$steps'"
[[ $step_timeout =~ ^[1-9][0-9]*$ ]] || refuse "--timeout must be a positive number of seconds, not '$step_timeout'"

# build_into DIR: the release binaries of the nccl feature (no mpi: the GPU
# machine needs no Open MPI), copied into DIR with a MANIFEST.
build_into() {
    local into=$1 json
    command -v cargo >/dev/null || refuse "building needs cargo (the Rust toolchain); on a machine without it run --prebuilt DIR with binaries built elsewhere by --build-only DIR"
    mkdir -p "$into" || refuse "cannot make the folder $into"
    json=$(mktemp)
    echo "gpu_check: building the GPU binaries (cargo, release, --features nccl) ..." >&2
    if ! cargo build --release --features nccl --example train --example bench_nccl --message-format=json-render-diagnostics >"$json" ||
        ! cargo test --release --features nccl --no-run --test nccl --test gpu_threads --message-format=json-render-diagnostics >>"$json"; then
        rm -f "$json"
        echo "gpu_check: the build failed (see above)" >&2
        exit 1
    fi
    local name path
    while read -r name path; do
        case "$name" in nccl) name=nccl_tests ;; esac
        cp -f "$path" "$into/$name"
    done < <(sed -n 's/.*"target":{[^}]*"name":"\([^"]*\)".*"executable":"\([^"]*\)".*/\1 \2/p' "$json")
    rm -f "$json"
    for name in "${BINARIES[@]}"; do
        [[ -x $into/$name ]] || refuse "the build made no $name (cargo's output named none)"
    done
    {
        echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
        echo "built $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -m), glibc $(ldd --version | head -1 | awk '{print $NF}')"
        echo "features nccl, release, libtorch $TORCH_VERSION"
        echo "rustc $(rustc --version 2>/dev/null | awk '{print $2}')"
    } >"$into/MANIFEST"
}

if [[ $mode == build-only ]]; then
    build_into "$dir"
    echo "gpu_check: built; carry these with the checkout, then run scripts/gpu_check.sh --prebuilt $dir there:"
    for name in "${BINARIES[@]}" MANIFEST; do echo "$dir/$name"; done
    exit 0
fi

if [[ $mode == prebuilt ]]; then
    [[ -d $dir ]] || refuse "--prebuilt $dir: no such folder (make it with scripts/gpu_check.sh --build-only $dir)"
    for name in "${BINARIES[@]}" MANIFEST; do
        [[ -f $dir/$name ]] || refuse "--prebuilt $dir has no $name (make it again with scripts/gpu_check.sh --build-only $dir)"
    done
fi

gpu_count=$(count_gpus)
((gpu_count > 0)) || refuse "needs an NVIDIA GPU, and this machine shows none ($(why_no_gpu)); to build for a GPU machine here: scripts/gpu_check.sh --build-only DIR"

if [[ -z $python ]]; then
    if [[ -x .venv/bin/python ]]; then python=.venv/bin/python; else python=python3; fi
fi
torch_found=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null) ||
    refuse "needs PyTorch $TORCH_VERSION in --python $python (import torch failed); pass the Python that has it"
[[ $torch_found == "$TORCH_VERSION"* ]] ||
    refuse "the binaries link libtorch $TORCH_VERSION, and $python has PyTorch $torch_found: pass --python with $TORCH_VERSION"

if [[ $mode == build-and-run ]]; then
    dir=target/gpu-check
    build_into "$dir"
fi
use_pythons_libraries "$python" || refuse "cannot find NCCL's libnccl.so.2 beside $python's torch (pip's nvidia-nccl wheel)"

gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
[[ -n $out ]] || out="docs/gpu-reports/$(date -u +%Y-%m-%d)-$(slug "${gpu_name:-gpu}").md"
mkdir -p "$(dirname "$out")" || refuse "cannot make the folder of --out $out"

train_steps=()
[[ -z $steps ]] || train_steps=(--steps "$steps")
torch_steps=(--steps "${steps:-200}") # the steps its twin times
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

run_step "GPU tests: the NCCL backend" "$dir/nccl_tests" --include-ignored
run_step "GPU tests: 2 and 3 in-process ranks on one GPU" "$dir/gpu_threads" --include-ignored
run_step "NCCL all_reduce, every GPU" "$dir/bench_nccl"
run_step "training run, NCCL, 1 GPU" "$dir/train" --backend nccl --world-size 1 "${train_steps[@]}"
if ((gpu_count > 1)); then
    run_step "training run, NCCL, $gpu_count GPUs" "$dir/train" --backend nccl "${train_steps[@]}"
fi
run_step "training run, 2 in-process rank threads sharing cuda:0" "$dir/train" --backend in-process --device cuda "${train_steps[@]}"
run_step "training run, CPU, 2 in-process ranks" "$dir/train" --backend in-process "${train_steps[@]}"
# Chapters 11 and 12 and the checkpoints on the GPU: ZeRO-1 and a run
# stopped half-way and resumed must end in the plain run's exact state.
on_gpu=(--backend in-process --device cuda)
run_step "training run, ZeRO-1, 2 rank threads sharing cuda:0" "$dir/train" "${on_gpu[@]}" --zero 1 "${train_steps[@]}"
run_step "training run, bf16 gradients, 2 rank threads sharing cuda:0" "$dir/train" "${on_gpu[@]}" --grad-dtype bf16 "${train_steps[@]}"
all_steps=${steps:-$("$dir/train" --help | grep -A1 -- '--steps <STEPS>' | sed -n 's/.*\[default: \([0-9]*\)\].*/\1/p')}
checkpoint="$step_log_dir/run.ckpt" # removed with the logs
half=$((all_steps > 1 ? all_steps / 2 : 1))
run_step "training run, stopped after step $half, 2 rank threads sharing cuda:0" \
    "$dir/train" "${on_gpu[@]}" --checkpoint "$checkpoint" --stop-after "$half" "${train_steps[@]}"
run_step "training run, resumed, 2 rank threads sharing cuda:0" \
    "$dir/train" "${on_gpu[@]}" --checkpoint "$checkpoint" --resume "${train_steps[@]}"
same_state "ZeRO-1 (AdamW sharded) and plain DDP" "training run, ZeRO-1" "training run, 2 in-process rank threads"
same_state "stopped and resumed, and run through" "training run, resumed" "training run, 2 in-process rank threads"
# PyTorch at its defaults, and at its best settings where the script has them.
torch_settings=("")
if "$python" scripts/bench_torch_ddp.py --help 2>/dev/null | grep -q -- '--setting'; then
    torch_settings=(defaults best)
fi
for setting in "${torch_settings[@]}"; do
    label="PyTorch DDP" extra=()
    [[ -z $setting ]] || label="PyTorch DDP ($setting)" extra=(--setting "$setting")
    run_step "$label, NCCL, 1 GPU" "$python" scripts/bench_torch_ddp.py --device cuda --world-size 1 "${torch_steps[@]}" "${extra[@]}"
    if ((gpu_count > 1)); then
        run_step "$label, NCCL, $gpu_count GPUs" "$python" scripts/bench_torch_ddp.py --device cuda --world-size "$gpu_count" "${torch_steps[@]}" "${extra[@]}"
    fi
done

write_report "$out" "$gpu_count" "$load_before" "$dir/MANIFEST" "$python" "$torch_found" "$invocation"
echo "gpu_check: $passed_steps of $((passed_steps + failed_steps)) steps passed; report: $out"
((failed_steps == 0))
