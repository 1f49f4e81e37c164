//! A tiny GPT-style transformer: the model of the real training run. Built
//! only from `tch::nn` pieces (embedding, layer norm, linear), small enough
//! to train on two CPU cores. Run its checks with `cargo test --test models`.
//!
//! Layout (pre-LN, as in GPT-2 and nanoGPT):
//!   tokens -> tok_emb + pos_emb -> n_layer x Block -> ln_f -> lm_head -> logits
//!   Block: x = x + attn(ln1(x)); x = x + mlp(ln2(x))
//!
//! There is no dropout, on purpose. Dropout draws a fresh random mask on
//! every forward pass, from the process's random generator. DDP does not
//! synchronise random streams across ranks, and in the in-process backend the
//! rank threads even share one libtorch generator, so each rank would draw an
//! unpredictable slice of it. The chapters prove that N ranks take exactly
//! the same step as one process on the whole batch; that proof needs a
//! forward pass that depends on nothing but the weights and the data.

use tch::nn::{self, Module, VarStore};
use tch::{Device, Kind, Tensor};

use crate::models::hooks::{LayerHooks, NoLayerHooks};
use crate::seed::with_seed;

/// The sizes of a [`Gpt`]. Start from [`GptConfig::tiny`] and override the
/// fields that your data dictates:
/// `GptConfig { vocab_size: task.vocab_size(), ..GptConfig::tiny() }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GptConfig {
    /// Number of distinct token ids; inputs must lie in `0..vocab_size`.
    pub vocab_size: i64,
    /// Context length: the longest sequence the model accepts.
    pub block_size: i64,
    /// Number of transformer blocks.
    pub n_layer: i64,
    /// Attention heads per block; must divide `n_embd`.
    pub n_head: i64,
    /// Width of the residual stream.
    pub n_embd: i64,
}

impl GptConfig {
    /// 104,192 parameters: 2 blocks, 4 heads, width 64, vocabulary 16,
    /// context 32. It fits [`crate::data::TokenTask::standard`], which it
    /// learns to ~99% accuracy in about 500 Adam steps on two CPU cores.
    pub fn tiny() -> GptConfig {
        GptConfig { vocab_size: 16, block_size: 32, n_layer: 2, n_head: 4, n_embd: 64 }
    }

    /// The model of `size`, for the task of `tiny` (vocabulary 16, context
    /// 32): the sizes the benchmarks compare against PyTorch, from about
    /// 0.1M to 25M parameters. scripts/torch/models.py's `SIZES` holds the
    /// same four; `cargo test --test torch_twins gpt_sizes` checks they agree.
    pub fn of_size(size: GptSize) -> GptConfig {
        let (n_layer, n_head, n_embd) = match size {
            GptSize::Tiny => return GptConfig::tiny(),
            GptSize::M2 => (10, 4, 128), // 1,991,168: narrow and deep, as GPT-2 small is at 768
            GptSize::M10 => (6, 6, 384), // 10,672,128: nanoGPT's "baby GPT" shape
            GptSize::M25 => (8, 8, 512), // 25,252,864: about 100 MB of f32 gradients
        };
        GptConfig { n_layer, n_head, n_embd, ..GptConfig::tiny() }
    }

    /// The number of parameters of a model of these sizes: per block 12 x
    /// n_embd^2 weights (qkv 3, proj 1, fc 4, mlp proj 4) and 13 x n_embd
    /// biases and norms; then the embeddings, the final norm and the head.
    pub fn parameter_count(&self) -> i64 {
        let e = self.n_embd;
        let per_block = 12 * e * e + 13 * e;
        self.n_layer * per_block + (self.vocab_size + self.block_size) * e + 2 * e + e * self.vocab_size
    }

