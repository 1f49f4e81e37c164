//! Buckets re-planned from the order in which gradients really became ready
//! (PyTorch's `rebuild_buckets`). The first plan guesses that backward
//! produces gradients in reverse registration order; a model that registers
//! its layers in another order than it uses them proves the guess wrong, and
//! then the first bucket waits for the last gradient and nothing overlaps.
//! After the first synced step every rank adopts rank 0's observed order
//! (ranks must agree: their all-reduces pair up by bucket) and, if the
//! current layout made a complete bucket wait for a later one, plans again.
//! (PyTorch plans again in any case; a layout whose buckets already
//! complete in order loses nothing by staying, and keeps its buffers, where
//! the training run's optimizer reads the gradients.)
//!
//! Tested by `cargo test --test overlap`.

use tch::Tensor;

use super::buckets::{FlatGroups, GradientBuckets};
use super::layout::{plan_buckets, ParamMeta};
use crate::dist::{torch_error, DistError, ProcessGroup};
use crate::models::Named;

/// Rank 0's `observed` order, on every rank. A parameter rank 0 never saw
/// ready (it got no gradient) is appended, from the last registered to the
/// first, so that the order names every parameter once.
pub fn agree_on_order(
    pg: &dyn ProcessGroup,
    observed: &[usize],
    param_count: usize,
) -> Result<Vec<usize>, DistError> {
    let mut order: Vec<i64> = Vec::with_capacity(param_count);
    let mut seen = vec![false; param_count];
    for &p in observed.iter().chain((0..param_count).rev().collect::<Vec<_>>().iter()) {
        if !seen[p] {
            seen[p] = true;
            order.push(p as i64);
        }
    }
    let mut agreed = Tensor::from_slice(&order); // [param_count]
    pg.broadcast(&mut agreed, 0)?;
    let agreed = Vec::<i64>::try_from(&agreed).map_err(torch_error(pg, "reading rank 0's gradient order"))?;
    Ok(agreed.into_iter().map(|p| p as usize).collect())
}

impl GradientBuckets {
    /// If, with gradients ready in `order` (each parameter once), some
    /// bucket would complete after a later one, and so wait for it, plans
    /// the buckets again, with the same caps, filling them in `order`
    /// instead of reverse registration order. Returns the new layout's flat
    /// groups if the layout changed (new buffers then replace the old, and a
    /// gradient that lived in its old slot lives in its new one), `None` if
    /// it stays. Every rank must pass the same order (see [`agree_on_order`]).
    pub fn replan_in_order(
        &mut self,
        pg: &dyn ProcessGroup,
        params: &[Named],
        order: &[usize],
    ) -> Result<Option<FlatGroups>, DistError> {
        if completes_in_order(self.layout(), order) {
            return Ok(None);
        }
        let metas = ParamMeta::of(params);
        // `plan_buckets` walks its list from the last entry to the first:
        // hand it the order reversed, and map its indices back.
        let reversed: Vec<usize> = order.iter().rev().copied().collect();
        let permuted: Vec<ParamMeta> = reversed.iter().map(|&p| metas[p].clone()).collect();
        let caps = self.caps();
        let mut layout = plan_buckets(&permuted, caps.cap_bytes, caps.first_cap_bytes);
        for bucket in &mut layout {
            bucket.params.iter_mut().for_each(|j| *j = reversed[*j]);
        }
        if layout == self.layout() {
            return Ok(None);
        }
        self.relayout(pg, params, layout)?;
        Ok(Some(self.flat_groups()))
    }
}

/// Whether each bucket's last member comes, in `order`, before the last
/// member of every later bucket: then every bucket leaves as it completes.
fn completes_in_order(layout: &[super::layout::Bucket], order: &[usize]) -> bool {
    let mut position = vec![0; order.len()];
    order.iter().enumerate().for_each(|(at, &p)| position[p] = at);
    let completed_at: Vec<usize> =
        layout.iter().map(|b| b.params.iter().map(|&p| position[p]).max().unwrap_or(0)).collect();
    completed_at.windows(2).all(|w| w[0] < w[1])
}
