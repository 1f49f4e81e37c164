"""The workbook's models written in PyTorch, its
"twins": the MLP of src/models/mlp.rs and the tiny GPT of src/models/gpt.rs,
with exactly the workbook's parameter and buffer names, in the same
registration order (a Linear's bias before its weight, as tch makes them),
and the same operations in the same order. So a model
the workbook saved loads with `load_state_dict(..., strict=True)`, gives
the same forward in float64, and DistributedDataParallel walks its
parameters in the workbook's order.

    import sys; sys.path.insert(0, "scripts/torch")
    from models import Gpt, GptConfig, Mlp, SIZES
    model = Gpt(GptConfig()).double()  # or Gpt(SIZES["25m"])
    model.load_state_dict(load_file("weights.safetensors"), strict=True)

Used by scripts/bench_torch_ddp.py and scripts/torch/oracle.py; checked by
`cargo test --features solutions,mpi,nccl --test torch_oracle` (the twins'
forward equals the workbook's, bitwise, in float64).

The twins are initialised by PyTorch's own defaults, not the workbook's
N(0, 0.02): a comparison loads the workbook's weights, and the benchmark
only needs a model of the same shape and cost.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


class Linear(nn.Linear):
    """nn.Linear with its bias registered before its weight, as tch's
    `nn::linear` creates them: DistributedDataParallel walks the parameters
    in registration order, so its buckets then hold the workbook's order."""

    def __init__(self, in_features, out_features, bias=True):
        super().__init__(in_features, out_features, bias=bias)
        self._parameters["weight"] = self._parameters.pop("weight")  # to the end: after the bias


class Mlp(nn.Module):
    """src/models/mlp.rs: `layers.0` ... `layers.{n-2}` (Linear), tanh between
    them, and the buffer `input_shift` subtracted from the input."""

    def __init__(self, sizes):
        super().__init__()
        if len(sizes) < 2:
            raise ValueError(f"an MLP needs at least an input and an output size, got {sizes}")
        self.layers = nn.ModuleList(Linear(i, o) for i, o in zip(sizes[:-1], sizes[1:]))
        self.register_buffer("input_shift", torch.zeros(sizes[0]))

    def forward(self, x):  # [batch, sizes[0]] -> [batch, sizes[-1]]
        h = x - self.input_shift
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i + 1 < len(self.layers):
                h = h.tanh()
        return h


@dataclass
class GptConfig:
    """GptConfig::tiny() of src/models/gpt.rs; SIZES below holds the others."""

    vocab_size: int = 16
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64


# GptConfig::of_size of src/models/gpt.rs, by the names of its GptSize: the
# sizes scripts/bench_torch_ddp.py --size trains. `cargo test --features
# solutions,mpi,nccl --test torch_twins gpt_sizes` checks that both sides
# count the same parameters.
SIZES = {
    "tiny": GptConfig(),
    "2m": GptConfig(n_layer=10, n_head=4, n_embd=128),
    "10m": GptConfig(n_layer=6, n_head=6, n_embd=384),
    "25m": GptConfig(n_layer=8, n_head=8, n_embd=512),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.qkv = Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = Linear(cfg.n_embd, cfg.n_embd)
        self.n_head = cfg.n_head

    def forward(self, x, causal_mask):
        # The mask is the model's one buffer (`causal_mask`, as in the
        # workbook), passed in so that `.double()` converts the only copy.
        batch, seq, n_embd = x.shape
        head_dim = n_embd // self.n_head
        q, k, v = self.qkv(x).split(n_embd, dim=2)
        q, k, v = (t.view(batch, seq, self.n_head, head_dim).transpose(1, 2) for t in (q, k, v))
        scores = q.matmul(k.transpose(-2, -1)) / math.sqrt(head_dim)  # [batch, head, seq, seq]
        hidden = causal_mask[:seq, :seq] == 0
        weights = scores.masked_fill(hidden, float("-inf")).softmax(-1, dtype=scores.dtype)
        y = weights.matmul(v).transpose(1, 2).contiguous().view(batch, seq, n_embd)
        return self.proj(y)


class FeedForward(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.fc = Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.proj = Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))  # exact GELU, tch's gelu("none")


class Block(nn.Module):
    """Pre-LN: x = x + attn(ln1(x)); x = x + mlp(ln2(x))."""

    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = FeedForward(cfg)

    def forward(self, x, causal_mask):
        x = x + self.attn(self.ln1(x), causal_mask)
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    """src/models/gpt.rs: `tok_emb`, `pos_emb`, `blocks.N.{ln1, attn.qkv,
    attn.proj, ln2, mlp.fc, mlp.proj}`, `ln_f`, `lm_head` (no bias), and the
    buffer `causal_mask`."""

    def __init__(self, cfg=None):
        super().__init__()
        cfg = cfg or GptConfig()
        if cfg.n_embd % cfg.n_head != 0:
            raise ValueError(f"n_embd ({cfg.n_embd}) must be divisible by n_head ({cfg.n_head})")
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.register_buffer("causal_mask", torch.ones(cfg.block_size, cfg.block_size).tril())
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def forward(self, tokens):  # [batch, seq] i64 -> [batch, seq, vocab_size]
        seq = tokens.shape[1]
        if seq > self.config.block_size:
            raise ValueError(f"sequences of length {seq}, but block_size is {self.config.block_size}")
        positions = torch.arange(seq, device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x, self.causal_mask)
        return self.lm_head(self.ln_f(x))


if __name__ == "__main__":
    # `python scripts/torch/models.py`: each size's name, sizes and parameter
    # count, one line each, for the Rust side to compare with its own.
    for name, cfg in SIZES.items():
        count = sum(p.numel() for p in Gpt(cfg).parameters())
        print(f"size {name} {cfg.vocab_size} {cfg.block_size} {cfg.n_layer} {cfg.n_head} {cfg.n_embd} {count}")
