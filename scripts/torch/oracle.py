"""PyTorch's own DistributedDataParallel as the
numerical oracle of the workbook. The workbook writes the stages to run
(stages.json), each stage's initial weights and each rank's batches
(safetensors); this script trains the PyTorch twins (models.py) on them
with torch.nn.parallel.DistributedDataParallel, gloo, float64, one thread
per process, stepping with plain SGD, AdamW or ZeroRedundancyOptimizer
over AdamW as the stage says (or, for the `fsdp_*` stages, under FSDP2's
fully_shard instead of DDP: run_fsdp_stage), and writes what it computed: the gradients
after every synced backward, the parameters after every step, the twin's forward on
the first batch before training, and the bucket layouts. tests/torch_oracle.rs
compares them with the workbook's, step by step.

Run by `cargo test --features solutions,mpi,nccl --test torch_oracle`; by hand:

    GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone \
        --nproc-per-node 2 scripts/torch/oracle.py DIR

DIR holds stages.json and, per stage, STAGE/weights.safetensors and
STAGE/batches_rank{r}.safetensors; it receives STAGE/torch_rank{r}.safetensors
and STAGE/torch_layout_rank{r}.txt (or, for an FSDP stage,
STAGE/torch_shard_rows_rank{r}.txt), bf16_sums/gloo.safetensors (gloo's
bf16 all-reduce, for the order of its additions) and
f64_reduce_scatter/gloo.safetensors (gloo's float64 reduce-scatter, FSDP2's).
"""

import contextlib
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import Gpt, GptConfig, Linear, Mlp  # noqa: E402
from safetensors_io import load_file, save_file  # noqa: E402
from teardown import leave  # noqa: E402


class Branchy(nn.Module):
    """The twin of tests/torch_oracle/branchy.rs: a trunk, a head, and a
    branch that the forward skips when `use_branch` is off, so that some
    ranks leave its parameters without a gradient in some steps."""

    def __init__(self, sizes):
        super().__init__()
        inputs, hidden, outputs = sizes
        self.trunk = Linear(inputs, hidden)
        self.branch = Linear(hidden, outputs)
        self.head = Linear(hidden, outputs)
        self.use_branch = True

    def forward(self, x):
        h = self.trunk(x).tanh()
        out = self.head(h)
        return out + self.branch(h) if self.use_branch else out


def build(model):
    """The twin named by a stage's `model` entry, in float64."""
    if model["kind"] == "mlp":
        return Mlp(model["sizes"]).double()
    if model["kind"] == "branchy":
        return Branchy(model["sizes"]).double()
    if model["kind"] == "gpt":
        return Gpt(GptConfig(**model["config"])).double()
    raise ValueError(f"stages.json names an unknown model kind {model['kind']!r}")


def loss_of(kind, output, target):
    """The workbook's losses, with the same operations in the same order."""
    if kind == "gpt":  # next-token cross entropy: log_softmax, then nll_loss
        vocab = output.shape[-1]
        return F.nll_loss(output.log_softmax(-1).reshape(-1, vocab), target.reshape(-1))
    return F.mse_loss(output, target)


def bucket_layout(ddp, names_by_ptr):
    """The reducer's buckets now, in all-reduce order: bytes and member names.
    (`_get_ddp_logging_data()["bucket_sizes"]` reports the construction layout
    only, also after the rebuild, so it is written next to this.)"""
    buckets = ddp.reducer._get_zeros_like_grad_buckets()
    return [
        {
            "bytes": b.buffer().numel() * b.buffer().element_size(),
            "names": [names_by_ptr[p.data_ptr()] for p in b.parameters()],
        }
        for b in buckets
    ]


