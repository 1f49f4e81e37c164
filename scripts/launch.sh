#!/usr/bin/env bash
# Start a program as N ranks, one process each, with Open
# MPI's mpirun: the workbook's `torchrun`. Every argument but its own
# --max-restarts goes to mpirun.
#
#   scripts/launch.sh -np 2 target/release/examples/train --backend mpi
#   scripts/launch.sh -np 8 --hostfile hosts --map-by ppr:4:node \
#       target/release/examples/train --backend mpi      (two machines, 4 each)
#   scripts/launch.sh --max-restarts 2 -np 2 target/release/examples/train \
#       --backend mpi --checkpoint run.safetensors --checkpoint-every 50
#
# A host file lists one machine per line with its slots, `node1 slots=4`.
# Every machine needs the same program at the same path and passwordless ssh
# from the first one; the ranks then find each other over TCP. A host file
# written by scripts/nodes.sh names nodes made on this machine: mpirun then
# runs in the nodes' hub, reaches each node through `scripts/nodes.sh agent`
# instead of ssh, and the ranks talk over TCP between nodes (shared memory
# only within one), on the nodes' subnet only.
#
# What this adds to plain mpirun, and why:
#   --allow-run-as-root   when you are root (containers): mpirun refuses
#                         otherwise, and the override variables are obscure
#   --oversubscribe       more ranks than cores is fine for learning (this
#                         machine has 2 cores; the tests run 3 ranks)
#   --bind-to none        like torchrun, leave scheduling to the OS: a rank
#                         pinned to one core cannot use libtorch's threads
#   -x DDP_TIMEOUT_SECS -x DDP_DEBUG
#                         pass the workbook's settings to every machine (on
#                         this one the ranks inherit them anyway)
#   --mca btl_vader_single_copy_mechanism none
#                         shared-memory copies without ptrace, which
#                         containers often forbid
#   --max-restarts N      like torchrun's: when the job fails, run it again
#                         with --resume (the program must write checkpoints:
#                         --checkpoint PATH), at most N times, saying why
#
# Exit status: mpirun's: 0 when every rank exited 0, otherwise the failing
# rank's status (1 when a rank aborted the job, as the MPI backend does on
# any error), and mpirun names that rank. With --max-restarts, the last
# attempt's.

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if ! command -v mpirun >/dev/null 2>&1; then
    echo "scripts/launch.sh: mpirun is not installed." >&2
    echo "    -> run scripts/setup.sh (it installs Open MPI), or: apt-get install openmpi-bin libopenmpi-dev" >&2
    exit 127
fi

# Our own flag out, the rest for mpirun; and the host file, if any.
max_restarts=0 hostfile="" previous="" args=()
while (($#)); do
    case "$1" in
        --max-restarts | --max-restarts=*)
            if [[ "$1" == *=* ]]; then value="${1#*=}"; else value="${2:-}"; shift; fi
            [[ "$value" =~ ^[0-9]+$ ]] || { echo "scripts/launch.sh: --max-restarts needs a count, got \`$value\`" >&2; exit 2; }
            max_restarts="$value"
            ;;
        *)
            case "$previous" in --hostfile | -hostfile | --machinefile | -machinefile) hostfile="$1" ;; esac
            [[ "$1" == --hostfile=* ]] && hostfile="${1#*=}"
            previous="$1"
            args+=("$1")
            ;;
    esac
    shift
done

options=(--oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none)
if [[ "$(id -u)" == 0 ]]; then
    options+=(--allow-run-as-root)
fi
for name in DDP_TIMEOUT_SECS DDP_DEBUG; do
    if [[ -n "${!name:-}" ]]; then
        options+=(-x "$name")
    fi
done

