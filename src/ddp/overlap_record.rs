//! What an [`OverlappedBuckets`] offers its caller beside the hooked
//! backward of `overlap.rs`: the last synced backward as it happened
//! ([`StepRecord`], for tests, benchmarks and figures), the layout and its
//! names, `keep_layout`, and `sync_now`, the sync for a caller that ran
//! `loss.backward()` unarmed (it marks every present gradient at once, where
//! the hooks would have marked them one by one).

use std::time::Instant;

use super::buckets::FlatGroups;
use super::layout::Bucket;
use super::overlap::OverlappedBuckets;
use crate::dist::DistError;

/// One bucket's launch in a synced backward.
#[derive(Clone, Debug)]
pub struct Launch {
    pub bucket: usize,
    pub at: Instant,
    /// How many gradients were ready when it left.
    pub gradients_ready: usize,
}

/// What happened in the last synced backward.
#[derive(Clone, Debug, Default)]
pub struct StepRecord {
    /// The buckets, in the order they left.
    pub launches: Vec<Launch>,
    /// The parameters, in the order their gradients became ready.
    pub ready_order: Vec<usize>,
    /// When backward had returned and the sync's end began.
    pub backward_ended: Option<Instant>,
}

impl OverlappedBuckets {
    /// Syncs after a backward pass that ran unarmed: every gradient present
    /// counts as ready, the buckets leave now, and [`finish`](Self::finish)
    /// waits for them. For callers that ran `loss.backward()` themselves.
    /// Returns what [`finish`](Self::finish) returns.
    pub fn sync_now(
        &self,
        tag: String,
        find_unused_parameters: bool,
    ) -> Result<Option<FlatGroups>, DistError> {
        self.arm(tag);
        {
            let mut p = self.lock();
            let present: Vec<usize> =
                (0..p.params.len()).filter(|&i| p.params[i].1.grad().defined()).collect();
            present.into_iter().for_each(|i| p.mark(i));
        }
        self.finish(find_unused_parameters, Ok(()))
    }

    /// The last synced backward, as it happened.
    pub fn last_step(&self) -> StepRecord {
        self.lock().record.clone()
    }

    /// Keeps the first layout: no re-plan after the first step.
    pub fn keep_layout(&self) {
        self.lock().replan_pending = false;
    }

    /// The current layout, in the order the buckets leave.
    pub fn layout(&self) -> Vec<Bucket> {
        self.lock().buckets.layout().to_vec()
    }

    /// The names of each bucket's parameters, in buffer order.
    pub fn names(&self) -> Vec<Vec<String>> {
        let p = self.lock();
        p.buckets.names(&p.params)
    }

    /// Each bucket's members and its buffer (see [`GradientBuckets::flat_groups`]).
    pub fn flat_groups(&self) -> FlatGroups {
        self.lock().buckets.flat_groups()
    }
}
