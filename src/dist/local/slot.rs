//! Where one collective call of the in-process backend meets: the slot that
//! call number `seq` of every rank shares, how it ended, and how its shared
//! result is computed, once, in rank order. Try it: `cargo test --test dist`.

use tch::Tensor;

use super::split_reduce::SplitReduce;
use crate::dist::call::{Call, Op};
use crate::dist::ReduceOp;

/// How call number `seq` ended; the same for every rank.
pub(super) enum Outcome {
    Shared(Vec<Tensor>),
    /// An all_reduce that its ranks finish together, in their own tensors.
    Split(std::sync::Arc<SplitReduce>),
    Mismatch(String),
    TorchFailed(String),
    Abandoned {
        by: usize,
        reason: String,
    },
}

/// Call number `seq` as all ranks see it (the in-process backend keeps one
/// per call in progress; see `rendezvous.rs`).
pub(super) struct Slot {
    /// The first rank to arrive and its call: every other call must equal it.
    pub first: Option<(usize, Call)>,
    /// Each rank's input, until the result is computed (or can never be).
    pub inputs: Vec<Option<Tensor>>,
    pub arrived: Vec<bool>,
    /// The rank has taken its outcome or given up; it will not look again.
    pub done: Vec<bool>,
    /// Set by the first rank that gave up waiting: who, and why.
    pub abandoned: Option<(usize, String)>,
    /// The rank arrived after `abandoned` was set.
    pub late: Vec<bool>,
    /// All ranks arrived and the last one is computing the result, unlocked.
    pub computing: bool,
    pub outcome: Option<Outcome>,
}

impl Slot {
    pub fn new(size: usize) -> Self {
        Slot {
            first: None,
            inputs: (0..size).map(|_| None).collect(),
            arrived: vec![false; size],
            done: vec![false; size],
            late: vec![false; size],
            abandoned: None,
            computing: false,
            outcome: None,
        }
    }

    /// No rank will ever look at this slot again.
    pub fn finished(&self, gone: &[Option<String>]) -> bool {
        self.done.iter().zip(gone).all(|(&done, gone)| done || gone.is_some())
    }
}

/// The shared result of a collective, computed once from the inputs of the
/// ranks that supplied one (for a broadcast: only the root), always in rank
/// order. Every rank then copies its part out of the same tensors, which is
/// what makes the result bitwise identical on every rank.
pub(super) fn compute(op: &Op, inputs: &[Tensor], size: usize) -> Result<Vec<Tensor>, tch::TchError> {
    Ok(match op {
        // A copy: the root may change its tensor as soon as it returns.
        Op::Broadcast { .. } => vec![inputs[0].f_detach_copy()?],
        Op::AllReduce(reduce) => vec![reduce_in_rank_order(inputs, *reduce, size)?],
        Op::AllGather => inputs.iter().map(Tensor::f_detach_copy).collect::<Result<_, _>>()?,
        Op::ReduceScatter(reduce) => {
            // chunks[r][i]: chunk i of rank r's tensor, a view: [rows / size, ...]
            let chunks: Vec<Vec<Tensor>> =
                inputs.iter().map(|t| t.f_chunk(size as i64, 0)).collect::<Result<_, _>>()?;
            (0..size)
                .map(|i| {
                    let column: Vec<Tensor> = chunks.iter().map(|c| c[i].shallow_clone()).collect();
                    reduce_in_rank_order(&column, *reduce, size)
                })
                .collect::<Result<_, _>>()?
        }
        Op::Barrier | Op::NewGroup(_) => vec![],
    })
}

/// ((x0 op x1) op x2) op ... in this order, whatever order the ranks arrived
/// in: floating-point addition is not associative, so a fixed order is what
/// makes the result reproducible.
fn reduce_in_rank_order(inputs: &[Tensor], op: ReduceOp, size: usize) -> Result<Tensor, tch::TchError> {
    // A fresh copy, so the in-place updates below never touch a rank's tensor.
    let mut acc = inputs[0].f_detach_copy()?;
    for x in &inputs[1..] {
        op.combine(&acc, x, &acc)?;
    }
    if op == ReduceOp::Avg {
        _ = acc.f_div_scalar_(size as f64)?;
    }
    Ok(acc)
}
