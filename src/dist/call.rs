//! One collective call as the ranks compare it, in every backend: which
//! operation, on what shape and dtype, named by its tag or the place it was
//! made from. Ranks whose calls differ get a mismatch instead of a wrong
//! answer (the in-process backend compares them in `local/rendezvous.rs`,
//! MPI and NCCL in their signature exchange). Try it: `cargo test --test dist`.

use std::panic::Location;

use tch::Kind;

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