def adamw_optimizer(stage, ddp):
    """The optimizer of an AdamW stage: PyTorch's AdamW, or ZeRO-1 with
    AdamW inside, on the single-tensor path (foreach=False), whose
    arithmetic the workbook's AdamW follows operation for operation. None
    for the SGD stages, which step by hand."""
    lr, weight_decay = stage["lr"], stage["weight_decay"]
    if stage["optimizer"] == "adamw":
        return torch.optim.AdamW(ddp.parameters(), lr=lr, weight_decay=weight_decay, foreach=False)
    if stage["optimizer"] == "zero1":
        # ANCHOR: zero
        # Each rank keeps AdamW's moments for its share of the parameters
        # only; DDP still all-reduces every gradient.
        optimizer = ZeroRedundancyOptimizer(
            ddp.parameters(),
            optimizer_class=torch.optim.AdamW,
            lr=lr,
            weight_decay=weight_decay,
            foreach=False,
        )
        # ANCHOR_END: zero
        return optimizer
    if stage["optimizer"] != "sgd":
        raise ValueError(f"stages.json names an unknown optimizer {stage['optimizer']!r}")
    return None


def run_stage(stage, directory, rank):
    if stage["fsdp"] is not None:
        run_fsdp_stage(stage, directory, rank)
        return
    folder = os.path.join(directory, stage["name"])
    model = build(stage["model"])
    model.load_state_dict(load_file(os.path.join(folder, "weights.safetensors")), strict=True)
    batches = load_file(os.path.join(folder, f"batches_rank{rank}.safetensors"))
    kind = stage["model"]["kind"]
    out = {}
    with torch.no_grad():  # the twin's forward, before DDP touches anything
        out["forward"] = model(batches["step0.mb0.input"])

    # PyTorch's first-bucket cap is a module attribute that DDP reads when
    # it is built (and uses at the rebuild, with the default bucket_cap_mb).
    default_first_bucket_bytes = dist._DEFAULT_FIRST_BUCKET_BYTES
    if stage["first_bucket_bytes"] is not None:
        dist._DEFAULT_FIRST_BUCKET_BYTES = stage["first_bucket_bytes"]
    ddp = DistributedDataParallel(model, **stage["ddp"])
    dist._DEFAULT_FIRST_BUCKET_BYTES = default_first_bucket_bytes
    register_comm_hook(ddp, stage)
    names = [name for name, _ in model.named_parameters()]
    names_by_ptr = {p.data_ptr(): name for name, p in model.named_parameters()}
    layouts = {
        "parameters": names,
        "logged_at_construction": ddp._get_ddp_logging_data().get("bucket_sizes"),
        "at_construction": bucket_layout(ddp, names_by_ptr),
    }
    micro_batches = stage["micro_batches"]
    optimizer = adamw_optimizer(stage, ddp)
    for step in range(stage["steps"]):
        if optimizer is not None:
            optimizer.zero_grad()  # PyTorch's: every .grad back to None
        for p in model.parameters():  # SGD: in place, as tch's zero_grad does
            if p.grad is not None:
                p.grad.zero_()
        for m in range(micro_batches):
            key = f"step{step}.mb{m}"
            if kind == "branchy":
                model.use_branch = bool(batches[f"{key}.use_branch"].item())
            last = m + 1 == micro_batches
            # "all_but_last": forward and backward inside no_sync;
            # "forward_only": the forward inside, the backward outside: PyTorch
            # reads the flag at forward time, so that backward sends nothing.
            inside = stage["no_sync"] != "none" and not last
            with ddp.no_sync() if inside else contextlib.nullcontext():
                loss = loss_of(kind, ddp(batches[f"{key}.input"]), batches[f"{key}.target"]) / float(micro_batches)
                if stage["no_sync"] != "forward_only" or last:
                    loss.backward()
            if stage["no_sync"] == "forward_only" and not last:
                loss.backward()
            # ZeRO-1: the workbook's ranks keep their own gradients until the
            # step averages them, PyTorch's DDP averages them in backward.
            if (stage["record_micro_batches"] or last) and stage["optimizer"] != "zero1":
                for name, p in zip(names, model.parameters()):
                    if p.grad is not None:
                        out[f"{key}.grad.{name}"] = p.grad.clone()
        if optimizer is not None:
            optimizer.step()
        else:
            with torch.no_grad():  # plain SGD, written out as the workbook's side does
                lr = stage["lr"]
                for p in model.parameters():
                    if p.grad is not None:
                        p.sub_(p.grad * lr)
        for name, p in zip(names, model.parameters()):
            out[f"step{step}.param.{name}"] = p.detach().clone()
    layouts["after_training"] = bucket_layout(ddp, names_by_ptr)
    save_file(out, os.path.join(folder, f"torch_rank{rank}.safetensors"))
    write_layouts(layouts, os.path.join(folder, f"torch_layout_rank{rank}.txt"))


