#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it.
# Run it from anywhere, after scripts/setup.sh:   scripts/test.sh
#
# It runs `cargo xtask test` (the runner is the xtask/ crate), whose checks
# run in this order, each one even when an earlier one failed:
#   fmt        cargo fmt --all --check
#   book       mdbook build exits 0 and logs no ERROR or WARN
#   includes   every {{#include}} of the book resolves to a file, an anchor
#              with its ANCHOR_END, and some lines (mdBook itself would
#              silently empty the listing)
#   browser    the book in headless Chromium: every page loads, every image
#              renders, every link and #anchor resolves, no script error or
#              console.error, no failed request, none off loopback
#              (scripts/check_book_in_browser.py, which first proves it
#              catches the problems planted in scripts/testdata/browser_book/);
#              saves the README's screenshots to docs/screenshots/
#   files      every repository path the docs, scripts and code mention
#              exists, and nothing points at files outside the repository
#   history    every commit's subject since the rule began fits 72
#              characters (xtask/src/history_check.rs)
#   layering   the imports of src/ and examples/ keep the layers of
#              docs/architecture.md: no chapter in the library, the training
#              run or the examples; no chapter in another chapter; and no
#              two files of src/, examples/ or xtask/src/ use each other (an
#              import circle; the ones already there are listed in
#              xtask/src/layering_check/circles.rs until they are untangled)
#   stubs      every solution function has its exercise `pub fn`, with the
#              solution's doc comment and signature, whose body is only the
#              chapter's todo!("exercise chNN: NAME ...")
#   hints      every exercise has exactly three non-empty graded hints, and its
#              chapter page shows each one
#   runner     cargo test -p xtask: the runner's own tests
#   solutions  cargo test --features solutions,mpi,nccl: every test and doc test
#              (the MPI tests start mpirun jobs of 2 and 3 processes; the GPU
#              tests of tests/nccl.rs and tests/gpu_threads.rs run where a
#              GPU is found, by /dev/nvidia0 or nvidia-smi -L, and are
#              otherwise skipped, each with its reason;
#              tests/torch_oracle.rs and tests/torch_oracle/ run PyTorch's own
#              DistributedDataParallel, scripts/torch/oracle.py under
#              .venv/bin/torchrun, as the numerical oracle of every DDP stage
#              and compare the bucket layouts with PyTorch's;
#              tests/torch_sampler.rs compares the shuffled sampler's shards
#              with PyTorch's DistributedSampler, tests/torch_checkpoint.rs
#              moves checkpoints both ways between the workbook and PyTorch's
#              GPT twin, and tests/torch_twins.rs runs each chapter's PyTorch
#              twin, scripts/torch/twins/chNN_*.py, under torchrun on 2 gloo
#              ranks, one test per script; tests/torch_fully_shard.rs runs
#              chapter 14's fully_shard lines and checks their shards' rows)
#   figures    cargo run --example figures -- --check: every figure of the
#              book (chapters/figures/) is what examples/figures.rs draws
#              from the code now; it names each one that differs or is missing
#   teeth      on the untouched stubs, every test of tests/chapter_NN.rs fails
#              naming `exercise chNN:` in its own output, except the controls
#              (tests in a `mod controls`, which never run the learner's code),
#              which pass; per chapter it prints how many tests reach the
#              exercise and how many are controls, and any drift fails it
#              (outside CI, a chapter whose exercise.rs you have edited is
#              skipped: your solution is meant to pass); and each chapter
#              has the same tests with --features solutions,mpi,nccl as
#              without (a test behind a feature would escape the judging)
#   notebooks  every notebook runs in the Rust kernel, is committed without
#              outputs, and the notebook runner's own tests pass (a missing
#              runner, or a run without its summary line, fails)
#   clippy     cargo clippy --all-targets --features solutions,mpi,nccl -- -D warnings
#   train      cargo run --release --features mpi,nccl --example train reaches its target
#   mpi        the same run on 2 processes reaches it too:
#              scripts/launch.sh -np 2 target/release/examples/train --backend mpi
#   multinode  cargo test --features solutions,mpi,nccl --test multinode: jobs
#              on 2 nodes x 2 ranks that scripts/nodes.sh makes on this machine
#              (training, a killed remote rank, a pulled cable, resume,
#              --max-restarts); needs root, and counts each test as skipped,
#              with the reason, where nodes cannot be made
#
# After a whole run, every skip must be one tests/expected_skips.toml allows
# on this machine (with its reason), and the run must count at least the
# `tests` it records; otherwise the run fails.
#
# Run a part, or leave parts out (arguments go to the runner):
#   scripts/test.sh --only teeth          (the same as: cargo xtask test --only teeth)
#   scripts/test.sh --skip train,notebooks
#   cargo xtask --help                    (every check, in detail)
#
# The last line is the summary CI reads, alone on its line:
#   N passed, N failed[, N skipped]
# counting each test of the solutions run (ignored tests count as skipped),
# each notebook, and each other check (one teeth check per chapter); a check
# left out with --only or --skip counts as skipped. The
# exit status is non-zero when anything failed. With CI set, a hung step is
# stopped (30 min for solutions and notebooks, 10 min per chapter and for
# train). Full logs: target/test-logs/.

set -uo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
mkdir -p target/test-logs

# fail_before_the_runner NAME DETAIL: a check line and the summary line, for
# the failures that stop the suite before the runner can report them.
fail_before_the_runner() {
    printf '%-4s  %-18s %4ds  %s\n' FAIL "$1" 0 "$2"
    echo
    echo "failed: $1  (logs in target/test-logs/)"
    echo "0 passed, 1 failed"
    exit 1
}

if [[ ! -f .cargo/libtorch.toml ]]; then
    echo "scripts/test.sh: libtorch is not set up in this checkout (.cargo/libtorch.toml is missing)."
    echo "    -> run scripts/setup.sh first"
    fail_before_the_runner setup "run scripts/setup.sh"
fi

# Build the runner first, so that even a runner that does not compile ends
# with the summary line CI reads.
if ! cargo build --quiet --package xtask 2>target/test-logs/xtask-build.log; then
    cat target/test-logs/xtask-build.log
    fail_before_the_runner xtask "the test runner (xtask/) does not build: see above"
fi

exec cargo xtask test "$@"
