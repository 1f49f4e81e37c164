#!/usr/bin/env python3
"""The workbook's training run written with
PyTorch's own DistributedDataParallel, for a head-to-head on equal work:
the same tiny GPT (src/models/gpt.rs: 2 blocks, 4 heads, width 64, 104,192
parameters; its PyTorch twin, scripts/torch/models.py), the same sorting task
(src/data.rs, TokenTask::standard), 2 processes on the gloo backend, 16
sequences per rank per micro-batch, 2 micro-batches per step (no_sync on the
first), AdamW at 3e-3, one libtorch thread per process.
examples/bench_vs_pytorch.rs runs it in alternating rounds with ours:

    cargo run --release --features mpi --example bench_vs_pytorch

At the larger sizes (--size 2m, 10m, 25m: scripts/torch/models.py's SIZES,
GptConfig::of_size of the workbook), `cargo run --release --features mpi
--example bench_sizes` runs it the same way, with --zero (ZeRO-1) and
--count-bytes.

Run alone: .venv/bin/python scripts/bench_torch_ddp.py --steps 200
           .venv/bin/python scripts/bench_torch_ddp.py --setting best
           .venv/bin/python scripts/bench_torch_ddp.py --world-size 1 --no-ddp
On GPUs:   .venv/bin/python scripts/bench_torch_ddp.py --device cuda --world-size 1
           (NCCL, one process per GPU: the world size at most the GPU count)
Prints `tokens_per_second N` and `step_ms T` (rank 0's, over the timed
steps after --warmup-steps untimed ones), `first_step_ms F` (the first
untimed step), `loss L` (rank 0's last step's) and `peak_rss_kib K` (the
largest VmHWM of the ranks' processes: their peak resident memory).
--count-bytes adds `wire_bytes_per_step B`: per rank, over the timed steps,
what its collectives put on the wire (a ring all-reduce of S bytes on N
ranks sends 2(N-1)/N x S per rank, a broadcast (N-1)/N x S on average), as
examples/support/wire_bytes.rs counts the workbook's; it wraps DDP in a
counting comm hook, so time without it.

--phases (with --no-ddp --world-size 1) adds `phase_ms NAME MS` per timed
step for data, forward (with the loss and reading it), backward and
optimizer (zero_grad and step): the PyTorch side of
`bench_sizes -- --profile`.

--fsdp full|grad-op: PyTorch's FSDP2, `fully_shard` on each transformer
block and then on the root (a device mesh of the world's ranks on the CPU,
gloo, float32), reshard_after_forward=True (full: FULL_SHARD, ZeRO-3) or
False (grad-op: SHARD_GRAD_OP, ZeRO-2), AdamW over the sharded parameters
(fused with --setting best); the first micro-batch under
set_requires_gradient_sync(False), FSDP2's no_sync, as the workbook's
--shard runs. --count-bytes counts its all-gathers and reduce-scatters
((N-1)/N x the gathered size each).

--zero: ZeRO-1, torch.distributed.optim.ZeroRedundancyOptimizer around
AdamW, inside DDP (which all-reduces the gradients; each rank then steps
its partition of the parameters and broadcasts it). With --setting best,
also parameters_as_bucket_view=True (one broadcast per rank, not one per
parameter) and fused AdamW.

--setting defaults: DistributedDataParallel(model) and torch.optim.AdamW as
they come. --setting best: PyTorch's fastest CPU settings for this run:
AdamW(fused=True) (one step of the tiny GPT's 58 tensors on one thread:
0.25 ms fused, 0.78 foreach, 1.02 the default per-tensor loop, load 10 to
13, from scripts/bench_torch_adamw.py, which `cargo run --release --example
bench_optimizer` runs), gradient_as_bucket_view=True (no copy of the
gradients into the bucket and back), broadcast_buffers=False (the model's
one buffer, the causal mask, never changes; by default DDP broadcasts it
from rank 0 before every forward: a gloo call and a wait for rank 0 per
micro-batch). Not static_graph=True, which would apply (the same parameters
get gradients every step) but fails with no_sync in torch 2.11.
--no-ddp: one process, no process group, no wrapper, the same per-rank
work: the baseline for the cost of distribution.

What this script did wrong before, and what it cost (issue 24). Found by
counting c10d calls with torch.profiler and DDP's comm hook, then measured
in alternating runs of 200 steps under `chrt -r 1` (real-time priority, so
that the other work on the shared 2-core machine, load average 8 to 10,
waited; 2026-11-24):

    for i in 1 2; do for flag in "" --forward-outside-no-sync; do
        chrt -r 1 .venv/bin/python scripts/bench_torch_ddp.py $flag | grep step_ms; done; done

- `no_sync()` wrapped only the first micro-batch's backward. DDP decides in
  forward whether the coming backward syncs (its _post_forward prepares the
  reducer), so both micro-batches all-reduced the gradients: two gloo
  all-reduces per step instead of one. The forward now runs inside no_sync
  too. Cost: a step took 20.1 to 21.1 ms with the old loop
  (--forward-outside-no-sync keeps it, to measure it), 18.5 to 20.1 without:
  about 1.5 ms, 8%.
- the rate counted the first steps, where DDP builds its buckets and AdamW
  its state: now --warmup-steps (20) run untimed, on both sides of the
  comparison. Cost: small; the first step took 28 to 37 ms where the
  following ones take about 20, under 0.5% of 200 steps.
- each micro-batch was picked with a Python list (`sequences[[...]]`, a new
  index tensor every time); now with index_select on a slice of one index
  tensor: 0.2 -> 0.14 ms per step (timed under load), within the noise.
- torch.set_num_threads(1) ran after init_process_group; now first. No
  difference measured (nothing ran on more threads before it), nor from
  OMP_NUM_THREADS=1 in the environment: 17.5 to 17.6 ms per step with it
  (and one run of 23.3), 17.6 to 18.6 without, --setting best, 4 runs each
  alternating under chrt -r 1, load 5 to 10.
The old script (git history) under the same conditions made 99,100 and
100,300 tokens/s, this one at its defaults 102,100 to 110,900: its mistakes
cost about 5%, not the 18% issue 24 saw between it and an independent twin;
under chrt neither side of that gap is left, so the rest was the load of
the machine at the time, which a 2-process run on 2 cores feels at once.
Unchanged, because the workbook does the same: each micro-batch's loss is
read (`.item()`), the mask is built once, zero_grad sets the gradients to
None (the default).
"""