def run_fsdp_stage(stage, directory, rank):
    """A stage under FSDP2 (`fully_shard`) instead of DDP: each transformer
    block a unit and the root another (`"units": "blocks"`), or the root
    alone, on a 1-D CPU mesh over gloo. Every parameter is a DTensor
    sharded along dim 0; what is written is gathered back whole
    (`full_tensor()`): the averaged gradients after the last micro-batch of
    each step and the parameters after each step, under the names the DDP
    stages use. Accumulation ("no_sync": "all_but_last") is FSDP2's
    `set_requires_gradient_sync(False)` on all but the last micro-batch."""
    folder = os.path.join(directory, stage["name"])
    model = build(stage["model"])
    model.load_state_dict(load_file(os.path.join(folder, "weights.safetensors")), strict=True)
    batches = load_file(os.path.join(folder, f"batches_rank{rank}.safetensors"))
    kind = stage["model"]["kind"]
    out = {}
    with torch.no_grad():
        out["forward"] = model(batches["step0.mb0.input"])
    fsdp = stage["fsdp"]
    if stage["no_sync"] not in ("none", "all_but_last"):
        raise ValueError(f"an FSDP stage accumulates with no_sync none or all_but_last, not {stage['no_sync']!r}")
    # ANCHOR: fully_shard
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    reshard = fsdp["reshard_after_forward"]
    if fsdp["units"] == "blocks":
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    # ANCHOR_END: fully_shard
    names = [name for name, _ in model.named_parameters()]
    # The rows of each parameter this rank keeps: `NAME ROWS` per line.
    with open(os.path.join(folder, f"torch_shard_rows_rank{rank}.txt"), "w") as f:
        for name, p in model.named_parameters():
            f.write(f"{name} {p.to_local().shape[0]}\n")
    optimizer = None
    if stage["optimizer"] == "adamw":
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=stage["lr"], weight_decay=stage["weight_decay"], foreach=False
        )
    elif stage["optimizer"] != "sgd":
        raise ValueError(f"an FSDP stage steps with sgd or adamw, not {stage['optimizer']!r}")
    micro_batches = stage["micro_batches"]
    for step in range(stage["steps"]):
        model.zero_grad(set_to_none=True)
        for m in range(micro_batches):
            key = f"step{step}.mb{m}"
            if kind == "branchy":
                model.use_branch = bool(batches[f"{key}.use_branch"].item())
            last = m + 1 == micro_batches
            if stage["no_sync"] == "all_but_last":
                model.set_requires_gradient_sync(last)
            loss = loss_of(kind, model(batches[f"{key}.input"]), batches[f"{key}.target"]) / float(micro_batches)
            loss.backward()
            if last:  # every rank gathers (a collective), in the same order
                for name, p in zip(names, model.parameters()):
                    if p.grad is not None:
                        out[f"{key}.grad.{name}"] = p.grad.full_tensor()
        if optimizer is not None:
            optimizer.step()
        else:
            with torch.no_grad():  # plain SGD, on each rank's shard
                for p in model.parameters():
                    if p.grad is not None:
                        p.sub_(p.grad * stage["lr"])
        for name, p in zip(names, model.parameters()):
            out[f"step{step}.param.{name}"] = p.detach().full_tensor()
    save_file(out, os.path.join(folder, f"torch_rank{rank}.safetensors"))


def register_comm_hook(ddp, stage):
    """Chapter 12's stages: PyTorch's own bf16_compress_hook on every bucket
    (cast to bf16, divide by the world size in bf16, all-reduce, copy back)."""
    if stage["comm_hook"] is None:
        return
    if stage["comm_hook"] != "bf16_compress_hook":
        raise ValueError(f"stages.json names an unknown comm hook {stage['comm_hook']!r}")
    # ANCHOR: register
    ddp.register_comm_hook(state=None, hook=default_hooks.bf16_compress_hook)
    # ANCHOR_END: register


