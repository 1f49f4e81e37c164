#!/usr/bin/env python3
"""One torch.optim.AdamW step on parameters of
the given shapes, in its three implementations (default, foreach, fused), on
one CPU thread. examples/bench_optimizer.rs runs it with the tiny GPT's
shapes, so that PyTorch's rows stand next to ours in one table:

    cargo run --release --example bench_optimizer

Run alone: .venv/bin/python scripts/bench_torch_adamw.py '[[64, 64], [64]]' 500 50
Prints one line per implementation: `NAME MILLISECONDS` (the median step).
"""

import json
import statistics
import sys
import time

import torch


def median_step_ms(shapes, steps, warmup, **implementation):
    params = [torch.nn.Parameter(torch.ones(shape)) for shape in shapes]
    for param in params:
        param.grad = torch.ones_like(param)  # set once: only the update is timed
    optimizer = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01, **implementation)
    times = []
    for step in range(warmup + steps):
        started = time.perf_counter()
        optimizer.step()
        if step >= warmup:
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: bench_torch_adamw.py SHAPES_JSON STEPS WARMUP")
    shapes, steps, warmup = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)  # as each rank of the workbook's training run
    for name, implementation in [
        ("default", {"foreach": False}),
        ("foreach", {"foreach": True}),
        ("fused", {"fused": True}),
    ]:
        print(f"{name} {median_step_ms(shapes, steps, warmup, **implementation):.4f}", flush=True)


if __name__ == "__main__":
    main()