import argparse
import os
import socket
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch"))
from models import SIZES, Gpt  # noqa: E402  the twin of src/models/gpt.rs, GptConfig::of_size
from teardown import leave  # noqa: E402

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


def wrap(model, args, device):
    """The model as this run trains it: bare (--no-ddp), sharded (--fsdp) or
    in DDP, with the setting's options."""
    if args.no_ddp:
        return model
    if args.fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        reshard = args.fsdp == "full"  # grad-op keeps the gathered parameters until backward
        for block in model.blocks:  # one unit per transformer block, as the workbook's FullyShard
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        return fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    if args.setting == "defaults":
        return DistributedDataParallel(model)
    # Not static_graph=True: with no_sync it fails in torch 2.11 (reducer.cpp:1705,
    # "expect_autograd_hooks_ INTERNAL ASSERT FAILED" in the first synced backward).
    return DistributedDataParallel(model, gradient_as_bucket_view=True, broadcast_buffers=False)


def optimizer_for(model, args):
    fused = {"fused": True} if args.setting == "best" else {}
    if args.zero:
        return ZeroRedundancyOptimizer(
            model.parameters(), optimizer_class=torch.optim.AdamW,
            parameters_as_bucket_view=args.setting == "best", lr=3e-3, weight_decay=0.0, **fused)
    return torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0, **fused)


