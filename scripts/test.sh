#!/usr/bin/env bash
# scripts/test.sh: the whole test suite, exactly as CI runs it.
# Run it from anywhere, after scripts/setup.sh:   scripts/test.sh
#
# Checks, in order (each one runs even when an earlier one failed):
#   fmt       cargo fmt --check
#   book      mdbook build, plus scripts/check_book_includes.py, because
#             mdBook exits 0 on a missing file and silently empties a
#             listing whose ANCHOR is missing
#   solutions cargo test --features solutions: every test target and the doc
#             tests, against the reference solutions; all must pass
#   teeth     for every tests/chapter_NN.rs: cargo test --test chapter_NN on
#             the untouched exercises must FAIL, and say `exercise chNN:`
#             (the stubs' todo! message); a chapter whose tests pass on
#             stubs proves nothing. Outside CI, a chapter whose exercise.rs
#             you have edited is skipped (your solution is meant to pass)
#   notebooks scripts/run_notebooks.py: every notebook in notebooks/ runs
#             top to bottom in the Rust kernel without an error; committed
#             notebooks carry no outputs (--check-clean); the runner's own
#             tests (a planted panic must fail)
#   clippy    cargo clippy --all-targets --features solutions -- -D warnings
#   train     cargo run --release --example train exits 0: the default run
#             reaches its accuracy target
#
# The last line is the summary CI reads, alone on its line:
#   N passed, N failed[, N skipped]
# counting the tests cargo ran in the solutions run (its `test result:`
# lines; ignored tests count as skipped), one per notebook, and one per other
# check above (one teeth check per chapter). The exit status is non-zero when anything failed.
# Full logs are kept in target/test-logs/.
#
# Everything runs one step at a time on purpose: cargo already compiles on
# every core, and libtorch spreads each test's tensor work over every core,
# so running steps side by side on a small machine only makes them fight.
# The chapters share one build without the feature (built once, then each
# chapter runs from it).

set -uo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
LOG_DIR="$REPO_ROOT/target/test-logs"
mkdir -p "$LOG_DIR"

# In CI, a test run that takes longer than this is hung (the whole suite
# takes a few minutes): `timeout` stops it and everything it started, and
# the summary line still gets printed. Not on a terminal, where `timeout`
# would keep the tests running after Ctrl-C.
SOLUTIONS_TIMEOUT=30m
CHAPTER_TIMEOUT=10m
limited() {
    local limit=$1
    shift
    if [[ -n "${CI:-}" ]]; then
        timeout --kill-after=30s "$limit" "$@"
    else
        "$@"
    fi
}

passed=0
failed=0
skipped=0
failed_checks=()
step_start=$SECONDS

# check_result NAME OK|FAIL|SKIP [DETAIL]: count and print one check, with
# the seconds since the current section started.
check_result() {
    local name=$1 outcome=$2 detail=${3:-}
    case $outcome in
        OK)   passed=$((passed + 1)) ;;
        FAIL) failed=$((failed + 1)); failed_checks+=("$name") ;;
        SKIP) skipped=$((skipped + 1)) ;;
    esac
    printf '%-4s  %-18s %4ds  %s\n' "$outcome" "$name" $((SECONDS - step_start)) "$detail"
}

section() {
    printf '\n==> %s\n' "$*"
    step_start=$SECONDS
}