# Buffer lengths for gloo's bf16 sums: short ones, odd ones, and one over
# 6 MiB, where gloo cuts each rank's chunk into more than two segments.
BF16_SUM_LENGTHS = (10, 1000, 4801, 100_003, 3_500_001)


def bf16_sums(directory, rank, world_size):
    """gloo's all-reduce (SUM) of bf16 buffers of BF16_SUM_LENGTHS: every
    rank's contribution and the sum, as rank 0 sees them. bf16 rounds each
    partial sum, so the bits show gloo's order of additions, which the
    workbook's stand-in for gloo (tests/torch_oracle/gloo_order.rs) must
    reproduce."""
    out = {}
    for length in BF16_SUM_LENGTHS:
        g = torch.Generator().manual_seed(1300 + rank)
        # magnitudes over several powers of two, so that roundings differ
        mine = (torch.randn(length, generator=g) * torch.randn(length, generator=g).exp()).bfloat16()
        everyone = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(everyone, mine)
        total = mine.clone()
        dist.all_reduce(total)
        for r, contribution in enumerate(everyone):
            out[f"{length}.rank{r}"] = contribution
        out[f"{length}.sum"] = total
    if rank == 0:
        folder = os.path.join(directory, "bf16_sums")
        os.makedirs(folder, exist_ok=True)
        save_file(out, os.path.join(folder, "gloo.safetensors"))


# Buffer lengths for gloo's float64 reduce-scatter: per rank, before the
# world size multiplies them; the last over 1 MiB of output per rank.
F64_REDUCE_SCATTER_LENGTHS = (1, 5, 16, 1001, 140_001)


def f64_reduce_scatters(directory, rank, world_size):
    """gloo's float64 reduce_scatter_tensor (SUM), FSDP2's gradient
    collective: every rank's input and every rank's output, as rank 0 sees
    them. float64 rounds each partial sum too, so the bits show gloo's order
    of additions, which tests/torch_oracle/gloo_order.rs must reproduce."""
    out = {}
    for length in F64_REDUCE_SCATTER_LENGTHS:
        g = torch.Generator().manual_seed(1700 + rank)
        mine = torch.randn(length * world_size, generator=g, dtype=torch.float64)
        mine = mine * torch.randn(length * world_size, generator=g, dtype=torch.float64).mul(8).exp()
        inputs = [torch.empty_like(mine) for _ in range(world_size)]
        dist.all_gather(inputs, mine)
        output = torch.empty(length, dtype=torch.float64)
        dist.reduce_scatter_tensor(output, mine.clone())
        outputs = [torch.empty_like(output) for _ in range(world_size)]
        dist.all_gather(outputs, output)
        for r in range(world_size):
            out[f"{length}.rank{r}"] = inputs[r]
            out[f"{length}.output{r}"] = outputs[r]
    if rank == 0:
        folder = os.path.join(directory, "f64_reduce_scatter")
        os.makedirs(folder, exist_ok=True)
        save_file(out, os.path.join(folder, "gloo.safetensors"))


def write_layouts(layouts, path):
    """One line per bucket, `WHEN BYTES NAME,NAME,...`, the logged sizes as
    `logged_at_construction SIZES`, and the parameters in DDP's order as
    `parameters NAME,NAME,...`: plain text, which the Rust test reads
    without a JSON library."""
    with open(path, "w") as f:
        f.write(f"parameters {','.join(layouts['parameters'])}\n")
        f.write(f"logged_at_construction {layouts['logged_at_construction'].replace(' ', '')}\n")
        for when in ("at_construction", "after_training"):
            for bucket in layouts[when]:
                f.write(f"{when} {bucket['bytes']} {','.join(bucket['names'])}\n")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: torchrun --standalone --nproc-per-node N scripts/torch/oracle.py DIR")
    directory = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    with open(os.path.join(directory, "stages.json")) as f:
        stages = json.load(f)["stages"]
    for stage in stages:
        run_stage(stage, directory, rank)
        dist.barrier()
    bf16_sums(directory, rank, dist.get_world_size())
    f64_reduce_scatters(directory, rank, dist.get_world_size())
    dist.barrier()
    dist.destroy_process_group()
    leave()  # skips the interpreter's shutdown (scripts/torch/teardown.py)


if __name__ == "__main__":
    main()
