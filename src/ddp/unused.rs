//! The check at the end of an overlapped backward: did every rank compute a
//! gradient for the same parameters? A parameter that got none sent zeros
//! in its slot, so no rank hangs; but unless the model said it skips
//! parameters (`find_unused_parameters`), that is a bug worth stopping for,
//! on every rank at once, by name.
//!
//! Tested by `cargo test --test overlap` and `cargo test --test chapter_06`.

use tch::Tensor;

use super::bucketed::GradientBuckets;
use crate::dist::{tagged, DistError, ReduceOp};

/// Every rank learns which parameters got no gradient on some rank, and
/// which got one on some rank (one small all-reduce of two masks). Unless
/// unused parameters were expected, every rank fails with the same error,
/// naming them. When they were, a parameter that this rank did not use but
/// another did gets the averaged gradient here too, so that every replica
/// takes the same step.
pub(super) fn unused_check(
    pg: &dyn crate::dist::ProcessGroup,
    buckets: &GradientBuckets,
    params: &[(String, Tensor)],
    unused: &[usize],
    find_unused_parameters: bool,
    tag: &str,
) -> Result<(), DistError> {
    let n = params.len() as i64;
    // On the parameters' device: a GPU backend moves GPU tensors only.
    let device = params.first().map_or(tch::Device::Cpu, |(_, p)| p.device());
    let mut mask = Tensor::zeros([2, n], (tch::Kind::Int, device)); // [unused here, used here]
    let _ = mask.get(1).fill_(1);
    for &i in unused {
        let _ = mask.get(0).get(i as i64).fill_(1);
        let _ = mask.get(1).get(i as i64).fill_(0);
    }
    tagged(format!("{tag}, unused parameters"), || pg.all_reduce(&mut mask, ReduceOp::Max))?;
    let unused_somewhere: Vec<usize> =
        (0..params.len()).filter(|&i| mask.int64_value(&[0, i as i64]) != 0).collect();
    if unused_somewhere.is_empty() {
        return Ok(());
    }
    if !find_unused_parameters {
        let names: Vec<&str> = unused_somewhere.iter().map(|&i| params[i].0.as_str()).collect();
        let detail = format!(
            "parameter(s) {names:?} got no gradient in this backward pass on at least one rank. Their \
             buckets were sent with zeros in their place, so every rank still agrees; but a model \
             that skips parameters must say so: pass `find_unused_parameters: true` (PyTorch's \
             find_unused_parameters=True), or use every parameter in the loss"
        );
        return Err(DistError::Invalid {
            rank: pg.rank(),
            op: "the gradient sync at the end of backward".into(),
            detail,
        });
    }
    for &i in unused {
        if mask.int64_value(&[1, i as i64]) != 0 {
            let (name, param) = &params[i];
            let averaged = buckets.slot(i, params).view(param.size().as_slice()).copy();
            crate::autograd::set_grad(param, &averaged).map_err(|e| DistError::Invalid {
                rank: pg.rank(),
                op: format!("giving `{name}` the gradient other ranks computed"),
                detail: e.to_string(),
            })?;
        }
    }
    Ok(())
}
