//! Spoiler: this file holds the library's answer to chapter 6's `mark_ready`
//! (`src/ch06_overlap/exercise.rs`). Working through the book? Write yours
//! first; the book shows the parts of this file you need, and the answer on
//! the chapter's solution page.
//!
//! Which buckets may leave during backward. Each gradient-ready hook marks
//! its parameter ready; a bucket leaves once all its members are ready and
//! every bucket before it has left, so that the ranks' all-reduces pair up in
//! the same order. PyTorch's reducer keeps the same count per bucket
//! (`pending`) and launches buckets in order (`next_bucket_`).

use super::layout::Bucket;

// ANCHOR: progress
/// Where one backward pass stands: which gradients are ready, how many each
/// bucket still waits for, and which buckets have been handed out to leave.
#[derive(Clone, Debug)]
pub struct BucketProgress {
    /// For each parameter (registration index), the bucket it belongs to.
    pub bucket_of: Vec<usize>,
    /// For each bucket, how many of its members are not ready yet.
    pub pending: Vec<usize>,
    /// For each parameter, whether its gradient is ready in this pass.
    pub ready: Vec<bool>,
    /// For each bucket, whether `mark_ready` has returned it in this pass.
    pub launched: Vec<bool>,
}
// ANCHOR_END: progress

impl BucketProgress {
    /// Nothing ready yet, for these buckets of `param_count` parameters.
    pub fn new(layout: &[Bucket], param_count: usize) -> BucketProgress {
        let mut bucket_of = vec![0; param_count];
        for (b, bucket) in layout.iter().enumerate() {
            bucket.params.iter().for_each(|&p| bucket_of[p] = b);
        }
        let pending = layout.iter().map(|b| b.params.len()).collect();
        let (ready, launched) = (vec![false; param_count], vec![false; layout.len()]);
        BucketProgress { bucket_of, pending, ready, launched }
    }

    /// Back to nothing ready, for the next pass over the same `layout`
    /// (`bucket_of` stays: it changes only with the layout).
    pub fn reset(&mut self, layout: &[Bucket]) {
        self.pending.iter_mut().zip(layout).for_each(|(pending, b)| *pending = b.params.len());
        self.ready.iter_mut().for_each(|r| *r = false);
        self.launched.iter_mut().for_each(|l| *l = false);
    }

    /// The parameters not marked ready in this pass.
    pub fn not_ready(&self) -> Vec<usize> {
        (0..self.ready.len()).filter(|&i| !self.ready[i]).collect()
    }
}

// ANCHOR: mark_ready
/// A gradient-ready hook says that parameter `param`'s gradient is final.
/// Marks it ready in `progress` and returns the buckets that may leave now,
/// in bucket order: after the last bucket launched, each bucket with no
/// member pending, up to the first that still has one. A second mark of the
/// same parameter in one pass changes nothing.
pub fn mark_ready(progress: &mut BucketProgress, param: usize) -> Vec<usize> {
    if progress.ready[param] {
        return vec![];
    }
    progress.ready[param] = true;
    progress.pending[progress.bucket_of[param]] -= 1;
    let mut bucket = progress.launched.iter().take_while(|&&launched| launched).count();
    let mut launch = vec![];
    while bucket < progress.pending.len() && progress.pending[bucket] == 0 {
        progress.launched[bucket] = true;
        launch.push(bucket);
        bucket += 1;
    }
    launch
}
// ANCHOR_END: mark_ready
