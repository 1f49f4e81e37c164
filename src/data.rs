//! Deterministic synthetic data sets with a real signal to learn: a
//! [`Regression`] task for the MLP chapters and a [`TokenTask`] (copy,
//! reverse or sort a sequence) for the GPT, with its masked loss and accuracy.
//! Run their checks with `cargo test --test models`.

use tch::{Kind, Tensor};

use crate::seed::with_seed;

/// A regression task whose targets come from a fixed random "teacher"
/// network plus a little noise, so a student model can really learn it.
#[derive(Debug)]
pub struct Regression {
    /// Inputs, `[n, in_dim]`.
    pub x: Tensor,
    /// Targets, `[n, out_dim]`.
    pub y: Tensor,
}

impl Regression {
    /// `n` examples drawn from `seed`; the same seed always gives the same data.
    pub fn new(seed: i64, n: i64, in_dim: i64, out_dim: i64, kind: Kind) -> Regression {
        with_seed(seed, || {
            let opts = (Kind::Double, tch::Device::Cpu);
            let x = Tensor::randn([n, in_dim], opts); // [n, in_dim]
            let w1 = Tensor::randn([in_dim, 8], opts) / (in_dim as f64).sqrt();
            let w2 = Tensor::randn([8, out_dim], opts) / 8f64.sqrt();
            let noise = Tensor::randn([n, out_dim], opts) * 0.01;
            let y = x.matmul(&w1).tanh().matmul(&w2) + noise; // [n, out_dim]
            Regression { x: x.to_kind(kind), y: y.to_kind(kind) }
        })
    }

    pub fn len(&self) -> i64 {
        self.x.size()[0]
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows `start..start + len` as `(x, y)`.
    pub fn batch(&self, start: i64, len: i64) -> (Tensor, Tensor) {
        (self.x.narrow(0, start, len), self.y.narrow(0, start, len))
    }
}

/// The rule that turns the first half of a [`TokenTask`] sequence into its
/// second half.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// The second half repeats the first: `3 1 4 | 3 1 4`.
    Copy,
    /// The second half is the first backwards: `3 1 4 | 4 1 3`.
    Reverse,
    /// The second half is the first in ascending order: `3 1 4 | 1 3 4`.
    /// Harder than the other two: position alone no longer says where to
    /// look, the model must compare and count the symbols.
    Sort,
}

/// A next-token task with a known optimum, for the [`crate::models::Gpt`].
///
/// Each sequence is `half_len` random symbols, a separator, then the same
/// symbols again under a [`Pattern`]:
///
/// ```text
/// sequence:  3 1 4 1 | 3 1 4 1        (half_len 4; '|' is the separator id)
/// inputs:    3 1 4 1 | 3 1 4          (sequence[..2 * half_len])
/// targets:   1 4 1 | 3 1 4 1          (sequence[1..]: the next token)
/// mask:      0 0 0 0 1 1 1 1          (score only the second half)
/// ```
///
/// The first half is random, so no model can predict it; the second half is
/// fully determined by the first, so a model that has learned the rule
/// predicts it exactly. The mask scores only those positions, which gives
/// clear landmarks for the masked loss (see [`masked_cross_entropy`]):
/// - about `ln(vocab_size)` at initialisation (all tokens equally likely);
/// - [`TokenTask::chance_loss`] = `ln(n_symbols)` for a model that knows which
///   symbols can appear but not which one comes next (accuracy `1/n_symbols`);
/// - 0 (accuracy 1.0) for a model that has learned the rule.
///
/// Every sequence has exactly `half_len` scored positions, so the mean over
/// the masked positions of N equal per-rank batches, averaged over ranks,
/// equals the mean over the whole global batch: DDP's averaging stays exact.
#[derive(Debug)]
pub struct TokenTask {
    /// Whole sequences, `[n, 2 * half_len + 1]`, i64 ids in `0..vocab_size`.
    pub sequences: Tensor,
    /// Symbols are ids `0..n_symbols`; the separator is id `n_symbols`.
    pub n_symbols: i64,
    pub half_len: i64,
    pub pattern: Pattern,
}

impl TokenTask {
    /// `n_sequences` sequences drawn from `seed`; the same seed always gives
    /// the same data.
    pub fn new(seed: i64, n_sequences: i64, n_symbols: i64, half_len: i64, pattern: Pattern) -> TokenTask {
        assert!(
            n_symbols >= 2,
            "TokenTask needs at least 2 symbols to have anything to learn, got {n_symbols}"
        );
        assert!(half_len >= 1, "TokenTask needs half_len >= 1, got {half_len}");
        assert!(n_sequences >= 0, "TokenTask needs n_sequences >= 0, got {n_sequences}");
        let first = with_seed(seed, || {
            let opts = (Kind::Int64, tch::Device::Cpu);
            Tensor::randint(n_symbols, [n_sequences, half_len], opts) // [n, half_len]
        });
        let second = match pattern {
            Pattern::Copy => first.copy(),           // [n, half_len]
            Pattern::Reverse => first.flip([1]),     // [n, half_len]
            Pattern::Sort => first.sort(1, false).0, // [n, half_len]
        };
        let separator = Tensor::full([n_sequences, 1], n_symbols, (Kind::Int64, tch::Device::Cpu)); // [n, 1]
        let sequences = Tensor::cat(&[first, separator, second], 1); // [n, 2 * half_len + 1]
        TokenTask { sequences, n_symbols, half_len, pattern }
    }

