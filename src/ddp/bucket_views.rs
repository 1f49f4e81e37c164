//! Gradients that live in the buckets (PyTorch's `gradient_as_bucket_view`):
//! the finished wrapper's sync copies nothing in or out. The first time a
//! parameter has a gradient, its value is copied into the parameter's slot of
//! the bucket and the gradient becomes a view of that slot (`set_data`).
//! From then on backward adds straight into the bucket (autograd accumulates
//! into an existing gradient in place), `zero_grad` zeroes it there, and the
//! all-reduce leaves the average where the optimizer reads it.
//!
//! Tested by `cargo test --test ddp` and every test of the finished wrapper.

use tch::Tensor;

use super::bucketed::{check_missing_gradients, GradientBuckets};
use super::overlap_steps::attach_bucket;
use crate::dist::{tagged, torch_error, DistError, ProcessGroup, ReduceOp};

impl GradientBuckets {
    /// Averages every gradient of `params` over all ranks, one all-reduce per
    /// bucket, in place: gradients are views of their buckets (see above).
    /// A parameter without a gradient sends zeros and keeps no gradient.
    pub fn sync(&self, pg: &dyn ProcessGroup, params: &[(String, Tensor)]) -> Result<(), DistError> {
        for (index, (bucket, buffer)) in self.layout.iter().zip(&self.buffers).enumerate() {
            let mut buffer = buffer.shallow_clone();
            tagged(format!("bucket {index}"), || {
                tch::no_grad(|| -> Result<(), DistError> {
                    attach_bucket(pg, bucket, &buffer, params)?;
                    pg.all_reduce(&mut buffer, ReduceOp::Sum)?;
                    let _ = buffer
                        .f_div_scalar_(pg.world_size() as f64)
                        .map_err(torch_error(pg, "dividing a bucket by the world size"))?;
                    Ok(())
                })
            })?;
            check_missing_gradients(pg, bucket, &buffer, params)?;
        }
        Ok(())
    }

    /// Parameter `index`'s slot in its bucket: `[numel]`, a view.
    pub fn slot(&self, index: usize, params: &[(String, Tensor)]) -> Tensor {
        for (bucket, buffer) in self.layout.iter().zip(&self.buffers) {
            let mut offset = 0;
            for &member in &bucket.params {
                let numel = params[member].1.numel() as i64;
                if member == index {
                    return buffer.narrow(0, offset, numel);
                }
                offset += numel;
            }
        }
        panic!("parameter {index} is in no bucket: the layout was checked to hold every parameter");
    }

    /// Each bucket's members (indices into the parameters, in buffer order)
    /// and its buffer, which holds their averaged gradients after a sync:
    /// what an optimizer needs to update them flat, without copying.
    pub fn flat_groups(&self) -> Vec<(Vec<usize>, Tensor)> {
        self.layout
            .iter()
            .zip(&self.buffers)
            .map(|(b, buffer)| (b.params.clone(), buffer.shallow_clone()))
            .collect()
    }
}
