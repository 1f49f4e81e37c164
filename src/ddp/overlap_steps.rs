//! Spoiler: this file holds the library's answer to chapter 6's `mark_ready`
//! (`src/ch06_overlap/exercise.rs`). Working through the book? Write yours
//! first; the book shows the parts of this file you need, and the answer at
//! the end of the chapter.
//!
//! The three steps of an overlapped sync are `mark_ready` (a hook says a
//! gradient is final: which buckets may leave now?), `launch_bucket` (start
//! one bucket's all-reduce) and `finish_bucket` (after backward: wait for it
//! and divide). Chapter 6 of the book has the learner write all three. The
//! library's [`mark_ready`] is here; its launch and finish are methods of
//! `GradientBuckets` (`buckets.rs`), which keep gradients in their buckets,
//! so they copy nothing. Here too: what a synced backward leaves behind for
//! tests and benchmarks ([`StepRecord`]).
//!
//! Tested by `cargo test --test overlap` and `cargo test --test chapter_06`.

use std::time::Instant;

use super::layout::Bucket;

// ANCHOR: progress
/// Where one backward pass stands: which gradients are ready, how many each
/// bucket still waits for, and which bucket leaves next. Buckets leave in
/// bucket order, on every rank, because collectives pair up by their order.
#[derive(Clone, Debug)]
pub struct BucketProgress {
    /// For each parameter (registration index), the bucket it belongs to.
    pub bucket_of: Vec<usize>,
    /// For each bucket, how many of its members are not ready yet.
    pub pending: Vec<usize>,
    /// For each parameter, whether its gradient is ready in this pass.
    pub ready: Vec<bool>,
    /// The first bucket that has not been launched yet.
    pub next_bucket: usize,
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
        BucketProgress { bucket_of, pending, ready: vec![false; param_count], next_bucket: 0 }
    }

    /// Back to nothing ready, for the next pass over the same `layout`
    /// (`bucket_of` stays: it changes only with the layout).
    pub fn reset(&mut self, layout: &[Bucket]) {
        self.pending.iter_mut().zip(layout).for_each(|(pending, b)| *pending = b.params.len());
        self.ready.iter_mut().for_each(|r| *r = false);
        self.next_bucket = 0;
    }

    /// The parameters not marked ready in this pass.
    pub fn not_ready(&self) -> Vec<usize> {
        (0..self.ready.len()).filter(|&i| !self.ready[i]).collect()
    }
}

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

// ANCHOR: mark_ready
/// A gradient-ready hook says that parameter `param`'s gradient is final.
/// Marks it ready in `progress` and returns the buckets that may leave now,
/// in order: from `progress.next_bucket` on, each bucket with no member
/// pending, up to the first that still has one; `next_bucket` moves past
/// them. A second mark of the same parameter in one pass changes nothing.
pub fn mark_ready(progress: &mut BucketProgress, param: usize) -> Vec<usize> {
    if progress.ready[param] {
        return vec![];
    }
    progress.ready[param] = true;
    progress.pending[progress.bucket_of[param]] -= 1;
    let mut launch = vec![];
    while progress.next_bucket < progress.pending.len() && progress.pending[progress.next_bucket] == 0 {
        launch.push(progress.next_bucket);
        progress.next_bucket += 1;
    }
    launch
}
// ANCHOR_END: mark_ready
