//! What ZeRO-1 ([`ShardedAdamW`](super::ShardedAdamW)) and ZeRO-2
//! ([`ShardGradOp`](super::ShardGradOp)) do the same way, written once:
//! refuse a shard the collectives would misplace, lay a bucket's
//! parameters out in one padded flat buffer, and gather or restore the
//! AdamW state whose moments each rank holds one shard of. Both keep the
//! same state under the same names, so a checkpoint of either resumes the
//! other (or plain AdamW).

use tch::Tensor;

use super::shards::Shard;
use crate::ddp::adamw_update::param_steps;
use crate::dist::{torch_error, DistError, ProcessGroup};
use crate::models::Named;

/// One bucket's moments as this rank holds them: its members (indices into
/// the parameters, in buffer order), their elements before padding, this
/// rank's shard, and the `[len]` moments of that shard.
pub(super) struct Moments<'a> {
    pub members: &'a [usize],
    pub numel: usize,
    pub shard: Shard,
    pub exp_avg: &'a Tensor,
    pub exp_avg_sq: &'a Tensor,
}

/// Fails, saying what is wrong, unless `shard` splits a buffer of `numel`
/// elements into equal parts, one per rank, that cover it, and this rank's
/// part is the one `reduce_scatter` leaves on it: `offset == rank * len`.
/// Any other offset would pass every local test yet make the all-gather,
/// which puts the shards back in rank order, duplicate or permute
/// parameters (every rank at offset 0, or the ranks in reverse). `op` names
/// the constructor that ran `shard_of`.
pub(super) fn check_shard(
    op: &str,
    pg: &dyn ProcessGroup,
    numel: usize,
    shard: Shard,
) -> Result<(), DistError> {
    let (rank, world_size) = (pg.rank(), pg.world_size());
    let Shard { padded_numel, offset, len } = shard;
    let problem = if padded_numel < numel {
        Some(format!("its padded length {padded_numel} is shorter than the {numel} elements it holds"))
    } else if len * world_size != padded_numel {
        Some(format!("{world_size} shards of {len} elements do not make its padded length {padded_numel}"))
    } else if offset != rank * len {
        Some(format!(
            "rank {rank}'s shard starts at offset {offset}, but the rule is offset == rank * len \
             (= {rank} * {len} = {}): reduce_scatter leaves the rank-th of the {world_size} equal \
             chunks on rank {rank}, and all_gather puts each rank's shard back there; make \
             shard_of return offset rank * len",
            rank * len
        ))
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(problem) => {
            let detail = format!("shard_of({numel}, {world_size}, {rank}) returned {shard:?}: {problem}");
            Err(DistError::Invalid { rank, op: op.into(), detail })
        }
    }
}

/// One padded flat buffer (`[padded_numel]`) for `members`' values, which
/// become views into it (as `AdamW` lays its groups out), their values
/// unchanged.
pub(super) fn lay_out(
    pg: &dyn ProcessGroup,
    params: &[Named],
    members: &[usize],
    numel: usize,
    shard: Shard,
) -> Result<Tensor, DistError> {
    let (kind, device) = (params[members[0]].1.kind(), params[members[0]].1.device());
    let mut flats: Vec<Tensor> = members.iter().map(|&i| params[i].1.detach().reshape([-1])).collect();
    flats.push(Tensor::zeros([(shard.padded_numel - numel) as i64], (kind, device)));
    let param = Tensor::f_cat(&flats, 0).map_err(torch_error(pg, "laying out a bucket"))?; // [padded_numel]
    let mut offset = 0;
    for &i in members {
        let (n, shape) = (params[i].1.numel() as i64, params[i].1.size());
        // A shallow clone shares the parameter's storage: set_data on it
        // moves the model's own parameter into the buffer.
        let mut p = params[i].1.shallow_clone();
        p.set_data(&param.narrow(0, offset, n).view(shape.as_slice()));
        offset += n;
    }
    Ok(param)
}