class WireBytes:
    """What this rank's collectives put on the wire (--count-bytes): DDP's
    buckets through a comm hook, ZeRO's broadcasts through dist.broadcast,
    FSDP's all-gathers and reduce-scatters through dist's functions."""

    def __init__(self, world_size):
        self.world_size, self.bytes = world_size, 0

    def add(self, tensor, factor):
        self.bytes += tensor.numel() * tensor.element_size() * factor * (self.world_size - 1) / self.world_size

    def install(self, model):
        if not isinstance(model, DistributedDataParallel):
            self.install_fsdp()
            return

        def all_reduce_hook(state, bucket):
            self.add(bucket.buffer(), 2)
            return default_hooks.allreduce_hook(None, bucket)

        model.register_comm_hook(None, all_reduce_hook)
        broadcast = dist.broadcast

        def counted_broadcast(tensor, *args, **kwargs):
            self.add(tensor, 1)
            return broadcast(tensor, *args, **kwargs)

        dist.broadcast = counted_broadcast  # ZeroRedundancyOptimizer calls dist.broadcast

    def install_fsdp(self):
        # FSDP2 (_fsdp_collectives.py) calls dist.all_gather_into_tensor and
        # dist.reduce_scatter_tensor at call time: the gathered (the whole)
        # tensor is the output of the one and the input of the other.
        gather, scatter = dist.all_gather_into_tensor, dist.reduce_scatter_tensor

        def counted_gather(output, *args, **kwargs):
            self.add(output, 1)
            return gather(output, *args, **kwargs)

        def counted_scatter(output, input, *args, **kwargs):
            self.add(input, 1)
            return scatter(output, input, *args, **kwargs)

        dist.all_gather_into_tensor, dist.reduce_scatter_tensor = counted_gather, counted_scatter