    /// The task that [`crate::models::GptConfig::tiny`] is sized for:
    /// 15 symbols + separator = 16 ids, 16 + 16 = 32 input positions, sort.
    /// Measured with `GptConfig::tiny()`, Adam at lr 3e-3, batches of 32:
    /// masked accuracy passes 0.9 after ~250 steps and 0.99 after ~500
    /// (the same model learns `Pattern::Copy` in ~50 steps).
    pub fn standard(seed: i64, n_sequences: i64) -> TokenTask {
        TokenTask::new(seed, n_sequences, 15, 16, Pattern::Sort)
    }

    /// How many distinct ids the model must know: the symbols and the separator.
    pub fn vocab_size(&self) -> i64 {
        self.n_symbols + 1
    }

    /// The length of an input row; the model's `block_size` must be at least this.
    pub fn seq_len(&self) -> i64 {
        2 * self.half_len
    }

    /// The separator's id.
    pub fn separator(&self) -> i64 {
        self.n_symbols
    }

    /// The best masked loss without looking at the first half: `ln(n_symbols)`.
    pub fn chance_loss(&self) -> f64 {
        (self.n_symbols as f64).ln()
    }

    pub fn len(&self) -> i64 {
        self.sequences.size()[0]
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sequences `start..start + len` as `(inputs, targets, mask)`:
    /// `inputs` and `targets` are i64 `[len, seq_len]`, `targets` being
    /// `inputs` shifted left by one; `mask` is f32 `[len, seq_len]`, 1.0 where
    /// the target is predictable (the second half) and 0.0 elsewhere.
    pub fn batch(&self, start: i64, len: i64) -> (Tensor, Tensor, Tensor) {
        assert!(
            start >= 0 && len >= 1 && start + len <= self.len(),
            "TokenTask::batch({start}, {len}) asks for sequences {start}..{} of a task with {} sequences",
            start + len,
            self.len()
        );
        let rows = self.sequences.narrow(0, start, len); // [len, 2 * half_len + 1]
        let t = self.seq_len();
        let inputs = rows.narrow(1, 0, t); // [len, seq_len]
        let targets = rows.narrow(1, 1, t); // [len, seq_len]
                                            // Target position i holds sequence[i + 1]; the second half is i >= half_len.
        let second_half = Tensor::arange(t, (Kind::Int64, tch::Device::Cpu)).ge(self.half_len); // [seq_len]
        let mask = second_half.to_kind(Kind::Float).unsqueeze(0).expand([len, t], true).contiguous(); // [len, seq_len]
        (inputs, targets, mask)
    }
}

/// Cross-entropy averaged over the positions where `mask` is non-zero.
/// `logits` `[batch, seq, vocab]`, `targets` i64 `[batch, seq]`, `mask`
/// `[batch, seq]` (1.0 = scored). Returns a scalar with a gradient.
pub fn masked_cross_entropy(logits: &Tensor, targets: &Tensor, mask: &Tensor) -> Tensor {
    let mask = mask.to_kind(logits.kind()); // [batch, seq]
    let scored = mask.sum(logits.kind()); // []
    if cfg!(debug_assertions) {
        // Debug builds only: reading a value back would stall a GPU every step.
        assert!(scored.double_value(&[]) > 0.0, "masked_cross_entropy: the mask scores no position");
    }
    let log_probs = logits.log_softmax(-1, logits.kind()); // [batch, seq, vocab]
    let target_log_probs = log_probs.gather(-1, &targets.unsqueeze(-1), false).squeeze_dim(-1); // [batch, seq]
    -(target_log_probs * &mask).sum(logits.kind()) / scored // []
}

/// The fraction of scored positions (non-zero `mask`) where the most likely
/// token under `logits` `[batch, seq, vocab]` equals `targets` `[batch, seq]`.
pub fn masked_accuracy(logits: &Tensor, targets: &Tensor, mask: &Tensor) -> f64 {
    let mask = mask.to_kind(Kind::Double); // [batch, seq]
    let scored = mask.sum(Kind::Double).double_value(&[]);
    assert!(scored > 0.0, "masked_accuracy: the mask scores no position");
    let correct = logits.argmax(-1, false).eq_tensor(targets).to_kind(Kind::Double); // [batch, seq]
    (correct * mask).sum(Kind::Double).double_value(&[]) / scored
}
