#!/usr/bin/env bash
# Chapter 9's job that restarts itself, run for real: the training example
# on 4 MPI processes under `scripts/launch.sh --max-restarts 1`, with rank 2
# killed mid-run. Writes the launcher's whole output, both attempts, to
# chapters/figures/data/train-restart.log, which the chapter includes.
#
#   scripts/restart_demo.sh
#
# The log's first line names this script, the date, the machine and its
# load; the second is the command. Fails, and leaves the log as it was,
# unless the job restarted once, resumed from its checkpoint and passed.

set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

LOG=chapters/figures/data/train-restart.log
# Under target/ so that the command in the log is the same on every run.
CHECKPOINT=target/restart-demo/run.safetensors
COMMAND=(scripts/launch.sh --max-restarts 1 -np 4 target/release/examples/train --backend mpi
    --batch-size 8 --checkpoint "$CHECKPOINT" --checkpoint-every 20)
KILLED_RANK=2
START_LIMIT_S=600 # a loaded 2-core machine takes a while to reach the first log line

fail() {
    echo "scripts/restart_demo.sh: $1" >&2
    [[ -s "${output:-}" ]] && { echo "--- the launcher's output so far:" >&2; cat "$output" >&2; }
    echo "    -> $LOG is unchanged; fix the cause and run scripts/restart_demo.sh again" >&2
    exit 1
}

cargo build --release --quiet --features mpi,nccl --example train
rm -rf "$(dirname "$CHECKPOINT")"
mkdir -p "$(dirname "$CHECKPOINT")"
work="$(mktemp -d)"
output="$work/output"
launcher=""
# On any early exit, stop the job too (launch.sh passes TERM on to mpirun).
trap '[[ -n "$launcher" ]] && kill -TERM "$launcher" 2>/dev/null; rm -rf "$work"' EXIT

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
started="$(date -u '+%Y-%m-%d %H:%M UTC')"
"${COMMAND[@]}" >"$output" 2>&1 &
launcher=$!

# Wait until the run has logged a step and a checkpoint is on disk, so that
# the restart has something to resume from.
deadline=$((SECONDS + START_LIMIT_S))
until [[ -f "$CHECKPOINT" ]] && grep -q '^step ' "$output"; do
    kill -0 "$launcher" 2>/dev/null || fail "the job ended before its first checkpoint; nothing was killed"
    ((SECONDS < deadline)) || fail "no step logged and no checkpoint after ${START_LIMIT_S}s"
    sleep 0.2
done

# Rank 2 of this job: the process whose environment mpirun gave that rank
# (OMPI_COMM_WORLD_RANK, as tests/multinode/cluster.rs finds it) and whose
# command line names this run's checkpoint (no other job's rank 2).
pid=""
for environ in /proc/[0-9]*/environ; do
    dir="${environ%/environ}"
    # (Processes of other users, or gone since the glob, cannot be read: skipped.)
    { tr '\0' '\n' <"$environ"; } 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$KILLED_RANK" || continue
    { tr '\0' ' ' <"$dir/cmdline"; } 2>/dev/null | grep -qF -- "--checkpoint $CHECKPOINT" || continue
    pid="${dir#/proc/}"
    break
done
[[ -n "$pid" ]] || fail "found no process of rank $KILLED_RANK (OMPI_COMM_WORLD_RANK=$KILLED_RANK) running with --checkpoint $CHECKPOINT"
kill -9 "$pid"
killed_after="$(grep '^step ' "$output" | tail -n 1 | awk '{print $2}')"

status=0
wait "$launcher" || status=$?
launcher=""
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

# The job must have died of the kill, restarted once with --resume, resumed
# from the checkpoint and reached its target.
((status == 0)) || fail "the launcher ended with exit status $status"
# (mpirun may name the PID as 0 when it started the rank itself.)
grep -q "mpirun noticed that process rank $KILLED_RANK with PID [0-9]* on node .* exited on signal 9" "$output" ||
    fail "mpirun did not report rank $KILLED_RANK (PID $pid) killed by signal 9"
grep -q 'restart 1 of 1, with --resume' "$output" || fail "the launcher did not restart the job"
grep -q '^resuming after step [0-9]* from the checkpoint' "$output" ||
    fail "the restarted job did not resume from the checkpoint"
grep -q '^PASS:' "$output" || fail "the restarted job did not PASS"
grep -q 'attempt 2 of 2 ended with exit status 0' "$output" || fail "the second attempt did not end with exit status 0"

{
    echo "# scripts/restart_demo.sh, $started, $(nproc) cores, load average (1, 5, 15 min) before: $load_before, after: $load_after; rank $KILLED_RANK (PID $pid) killed with kill -9 after step $killed_after was logged"
    echo "\$ ${COMMAND[*]}"
    cat "$output"
} >"$LOG"
rm -rf "$(dirname "$CHECKPOINT")"
echo "scripts/restart_demo.sh: the job restarted and passed; wrote $LOG" >&2