    /// Checks that the sizes make a model; the error says what to change.
    pub fn validate(&self) -> Result<(), String> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("block_size", self.block_size),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_embd", self.n_embd),
        ];
        for (name, value) in sizes {
            if value < 1 {
                return Err(format!("GptConfig.{name} must be at least 1, got {value}"));
            }
        }
        if self.n_embd % self.n_head != 0 {
            return Err(format!(
                "GptConfig.n_embd ({}) must be divisible by n_head ({}): every head gets \
                 n_embd / n_head channels. Try n_embd = {}.",
                self.n_embd,
                self.n_head,
                (self.n_embd / self.n_head + 1) * self.n_head
            ));
        }
        Ok(())
    }
}

/// The model sizes the benchmarks compare, by name on the command line:
/// `tiny` (104,192 parameters), `2m`, `10m` and `25m` ([`GptConfig::of_size`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GptSize {
    Tiny,
    M2,
    M10,
    M25,
}

impl GptSize {
    /// Every size, smallest first.
    pub const ALL: [GptSize; 4] = [GptSize::Tiny, GptSize::M2, GptSize::M10, GptSize::M25];

    /// The size's name on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            GptSize::Tiny => "tiny",
            GptSize::M2 => "2m",
            GptSize::M10 => "10m",
            GptSize::M25 => "25m",
        }
    }
}

impl std::fmt::Display for GptSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for GptSize {
    type Err = String;

    fn from_str(name: &str) -> Result<GptSize, String> {
        let names: Vec<&str> = GptSize::ALL.iter().map(|s| s.name()).collect();
        GptSize::ALL
            .into_iter()
            .find(|s| s.name() == name.to_ascii_lowercase())
            .ok_or_else(|| format!("no GPT size `{name}`: use one of {}", names.join(", ")))
    }
}

/// GPT-2's initialisation: weights from N(0, 0.02), biases zero.
fn linear_config(stdev: f64, bias: bool) -> nn::LinearConfig {
    nn::LinearConfig {
        ws_init: nn::Init::Randn { mean: 0.0, stdev },
        bs_init: Some(nn::Init::Const(0.0)),
        bias,
    }
}

/// Causal multi-head self-attention: each position looks at itself and the
/// positions before it, never after.
#[derive(Debug)]
struct CausalSelfAttention {
    qkv: nn::Linear,  // n_embd -> 3 * n_embd: queries, keys and values at once
    proj: nn::Linear, // n_embd -> n_embd: mixes the heads back together
    n_head: i64,
    /// `[block_size, block_size]`, 1 where a query row may see a key column.
    causal_mask: Tensor,
}

impl CausalSelfAttention {
    fn new(path: &nn::Path, cfg: &GptConfig, causal_mask: &Tensor) -> Self {
        // Each block adds its output to the residual stream; GPT-2 shrinks the
        // last projection of each by sqrt(2 * n_layer) so the sum stays ~unit.
        let residual_std = 0.02 / ((2 * cfg.n_layer) as f64).sqrt();
        CausalSelfAttention {
            qkv: nn::linear(path / "qkv", cfg.n_embd, 3 * cfg.n_embd, linear_config(0.02, true)),
            proj: nn::linear(path / "proj", cfg.n_embd, cfg.n_embd, linear_config(residual_std, true)),
            n_head: cfg.n_head,
            causal_mask: causal_mask.shallow_clone(),
        }
    }
}

impl Module for CausalSelfAttention {
    fn forward(&self, x: &Tensor) -> Tensor {
        let (batch, seq, n_embd) = x.size3().expect("attention input is [batch, seq, n_embd]");
        let head_dim = n_embd / self.n_head;
        let split_heads = |t: &Tensor| {
            t.view([batch, seq, self.n_head, head_dim]).transpose(1, 2) // [batch, head, seq, head_dim]
        };
        let qkv = self.qkv.forward(x).split(n_embd, 2); // 3 x [batch, seq, n_embd]
        let (q, k, v) = (split_heads(&qkv[0]), split_heads(&qkv[1]), split_heads(&qkv[2]));
        let scores = q.matmul(&k.transpose(-2, -1)) / (head_dim as f64).sqrt(); // [batch, head, seq, seq]
        let hidden = self.causal_mask.narrow(0, 0, seq).narrow(1, 0, seq).eq(0.0); // [seq, seq], true above the diagonal
        let weights = scores.masked_fill(&hidden, f64::NEG_INFINITY).softmax(-1, scores.kind()); // [batch, head, seq, seq]
        let y = weights.matmul(&v); // [batch, head, seq, head_dim]
        let y = y.transpose(1, 2).contiguous().view([batch, seq, n_embd]); // [batch, seq, n_embd]
        self.proj.forward(&y) // [batch, seq, n_embd]
    }
}