// ANCHOR: gather
/// The whole AdamW state, on every rank, by `AdamW::state`'s names:
/// `step`, `step.<name>` per parameter, and `exp_avg.<name>`,
/// `exp_avg_sq.<name>` in the parameter's shape, all-gathered from every
/// rank's shards. A collective: every rank must call it.
pub(super) fn gathered_state<'a>(
    pg: &dyn ProcessGroup,
    step: i64,
    params: &[Named],
    steps_of_params: &[i64],
    buckets: impl Iterator<Item = Moments<'a>>,
) -> Result<Vec<Named>, DistError> {
    let mut state = vec![("step".to_string(), Tensor::from_slice(&[step]))];
    for ((name, _), count) in params.iter().zip(steps_of_params) {
        state.push((format!("step.{name}"), Tensor::from_slice(&[*count])));
    }
    for bucket in buckets {
        for (prefix, shard) in [("exp_avg", bucket.exp_avg), ("exp_avg_sq", bucket.exp_avg_sq)] {
            let shards = pg.all_gather(shard)?; // world_size x [len], in rank order
            let whole = Tensor::f_cat(&shards, 0).map_err(torch_error(pg, "joining the gathered moments"))?;
            let mut offset = 0;
            for &i in bucket.members {
                let (name, param) = &params[i];
                let numel = param.numel() as i64;
                state
                    .push((format!("{prefix}.{name}"), whole.narrow(0, offset, numel).reshape(param.size())));
                offset += numel;
            }
        }
    }
    Ok(state)
}
// ANCHOR_END: gather

/// Copies this rank's shard of each bucket's moments out of `saved` (what
/// [`gathered_state`] or `AdamW::state` returned, on any world size) and
/// returns the optimizer's step and the per-parameter steps. Fails, naming
/// the entry and `op`, if one is missing or has the wrong shape or dtype.
/// Needs no communication.
pub(super) fn load_state<'a>(
    op: &str,
    rank: usize,
    saved: &[Named],
    params: &[Named],
    buckets: impl Iterator<Item = Moments<'a>>,
) -> Result<(i64, Vec<i64>), DistError> {
    let invalid = |detail: String| DistError::Invalid { rank, op: op.into(), detail };
    let find = |key: &str| {
        let entry = saved.iter().find(|(name, _)| name == key).map(|(_, t)| t);
        entry.ok_or_else(|| invalid(format!("no optimizer entry `{key}`")))
    };
    let step = Vec::<i64>::try_from(find("step")?).ok().and_then(|s| s.first().copied()).filter(|&s| s >= 0);
    let step = step.ok_or_else(|| invalid("the optimizer entry `step` is not a step count".into()))?;
    for bucket in buckets {
        let (offset, len) = (bucket.shard.offset as i64, bucket.shard.len as i64);
        for (prefix, mine) in [("exp_avg", bucket.exp_avg), ("exp_avg_sq", bucket.exp_avg_sq)] {
            let mut flats = vec![];
            for &i in bucket.members {
                let (name, param) = &params[i];
                let key = format!("{prefix}.{name}");
                let entry = find(&key)?;
                if entry.size() != param.size() || entry.kind() != param.kind() {
                    let (kind, size) = (param.kind(), param.size());
                    let found = format!("{:?} {:?}", entry.kind(), entry.size());
                    return Err(invalid(format!(
                        "optimizer entry `{key}` is {found}, the model needs {kind:?} {size:?}"
                    )));
                }
                flats.push(entry.reshape([-1]));
            }
            let padding = (bucket.shard.padded_numel - bucket.numel) as i64;
            flats.push(Tensor::zeros([padding], (mine.kind(), mine.device())));
            let whole = Tensor::cat(&flats, 0); // [padded_numel]
                                                // A shallow clone shares the moment's storage: copying into it
                                                // writes the optimizer's own moment.
            tch::no_grad(|| mine.shallow_clone().copy_(&whole.narrow(0, offset, len)));
        }
    }
    let names: Vec<String> = params.iter().map(|(name, _)| name.clone()).collect();
    Ok((step, param_steps(saved, &names, step).map_err(invalid)?))
}