# Print the summary line and leave; used at the end and on early exits.
finish() {
    echo
    if ((${#failed_checks[@]})); then
        echo "failed: ${failed_checks[*]}  (logs in target/test-logs/)"
    fi
    if ((skipped)); then
        echo "$passed passed, $failed failed, $skipped skipped"
    else
        echo "$passed passed, $failed failed"
    fi
    ((failed == 0))
    exit
}

# The mdbook that scripts/setup.sh installed, on PATH or in cargo's bin.
find_mdbook() {
    command -v mdbook 2>/dev/null && return
    local candidate="${CARGO_INSTALL_ROOT:-${CARGO_HOME:-$HOME/.cargo}}/bin/mdbook"
    [[ -x "$candidate" ]] && echo "$candidate"
}

# Add up cargo's `test result: ok. 3 passed; 0 failed; 1 ignored; ...` lines.
# Prints "PASSED FAILED IGNORED".
sum_test_results() {
    awk '/^test result: / {
            for (i = 1; i < NF; i++) {
                if ($(i+1) ~ /^passed;?$/)  p += $i
                if ($(i+1) ~ /^failed;?$/)  f += $i
                if ($(i+1) ~ /^ignored;?$/) g += $i
            }
         }
         END { printf "%d %d %d\n", p, f, g }' "$1"
}

# ---------------------------------------------------------------- preflight

if [[ ! -f .cargo/libtorch.toml ]]; then
    echo "scripts/test.sh: libtorch is not set up in this checkout (.cargo/libtorch.toml is missing)."
    echo "    -> run scripts/setup.sh first"
    check_result setup FAIL "run scripts/setup.sh"
    finish
fi
suite_start=$SECONDS

# -------------------------------------------------------------------- fmt

section "cargo fmt --check"
# -l: list the files that differ, instead of pages of diff.
if cargo fmt --check -- --color=never -l >"$LOG_DIR/fmt.log" 2>&1; then
    check_result fmt OK
else
    echo "not formatted:"
    sed -n '1,40p' "$LOG_DIR/fmt.log"
    check_result fmt FAIL "run cargo fmt (cargo fmt --check shows the diff)"
fi

# ------------------------------------------------------------------- book

section "mdbook build, and every {{#include}} resolves"
mdbook="$(find_mdbook)"
if [[ ! -f book.toml ]]; then
    check_result book FAIL "no book.toml at the repository root"
elif [[ -z "$mdbook" ]]; then
    check_result book FAIL "mdbook is not installed: run scripts/setup.sh"
else
    # mdBook logs a missing include file as ERROR and still exits 0: any
    # ERROR line fails the check. Missing anchors it does not even log, so
    # check_book_includes.py resolves every include itself.
    "$mdbook" build >"$LOG_DIR/mdbook.log" 2>&1
    mdbook_status=$?
    if ((mdbook_status != 0)) || grep -q 'ERROR' "$LOG_DIR/mdbook.log"; then
        cat "$LOG_DIR/mdbook.log"
        check_result book FAIL "mdbook build failed or logged an ERROR"
    else
        grep 'WARN' "$LOG_DIR/mdbook.log"
        check_result book OK "$("$mdbook" --version), output in book/"
    fi
    if python3 scripts/check_book_includes.py . >"$LOG_DIR/includes.log" 2>&1; then
        check_result book-includes OK "$(tail -n 1 "$LOG_DIR/includes.log" | sed 's/^check_book_includes: //')"
    else
        cat "$LOG_DIR/includes.log"
        check_result book-includes FAIL "a {{#include}} points at a missing file or anchor"
    fi
fi

# -------------------------------------------------------------- solutions

section "cargo test --features solutions (all tests and doc tests, reference solutions)"
limited "$SOLUTIONS_TIMEOUT" cargo test --features solutions --no-fail-fast 2>&1 |
    tee "$LOG_DIR/solutions.log"
solutions_status=${PIPESTATUS[0]}
read -r t_passed t_failed t_ignored < <(sum_test_results "$LOG_DIR/solutions.log")
passed=$((passed + t_passed))
failed=$((failed + t_failed))
skipped=$((skipped + t_ignored))
if ((t_failed > 0)); then
    failed_checks+=("solutions:$t_failed-tests")
fi
echo
if ((solutions_status == 124 || solutions_status == 137)); then
    check_result solutions FAIL "stopped after $SOLUTIONS_TIMEOUT: a test hangs (see the last test named above)"
elif ((solutions_status != 0 && t_failed == 0)); then
    # cargo failed, yet no test did: a build error or a crashed test binary.
    check_result solutions FAIL "cargo test --features solutions failed outside any test (build error or crash, see above)"
else
    printf '%-4s  %-18s %4ds  %s\n' "----" "solutions" $((SECONDS - step_start)) \
        "$t_passed passed, $t_failed failed, $t_ignored ignored (counted per test)"
fi

# ------------------------------------------------------------------ teeth

section "teeth: every chapter's tests fail on the untouched exercises"
chapters=()
for file in tests/chapter_[0-9][0-9].rs; do
    [[ -e "$file" ]] && chapters+=("$(basename "$file" .rs)")
done
if ((${#chapters[@]} == 0)); then
    echo "(no tests/chapter_NN.rs yet)"
else
    # One build for all chapters (without the feature); the runs reuse it.
    build_args=()
    for chapter in "${chapters[@]}"; do build_args+=(--test "$chapter"); done
    cargo test --no-run "${build_args[@]}" >"$LOG_DIR/teeth-build.log" 2>&1 ||
        tail -n 30 "$LOG_DIR/teeth-build.log"
    for chapter in "${chapters[@]}"; do
        nn=${chapter#chapter_}
        log="$LOG_DIR/teeth-$chapter.log"
        # A learner who has filled in an exercise has made its tests pass, as
        # intended: check only untouched stubs. CI's clean clone always is.
        if [[ -z "${CI:-}" ]] && ! git diff --quiet HEAD -- "src/ch${nn}_"*/exercise.rs 2>/dev/null; then
            check_result "teeth $chapter" SKIP "you have edited src/ch${nn}_*/exercise.rs (CI checks the committed stubs)"
            continue
        fi
        limited "$CHAPTER_TIMEOUT" cargo test --test "$chapter" >"$log" 2>&1
        status=$?
        read -r c_passed c_failed _ < <(sum_test_results "$log")
        if ((status == 0)); then
            check_result "teeth $chapter" FAIL \
                "passes on the stubs: its tests never reach the exercise (cargo test --test $chapter)"
        elif ((status == 124 || status == 137)); then
            check_result "teeth $chapter" FAIL "hangs on the stubs (stopped after $CHAPTER_TIMEOUT)"
        elif ! grep -q "exercise ch$nn:" "$log"; then
            tail -n 30 "$log"
            check_result "teeth $chapter" FAIL \
                "fails, but never says 'exercise ch$nn:' (a build error, or a test failing for another reason)"
        else
            check_result "teeth $chapter" OK \
                "$c_failed of $((c_passed + c_failed)) tests fail on the stubs, naming 'exercise ch$nn:'"
        fi
    done
fi

# -------------------------------------------------------------- notebooks

section "notebooks: run every notebook in a fresh Rust kernel"
if [[ ! -f scripts/run_notebooks.py ]]; then
    echo "(no scripts/run_notebooks.py in this checkout)"
else
    # run_notebooks.py ends with its own "N passed, N failed" (one per
    # notebook); those count here too.
    limited "$SOLUTIONS_TIMEOUT" .venv/bin/python scripts/run_notebooks.py 2>&1 |
        tee "$LOG_DIR/notebooks.log"
    notebooks_status=${PIPESTATUS[0]}
    read -r n_passed n_failed < <(sed -n -E 's/^([0-9]+) passed, ([0-9]+) failed.*$/\1 \2/p' \
        "$LOG_DIR/notebooks.log" | tail -n 1)
    n_passed=${n_passed:-0}
    n_failed=${n_failed:-0}
    passed=$((passed + n_passed))
    failed=$((failed + n_failed))
    ((n_failed > 0)) && failed_checks+=("notebooks:$n_failed")
    echo
    if ((notebooks_status != 0 && n_failed == 0)); then
        check_result notebooks FAIL "scripts/run_notebooks.py failed outside any notebook (see above)"
    else
        printf '%-4s  %-18s %4ds  %s\n' "----" "notebooks" $((SECONDS - step_start)) \
            "$n_passed passed, $n_failed failed (counted per notebook)"
    fi
    # Committed notebooks carry no outputs (clean diffs); the runner's own
    # tests prove it catches a failing cell and a planted panic.
    if .venv/bin/python scripts/run_notebooks.py --check-clean >"$LOG_DIR/notebooks-clean.log" 2>&1; then
        check_result notebooks-clean OK "$(tail -n 1 "$LOG_DIR/notebooks-clean.log")"
    else
        cat "$LOG_DIR/notebooks-clean.log"
        check_result notebooks-clean FAIL "a committed notebook has outputs or breaks a convention (.venv/bin/python scripts/run_notebooks.py --strip FILE)"
    fi
    if limited "$CHAPTER_TIMEOUT" .venv/bin/python scripts/test_run_notebooks.py >"$LOG_DIR/notebook-runner.log" 2>&1; then
        check_result notebook-runner OK "$(tail -n 1 "$LOG_DIR/notebook-runner.log")"
    else
        tail -n 40 "$LOG_DIR/notebook-runner.log"
        check_result notebook-runner FAIL "scripts/test_run_notebooks.py failed (target/test-logs/notebook-runner.log)"
    fi
fi

# ----------------------------------------------------------------- clippy

section "cargo clippy --all-targets --features solutions -- -D warnings"
if cargo clippy --all-targets --features solutions -- -D warnings >"$LOG_DIR/clippy.log" 2>&1; then
    check_result clippy OK
else
    grep -E '^(warning|error)' -A 6 "$LOG_DIR/clippy.log" | head -n 80
    check_result clippy FAIL "fix the lints above (full log: target/test-logs/clippy.log)"
fi

# ------------------------------------------------------------------ train

section "cargo run --release --example train: the real run reaches its target"
# The default run trains the tiny GPT on 2 ranks and exits 0 only when its
# held-out accuracy reaches the stated target (its last line says PASS).
# Its numbers are the same on every run; only the wall time varies.
if limited "$CHAPTER_TIMEOUT" cargo run --release --example train >"$LOG_DIR/train.log" 2>&1; then
    check_result train OK "$(grep -E '^PASS' "$LOG_DIR/train.log" | tail -n 1)"
else
    tail -n 20 "$LOG_DIR/train.log"
    check_result train FAIL "the default training run missed its target or failed (target/test-logs/train.log)"
fi

echo
echo "scripts/test.sh took $((SECONDS - suite_start))s"
finish
