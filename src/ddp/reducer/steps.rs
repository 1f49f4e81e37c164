//! The three steps the [`Reducer`](super::Reducer) takes for each bucket in
//! a synced backward: mark a gradient ready, launch a complete bucket, finish
//! it. The library's are the defaults; a communication hook replaces the
//! last two (`comm_hook.rs`), and chapter 6 plugs in the learner's through
//! `ddp::seams`. Kept apart from the reducer so that each of them can name
//! the trait without naming the reducer.

use super::buckets::GradientBuckets;
use super::progress::{mark_ready, BucketProgress};
use crate::dist::{DistError, ProcessGroup, Work};
use crate::models::Named;

/// What a bucket step is handed: the group, the buckets, the parameters.
pub(crate) type Buckets<'a> = (&'a dyn ProcessGroup, &'a GradientBuckets, &'a [Named]);

/// The three steps of an overlapped sync, as the reducer calls them.
pub(crate) trait BucketSteps: Send {
    /// A hook said `param`'s gradient is final: the buckets that may leave now.
    fn mark_ready(&self, progress: &mut BucketProgress, param: usize) -> Vec<usize> {
        mark_ready(progress, param)
    }
    /// Starts bucket `b`'s all-reduce (SUM), its gradients in their slots.
    fn launch(&self, (pg, buckets, params): Buckets<'_>, b: usize) -> Result<Work, DistError> {
        buckets.launch_bucket(pg, b, params)
    }
    /// Waits for bucket `b` and leaves the average in its gradients.
    fn finish(&self, (pg, buckets, _): Buckets<'_>, b: usize, work: Work) -> Result<(), DistError> {
        buckets.finish_bucket(pg, b, work)
    }
}

/// The library's steps: the trait's defaults.
pub(crate) struct LibrarySteps;

impl BucketSteps for LibrarySteps {}