/// The position-wise feed-forward network: widen 4x, GELU, narrow back.
#[derive(Debug)]
struct FeedForward {
    fc: nn::Linear,   // n_embd -> 4 * n_embd
    proj: nn::Linear, // 4 * n_embd -> n_embd
}

impl FeedForward {
    fn new(path: &nn::Path, cfg: &GptConfig) -> Self {
        let residual_std = 0.02 / ((2 * cfg.n_layer) as f64).sqrt();
        FeedForward {
            fc: nn::linear(path / "fc", cfg.n_embd, 4 * cfg.n_embd, linear_config(0.02, true)),
            proj: nn::linear(path / "proj", 4 * cfg.n_embd, cfg.n_embd, linear_config(residual_std, true)),
        }
    }
}

impl Module for FeedForward {
    fn forward(&self, x: &Tensor) -> Tensor {
        let h = self.fc.forward(x).gelu("none"); // [batch, seq, 4 * n_embd]
        self.proj.forward(&h) // [batch, seq, n_embd]
    }
}

/// One transformer block, pre-LN: normalise, transform, add to the residual.
#[derive(Debug)]
struct Block {
    ln1: nn::LayerNorm,
    attn: CausalSelfAttention,
    ln2: nn::LayerNorm,
    mlp: FeedForward,
}

impl Block {
    fn new(path: &nn::Path, cfg: &GptConfig, causal_mask: &Tensor) -> Self {
        Block {
            ln1: nn::layer_norm(path / "ln1", vec![cfg.n_embd], Default::default()),
            attn: CausalSelfAttention::new(&(path / "attn"), cfg, causal_mask),
            ln2: nn::layer_norm(path / "ln2", vec![cfg.n_embd], Default::default()),
            mlp: FeedForward::new(&(path / "mlp"), cfg),
        }
    }
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> Tensor {
        let x = x + self.attn.forward(&self.ln1.forward(x)); // [batch, seq, n_embd]
        &x + self.mlp.forward(&self.ln2.forward(&x)) // [batch, seq, n_embd]
    }
}

/// The whole model. Parameter names, in registration order: `tok_emb.weight`,
/// `pos_emb.weight`, `blocks.0.ln1.weight`, `blocks.0.ln1.bias`,
/// `blocks.0.attn.qkv.bias`, `blocks.0.attn.qkv.weight` (tch registers a
/// linear layer's bias before its weight), ..., `ln_f.bias`,
/// `lm_head.weight`; one buffer,
/// `causal_mask`.
#[derive(Debug)]
pub struct Gpt {
    config: GptConfig,
    tok_emb: nn::Embedding, // token id -> [n_embd]
    pos_emb: nn::Embedding, // position -> [n_embd]
    blocks: Vec<Block>,
    ln_f: nn::LayerNorm,
    lm_head: nn::Linear, // n_embd -> vocab_size, no bias
}