# A cluster of scripts/nodes.sh: its host file's first line names it.
cluster=""
if [[ -n "$hostfile" && -f "$hostfile" ]] &&
    [[ "$(head -n 1 "$hostfile")" =~ ^#\ ddpwb\ cluster\ ([a-z0-9]+): ]]; then
    cluster="${BASH_REMATCH[1]}"
    [[ -e "/run/netns/ddpwb-$cluster-hub" ]] || {
        echo "scripts/launch.sh: $hostfile names cluster $cluster, whose nodes are gone: scripts/nodes.sh up --name $cluster" >&2
        exit 2
    }
    options+=(--mca plm_rsh_agent "$REPO_ROOT/scripts/nodes.sh agent" --mca plm_rsh_no_tree_spawn 1
        --mca btl tcp,vader,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24)
fi

# Files of /dev/shm that the MPI backend makes for alloc_buffer
# (src/dist/mpi/shm/regions.rs) and unlinks a few milliseconds later: a job
# killed in between leaves one, holding memory until reboot. Its name
# carries the process that made it; once that process is gone, it goes.
remove_stale_shared_memory() {
    local file pid
    for file in /dev/shm/ddp-workbook-*; do
        [[ -e "$file" ]] || continue
        pid="${file#/dev/shm/ddp-workbook-}"
        pid="${pid%%-*}"
        if [[ "$pid" =~ ^[0-9]+$ && ! -e "/proc/$pid" ]]; then rm -f "$file" 2>/dev/null || true; fi
    done
}
remove_stale_shared_memory

if [[ -z "$cluster" && "$max_restarts" == 0 ]]; then
    exec mpirun "${options[@]}" "${args[@]}"
fi

if ((max_restarts > 0)) && [[ " ${args[*]} " != *" --checkpoint "* && " ${args[*]} " != *" --checkpoint="* ]]; then
    echo "scripts/launch.sh: --max-restarts resumes from the program's checkpoint: give it --checkpoint PATH (and --checkpoint-every N)" >&2
    exit 2
fi

# From here mpirun runs as a child: its stderr is kept to say why it failed,
# a signal to this script goes on to it, and on a cluster the processes it
# leaves on the nodes are swept up.
work="$(mktemp -d)"
mpirun_pid="" interrupted=""
trap 'rm -rf "$work"' EXIT
trap 'interrupted=1; [[ -n "$mpirun_pid" ]] && kill -TERM "$mpirun_pid" 2>/dev/null' TERM INT

# run_once ARGS...: one mpirun job; returns its exit status.
run_once() {
    export DDPWB_JOB="$$-$RANDOM$RANDOM" # marks this job's processes on the nodes
    local prefix=() status=0
    [[ -n "$cluster" ]] && prefix=(ip netns exec "ddpwb-$cluster-hub")
    rm -f "$work/stderr.fifo"
    mkfifo "$work/stderr.fifo"
    # Open MPI warns that it could not set the process group of the agent it
    # started, when the agent had already set it itself (a harmless race of
    # the ssh launcher, which a fast agent loses every time): not shown.
    # The filter's own pid is written down, so that it can be ended below.
    { echo "$BASHPID" >"$work/filter.pid" && exec grep --line-buffered -v \
        'plm:rsh: Warning: setpgid(.*) failed in parent'; } <"$work/stderr.fifo" |
        tee "$work/stderr" >&2 &
    local tee_pid=$!
    "${prefix[@]}" mpirun "${options[@]}" "$@" 2>"$work/stderr.fifo" &
    mpirun_pid=$!
    # A trapped signal ends `wait` early: wait again until mpirun is gone
    # (it passes the signal on to the ranks and cleans up first).
    while true; do
        status=0
        wait "$mpirun_pid" || status=$?
        kill -0 "$mpirun_pid" 2>/dev/null || break
    done
    mpirun_pid=""
    # Sweep first: a node agent that outlived mpirun holds its stderr open,
    # so waiting for the end of the stream first would wait for the agent.
    if [[ -n "$cluster" ]]; then
        "$REPO_ROOT/scripts/nodes.sh" sweep --name "$cluster" --job "$DDPWB_JOB" || true
    fi
    # What mpirun wrote is in the pipe already; whoever still holds it (a
    # process the sweep could not see) gets 1 s, then the filter ends.
    for _ in $(seq 1 10); do
        kill -0 "$tee_pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$tee_pid" 2>/dev/null; then
        kill "$(cat "$work/filter.pid" 2>/dev/null)" "$tee_pid" 2>/dev/null || true
    fi
    wait "$tee_pid" || true
    remove_stale_shared_memory
    return "$status"
}

# Why the last job failed, in one line: mpirun's or the first rank's words.
why_it_failed() {
    local status="$1" line
    line="$(grep -m 1 -E 'mpirun noticed that process rank|rank [0-9]+ of [0-9]+ failed|lost communication with a remote daemon|daemon has unexpectedly failed' "$work/stderr" || true)"
    line="${line%.}"
    echo "exit status $status${line:+: ${line}}"
}

attempt=0
while true; do
    status=0
    run_once "${args[@]}" || status=$?
    if ((status == 0 || attempt >= max_restarts)) || [[ -n "$interrupted" ]]; then
        ((attempt > 0)) && echo "scripts/launch.sh: attempt $((attempt + 1)) of $((max_restarts + 1)) ended with exit status $status" >&2
        exit "$status"
    fi
    attempt=$((attempt + 1))
    echo "scripts/launch.sh: the job failed ($(why_it_failed "$status")); restart $attempt of $max_restarts, with --resume from the last checkpoint" >&2
    [[ " ${args[*]} " == *" --resume "* ]] || args+=(--resume)
done
