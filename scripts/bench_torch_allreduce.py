#!/usr/bin/env python3
"""How long PyTorch's gloo all_reduce
takes on this machine, for the workbook's comparison of backends: 2
processes, a float32 tensor of each size given (MiB), one SUM all_reduce per
round after a barrier, timed on rank 0; the median over the rounds.
examples/bench_vs_pytorch.rs runs it next to the in-process and MPI backends:

    cargo run --release --features mpi --example bench_vs_pytorch

Run alone: .venv/bin/python scripts/bench_torch_allreduce.py --sizes 0.4 4 25
Prints one line per size: `allreduce MIB SECONDS`.
"""

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world_size, port, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    for mib in args.sizes:
        tensor = torch.ones(int(mib * 1024 * 1024 / 4))
        times = []
        for round_ in range(args.warmup + args.rounds):
            dist.barrier()
            started = time.perf_counter()
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
            if round_ >= args.warmup:
                times.append(time.perf_counter() - started)
        if rank == 0:
            print(f"allreduce {mib} {statistics.median(times):.9f}", flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.4, 4.0, 25.0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    mp.spawn(run, args=(args.world_size, free_port(), args), nprocs=args.world_size)


if __name__ == "__main__":
    main()