impl Gpt {
    /// Creates the model's variables under `path`. Panics with the reason if
    /// `cfg` does not describe a model (see [`GptConfig::validate`]).
    pub fn new(path: &nn::Path, cfg: &GptConfig) -> Gpt {
        if let Err(problem) = cfg.validate() {
            panic!("cannot build a Gpt: {problem}");
        }
        let emb_config =
            nn::EmbeddingConfig { ws_init: nn::Init::Randn { mean: 0.0, stdev: 0.02 }, ..Default::default() };
        let tok_emb = nn::embedding(path / "tok_emb", cfg.vocab_size, cfg.n_embd, emb_config);
        let pos_emb = nn::embedding(path / "pos_emb", cfg.block_size, cfg.n_embd, emb_config);

        // The mask is state, not a parameter: it lives in the VarStore (so it
        // moves with `set_kind`/`to` and is saved with the weights) but takes
        // no gradient and no optimizer step. One copy serves every block.
        let n = cfg.block_size;
        let causal_mask = path.zeros_no_train("causal_mask", &[n, n]); // [block_size, block_size]
        tch::no_grad(|| {
            let lower = Tensor::ones([n, n], (causal_mask.kind(), causal_mask.device())).tril(0);
            causal_mask.shallow_clone().copy_(&lower);
        });

        let blocks =
            (0..cfg.n_layer).map(|i| Block::new(&(path / "blocks" / i), cfg, &causal_mask)).collect();
        let ln_f = nn::layer_norm(path / "ln_f", vec![cfg.n_embd], Default::default());
        let lm_head = nn::linear(path / "lm_head", cfg.n_embd, cfg.vocab_size, linear_config(0.02, false));
        Gpt { config: cfg.clone(), tok_emb, pos_emb, blocks, ln_f, lm_head }
    }

    /// Builds a CPU model of the given dtype from `seed`: the same seed gives
    /// bitwise the same weights on every rank and every run.
    pub fn seeded(seed: i64, cfg: &GptConfig, kind: Kind) -> (VarStore, Gpt) {
        with_seed(seed, || {
            let mut vs = VarStore::new(Device::Cpu);
            let gpt = Gpt::new(&vs.root(), cfg);
            vs.set_kind(kind);
            (vs, gpt)
        })
    }

    pub fn config(&self) -> &GptConfig {
        &self.config
    }
}

impl Module for Gpt {
    /// Token ids `[batch, seq]` (i64, `seq <= block_size`) to next-token
    /// logits `[batch, seq, vocab_size]`.
    fn forward(&self, tokens: &Tensor) -> Tensor {
        self.forward_with_hooks(tokens, &NoLayerHooks)
    }
}

impl Gpt {
    /// [`Module::forward`], with `hooks` run around each block (block `i` is
    /// layer `i`): how FSDP gathers and frees each block's parameters.
    pub fn forward_with_hooks(&self, tokens: &Tensor, hooks: &dyn LayerHooks) -> Tensor {
        let seq = match tokens.size()[..] {
            [_batch, seq] => seq,
            ref other => panic!("Gpt::forward wants token ids [batch, seq], got shape {other:?}"),
        };
        assert_eq!(tokens.kind(), Kind::Int64, "Gpt::forward wants i64 token ids, got {:?}", tokens.kind());
        assert!(
            (1..=self.config.block_size).contains(&seq),
            "Gpt::forward got sequences of length {seq}, but block_size is {}: \
             crop the input to its last {} tokens or build the model with a larger block_size",
            self.config.block_size,
            self.config.block_size
        );
        if cfg!(debug_assertions) && tokens.numel() > 0 {
            // Debug builds only: reading a value back would stall a GPU.
            let (lo, hi) = (tokens.min().int64_value(&[]), tokens.max().int64_value(&[]));
            assert!(
                lo >= 0 && hi < self.config.vocab_size,
                "Gpt::forward got token ids in {lo}..={hi}, but vocab_size is {}",
                self.config.vocab_size
            );
        }
        let positions = Tensor::arange(seq, (Kind::Int64, tokens.device())); // [seq]
        let mut x = self.tok_emb.forward(tokens) + self.pos_emb.forward(&positions); // [batch, seq, n_embd]
        for (i, block) in self.blocks.iter().enumerate() {
            hooks.pre_forward(i);
            x = block.forward(&x); // [batch, seq, n_embd]
            hooks.post_forward(i, &x);
        }
        self.lm_head.forward(&self.ln_f.forward(&x)) // [batch, seq, vocab_size]
    }
}
