#!/usr/bin/env python3
"""scripts/bench_torch_ddp.py: the workbook's training run written with
PyTorch's own DistributedDataParallel, for a head-to-head on equal work:
the same tiny GPT (src/models/gpt.rs: 2 blocks, 4 heads, width 64, 104,192
parameters; its PyTorch twin, scripts/torch/models.py), the same sorting task
(src/data.rs, TokenTask::standard), 2 processes on the gloo backend, 16
sequences per rank per micro-batch, 2 micro-batches per step (no_sync on the
first), AdamW at 3e-3, one libtorch thread per process.
examples/bench_vs_pytorch.rs runs it in alternating rounds with ours:

    cargo run --release --features mpi --example bench_vs_pytorch

Run alone: .venv/bin/python scripts/bench_torch_ddp.py --steps 200
On GPUs:   .venv/bin/python scripts/bench_torch_ddp.py --device cuda --world-size 1
           (NCCL, one process per GPU: the world size at most the GPU count)
Prints `tokens_per_second N` (rank 0's, over the timed steps).
"""

import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch"))
from models import Gpt  # noqa: E402  the twin of src/models/gpt.rs, GptConfig::tiny()

N_SYMBOLS, HALF_LEN = 15, 16


def sorting_task(seed, n):
    """Sequences `first | separator | sorted(first)`, as TokenTask::standard."""
    generator = torch.Generator().manual_seed(seed)
    first = torch.randint(N_SYMBOLS, (n, HALF_LEN), generator=generator)
    separator = torch.full((n, 1), N_SYMBOLS)
    return torch.cat([first, separator, first.sort(dim=1).values], dim=1)


def masked_cross_entropy(logits, targets, mask):
    log_probs = logits.log_softmax(-1)
    picked = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return -(picked * mask).sum() / mask.sum()


def run(rank, world_size, port, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # On GPUs: NCCL, rank r on cuda:r, as the workbook's --backend nccl.
    device = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world_size, device_id=device if args.device == "cuda" else None)
    torch.set_num_threads(1)
    torch.manual_seed(1337)
    sequences = sorting_task(1337, args.train_sequences).to(device)
    model = DistributedDataParallel(Gpt().to(device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    sampler = DistributedSampler(range(len(sequences)), world_size, rank, shuffle=True, seed=1337)
    mask = (torch.arange(2 * HALF_LEN, device=device) >= HALF_LEN).float().expand(args.batch_size, -1)
    epoch, shard, position = 0, list(sampler), 0

    def next_micro_batch():
        nonlocal epoch, shard, position
        if position + args.batch_size > len(shard):
            epoch += 1
            sampler.set_epoch(epoch)
            shard, position = list(sampler), 0
        rows = sequences[shard[position : position + args.batch_size]]
        position += args.batch_size
        return rows[:, : 2 * HALF_LEN], rows[:, 1:]

    started = time.perf_counter()
    for _ in range(args.steps):
        optimizer.zero_grad()
        for i in range(args.accum_steps):
            inputs, targets = next_micro_batch()
            loss = masked_cross_entropy(model(inputs), targets, mask) / args.accum_steps
            if i + 1 < args.accum_steps:
                with model.no_sync():
                    loss.backward()
            else:
                loss.backward()
            loss.item()  # read each loss, as the workbook's loop does
        optimizer.step()
    if args.device == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - started
    if rank == 0:
        tokens = args.steps * args.batch_size * args.accum_steps * world_size * 2 * HALF_LEN
        print(f"tokens_per_second {tokens / elapsed:.1f}", flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--accum-steps", type=int, default=2)
    parser.add_argument("--train-sequences", type=int, default=20_000)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: NCCL, one process per GPU (--world-size at most the GPU count)")
    args = parser.parse_args()
    mp.spawn(run, args=(args.world_size, free_port(), args), nprocs=args.world_size)


if __name__ == "__main__":
    main()
