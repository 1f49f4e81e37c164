#!/usr/bin/env bash
# scripts/launch.sh: start a program as N ranks, one process each, with Open
# MPI's mpirun: the workbook's `torchrun`. Every argument goes to mpirun.
#
#   scripts/launch.sh -np 2 target/release/examples/train --backend mpi
#   scripts/launch.sh -np 8 --hostfile hosts --map-by ppr:4:node \
#       target/release/examples/train --backend mpi      (two machines, 4 each)
#
# A host file lists one machine per line with its slots, `node1 slots=4`.
# Every machine needs the same program at the same path and passwordless ssh
# from the first one; the ranks then find each other over TCP.
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
# Exit status: mpirun's: 0 when every rank exited 0, otherwise the failing
# rank's status (1 when a rank aborted the job, as the MPI backend does on
# any error), and mpirun names that rank.

set -euo pipefail

if ! command -v mpirun >/dev/null 2>&1; then
    echo "scripts/launch.sh: mpirun is not installed." >&2
    echo "    -> run scripts/setup.sh (it installs Open MPI), or: apt-get install openmpi-bin libopenmpi-dev" >&2
    exit 127
fi

options=(--oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none)
if [[ "$(id -u)" == 0 ]]; then
    options+=(--allow-run-as-root)
fi
for name in DDP_TIMEOUT_SECS DDP_DEBUG; do
    if [[ -n "${!name:-}" ]]; then
        options+=(-x "$name")
    fi
done

exec mpirun "${options[@]}" "$@"
