//! One collective call of the in-process backend: what each rank asks for,
//! the slot where the ranks meet, and how the shared result is computed.
//! Try it: `cargo test --test dist`.

use std::panic::Location;

use tch::{Kind, Tensor};

use super::tag::current_tag;
use super::ReduceOp;

/// Which collective a rank asked for; compared across ranks.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Op {
    Broadcast {
        root: usize,
    },
    AllReduce(ReduceOp),
    AllGather,
    ReduceScatter(ReduceOp),
    Barrier,
    /// The agreement step of `new_group`: every rank must pass the same list.
    NewGroup(Vec<usize>),
}

/// One rank's side of a collective: what it asked for and on what tensor.
/// Two ranks' calls must be equal, or the call fails with a mismatch.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Call {
    pub op: Op,
    pub shape: Vec<i64>,
    pub kind: Option<Kind>,
    /// The caller's name for the call (see `tag.rs`), compared like the shape.
    pub tag: Option<String>,
    /// Where an untagged call was made (file, line, column), compared like
    /// the tag: every rank runs the same program, so the same call is made
    /// from the same place (see `tag.rs` for what this catches and what not).
    pub site: Option<&'static Location<'static>>,
}

impl Call {
    /// This thread's call of `op` on a tensor of `shape` and `kind`, named by
    /// the current tag, or, without one, by the place the `ProcessGroup`
    /// method was called from (every function between that method and this
    /// one carries `#[track_caller]`).
    #[track_caller]
    pub fn here(op: Op, shape: Vec<i64>, kind: Option<Kind>) -> Call {
        let tag = current_tag();
        let here = Location::caller(); // called here, not through a closure: that would name the closure
        let site = tag.is_none().then_some(here);
        Call { op, shape, kind, tag, site }
    }

    /// What to say when two ranks' calls differ only in where they were
    /// made: perhaps one rank skipped a call, or the program makes the same
    /// call from two places on purpose (a branch on the rank), which a tag
    /// says.
    pub fn site_hint(&self, other: &Call) -> &'static str {
        let same_but_site = Call { site: None, ..self.clone() } == Call { site: None, ..other.clone() };
        if same_but_site && self.site != other.site {
            ". The calls differ only in where they were made: did a rank skip a call, or take another \
             branch? If this is the same call made from two places on purpose, name it on every rank \
             with `dist::tagged(\"...\", || ...)`, which replaces the place in the comparison"
        } else {
            ""
        }
    }

    /// The call with where it was made: what the ranks compare, in words.
    pub fn signature(&self) -> String {
        match self.site {
            Some(site) => format!("{self} at {site}"),
            None => self.to_string(),
        }
    }
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.op {
            Op::Broadcast { root } => write!(f, "broadcast(root={root})")?,
            Op::AllReduce(op) => write!(f, "all_reduce({})", op.name())?,
            Op::AllGather => write!(f, "all_gather")?,
            Op::ReduceScatter(op) => write!(f, "reduce_scatter({})", op.name())?,
            Op::Barrier => write!(f, "barrier")?,
            Op::NewGroup(ranks) => write!(f, "new_group({ranks:?})")?,
        }
        if let Some(kind) = self.kind {
            write!(f, " of {kind:?}{:?}", self.shape)?;
        }
        match &self.tag {
            Some(tag) => write!(f, " tagged {tag:?}"),
            None => Ok(()),
        }
    }
}

/// What is wrong with a `new_group` list for a group of `size` ranks, in
/// words that say what to pass instead; `None` when it is fine. Every
/// backend checks the list only after the ranks agreed on it, so all reach
/// the same verdict.
pub(crate) fn group_list_problem(ranks: &[usize], size: usize) -> Option<String> {
    let mut seen = std::collections::HashSet::new();
    let problem = if ranks.is_empty() {
        Some("the list of ranks is empty".to_string())
    } else if let Some(bad) = ranks.iter().find(|&&r| r >= size) {
        Some(format!("rank {bad} is not a rank of a group of {size}"))
    } else {
        ranks.iter().find(|&&r| !seen.insert(r)).map(|dup| format!("rank {dup} is listed twice"))
    };
    problem.map(|problem| format!("{problem}; pass distinct ranks in 0..{size}"))
}

/// How call number `seq` ended; the same for every rank.
pub(crate) enum Outcome {
    Shared(Vec<Tensor>),
    /// An all_reduce that its ranks finish together, in their own tensors.
    Split(std::sync::Arc<super::split_reduce::SplitReduce>),
    Mismatch(String),
    TorchFailed(String),
    Abandoned {
        by: usize,
        reason: String,
    },
}

/// Call number `seq` as all ranks see it (the in-process backend keeps one
/// per call in progress; see `world.rs`).
pub(crate) struct Slot {
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
pub(crate) fn compute(op: &Op, inputs: &[Tensor], size: usize) -> Result<Vec<Tensor>, tch::TchError> {
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
        match op {
            ReduceOp::Sum | ReduceOp::Avg => _ = acc.f_add_(x)?,
            ReduceOp::Product => _ = acc.f_mul_(x)?,
            ReduceOp::Min => acc = acc.f_minimum(x)?,
            ReduceOp::Max => acc = acc.f_maximum(x)?,
        }
    }
    if op == ReduceOp::Avg {
        _ = acc.f_div_scalar_(size as f64)?;
    }
    Ok(acc)
}