def peak_rss_kib():
    """This process's VmHWM: the most resident memory it has held."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1])


def run(rank, world_size, port, args):
    # On GPUs: NCCL, rank r on cuda:r, as the workbook's --backend nccl.
    device = torch.device(args.device, rank) if args.device == "cuda" else torch.device("cpu")
    torch.set_num_threads(1)  # before any work: one thread per rank, as the workbook's ranks
    if not args.no_ddp:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        backend = "nccl" if args.device == "cuda" else "gloo"
        cuda = device if args.device == "cuda" else None
        dist.init_process_group(backend, rank=rank, world_size=world_size, device_id=cuda)
    torch.manual_seed(1337)
    sequences = sorting_task(1337, args.train_sequences).to(device)
    model = wrap(Gpt(SIZES[args.size]).to(device), args, device)
    optimizer = optimizer_for(model, args)
    wire = WireBytes(world_size) if args.count_bytes else None
    if wire:
        wire.install(model)
    # --no-ddp takes rank 0's shard of 2: the per-rank work of the 2-rank run.
    shards = max(world_size, 2) if args.no_ddp else world_size
    sampler = DistributedSampler(range(len(sequences)), shards, rank, shuffle=True, seed=1337)
    mask = (torch.arange(2 * HALF_LEN, device=device) >= HALF_LEN).float().expand(args.batch_size, -1)
    epoch, shard, position = 0, torch.tensor(list(sampler), device=device), 0

    def next_micro_batch():
        nonlocal epoch, shard, position
        if position + args.batch_size > len(shard):
            epoch += 1
            sampler.set_epoch(epoch)
            shard, position = torch.tensor(list(sampler), device=device), 0
        rows = sequences.index_select(0, shard[position : position + args.batch_size])
        position += args.batch_size
        return rows[:, : 2 * HALF_LEN], rows[:, 1:]

    # --phases: milliseconds in each part of the timed steps, the clock read
    # between the parts (on a CPU every call has finished when it returns).
    phases = {"data": 0.0, "forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    clock = [time.perf_counter()]

    def lap(phase):
        now = time.perf_counter()
        phases[phase] += now - clock[0]
        clock[0] = now

    def step():
        if args.phases:
            return timed_step()
        optimizer.zero_grad()
        loss_sum = 0.0
        for i in range(args.accum_steps):
            # Under no_sync for all but the last micro-batch: its forward too,
            # since DDP decides in forward whether the backward syncs.
            skip = i + 1 < args.accum_steps and not args.no_ddp
            if args.fsdp:  # FSDP2's no_sync: the full gradients add up, the last backward sends
                model.set_requires_gradient_sync(not skip)
                inputs, targets = next_micro_batch()
                loss = masked_cross_entropy(model(inputs), targets, mask) / args.accum_steps
                loss.backward()
                loss_sum += loss.item()
                continue
            around_forward = model.no_sync() if skip and not args.forward_outside_no_sync else nullcontext()
            with around_forward:
                inputs, targets = next_micro_batch()
                loss = masked_cross_entropy(model(inputs), targets, mask) / args.accum_steps
                with model.no_sync() if skip else nullcontext():
                    loss.backward()
            loss_sum += loss.item()  # read each loss, as the workbook's loop does
        optimizer.step()
        return loss_sum

    def timed_step():  # one process: the plain step, its parts timed
        clock[0] = time.perf_counter()
        optimizer.zero_grad()
        lap("optimizer")
        loss_sum = 0.0
        for _ in range(args.accum_steps):
            inputs, targets = next_micro_batch()
            lap("data")
            loss = masked_cross_entropy(model(inputs), targets, mask) / args.accum_steps
            loss_sum += loss.item()
            lap("forward")
            loss.backward()
            lap("backward")
        optimizer.step()
        lap("optimizer")
        return loss_sum

    first_started = time.perf_counter()
    for i in range(args.warmup_steps):
        step()
        if i == 0:
            first_step = time.perf_counter() - first_started
    if args.device == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    for phase in phases:  # the timed steps only
        phases[phase] = 0.0
    if wire:
        wire.bytes = 0  # the timed steps only
    for _ in range(args.steps):
        loss = step()
    if args.device == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - started
    peak = torch.tensor([peak_rss_kib()], dtype=torch.float64)
    if not args.no_ddp:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)  # the largest rank's
    if rank == 0:
        tokens = args.steps * args.batch_size * args.accum_steps * world_size * 2 * HALF_LEN
        print(f"tokens_per_second {tokens / elapsed:.1f}", flush=True)
        print(f"step_ms {elapsed / args.steps * 1e3:.4f}", flush=True)
        if args.warmup_steps > 0:
            print(f"first_step_ms {first_step * 1e3:.4f}", flush=True)
        print(f"loss {loss:.6f}", flush=True)
        print(f"peak_rss_kib {peak.item():.0f}", flush=True)
        if wire:
            print(f"wire_bytes_per_step {wire.bytes / args.steps:.0f}", flush=True)
        for phase, seconds in phases.items() if args.phases else ():
            print(f"phase_ms {phase} {seconds / args.steps * 1e3:.4f}", flush=True)
    if not args.no_ddp:
        dist.destroy_process_group()
        # Without this, a rank at the 2m size sometimes hung in the
        # interpreter's shutdown after printing (gloo's leftovers; see teardown.py).
        leave()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="timed optimizer steps")
    parser.add_argument("--warmup-steps", type=int, default=20, help="untimed steps before them")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--accum-steps", type=int, default=2)
    parser.add_argument("--train-sequences", type=int, default=20_000)
    parser.add_argument("--setting", choices=["defaults", "best"], default="defaults",
                        help="DDP and AdamW as they come, or at their fastest on a CPU")
    parser.add_argument("--no-ddp", action="store_true",
                        help="one process without DDP or a process group, rank 0's work of 2 ranks")
    parser.add_argument("--forward-outside-no-sync", action="store_true",
                        help="this script's old mistake: only the backward under no_sync (both micro-batches sync)")
    parser.add_argument("--size", choices=list(SIZES), default="tiny",
                        help="the GPT's size, scripts/torch/models.py's SIZES (GptConfig::of_size)")
    parser.add_argument("--zero", action="store_true",
                        help="ZeRO-1: ZeroRedundancyOptimizer around AdamW, inside DDP")
    parser.add_argument("--fsdp", choices=["full", "grad-op"],
                        help="FSDP2's fully_shard per block and at the root: FULL_SHARD or SHARD_GRAD_OP")
    parser.add_argument("--count-bytes", action="store_true",
                        help="print wire_bytes_per_step (a counting comm hook: time without it)")
    parser.add_argument("--phases", action="store_true",
                        help="with --no-ddp: print phase_ms data|forward|backward|optimizer per timed step")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: NCCL, one process per GPU (--world-size at most the GPU count)")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup_steps < 0:
        parser.error("--steps must be at least 1 and --warmup-steps at least 0")
    if args.no_ddp and (args.zero or args.count_bytes or args.fsdp):
        parser.error("--zero, --fsdp and --count-bytes need a process group: drop --no-ddp")
    if args.phases and not args.no_ddp:
        parser.error("--phases times one process's step: add --no-ddp --world-size 1")
    if args.zero and args.fsdp:
        parser.error("--zero (ZeRO-1 in DDP) and --fsdp are different strategies: give one")
    if args.no_ddp:
        if args.world_size != 1:
            parser.error("--no-ddp runs one process: give --world-size 1")
        run(0, 1, None, args)
        return
    mp.spawn(run, args=(args.world_size, free_port(), args), nprocs=args.world_size)


if __name__ == "__main__":
    main()
