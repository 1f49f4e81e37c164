//! A checkpoint of the ZeRO-1 optimizer (`zero.rs`). No rank holds the
//! whole AdamW state any more, so saving it is a collective: every rank
//! all-gathers every bucket's moments and cuts them back into per-parameter
//! tensors, named as the training run's `AdamW::state` names them. Loading
//! cuts each rank's shard out of such a state, whatever world size saved it,
//! so a run can resume on another number of ranks (or with plain AdamW).

use tch::Tensor;

use super::zero::ShardedAdamW;
use crate::dist::{torch_error, DistError};
use crate::models::Named;

// ANCHOR: gather
impl ShardedAdamW {
    /// The whole optimizer state, on every rank: `step`, and `exp_avg.<name>`
    /// and `exp_avg_sq.<name>` for every parameter, in its shape (what
    /// `AdamW::state` returns). A collective: every rank must call it.
    pub fn gathered_state(&self) -> Result<Vec<Named>, DistError> {
        let pg = self.pg.as_ref();
        let mut state = vec![("step".to_string(), Tensor::from_slice(&[self.step]))];
        for bucket in &self.buckets {
            for (prefix, shard) in [("exp_avg", &bucket.exp_avg), ("exp_avg_sq", &bucket.exp_avg_sq)] {
                let shards = pg.all_gather(shard)?; // world_size x [len], in rank order
                let whole =
                    Tensor::f_cat(&shards, 0).map_err(torch_error(pg, "joining the gathered moments"))?;
                let mut offset = 0;
                for &i in &bucket.members {
                    let (name, param) = &self.params[i];
                    let numel = param.numel() as i64;
                    state.push((
                        format!("{prefix}.{name}"),
                        whole.narrow(0, offset, numel).reshape(param.size()),
                    ));
                    offset += numel;
                }
            }
        }
        Ok(state)
    }
}
// ANCHOR_END: gather

impl ShardedAdamW {
    /// Restores a state that [`gathered_state`](Self::gathered_state) or
    /// `AdamW::state` returned, on any world size: each rank keeps its own
    /// shard of it. Fails, naming the entry, if one is missing or has the
    /// wrong shape or dtype. Needs no communication.
    pub fn load_state(&mut self, state: &[Named]) -> Result<(), DistError> {
        let rank = self.pg.rank();
        let invalid =
            |detail: String| DistError::Invalid { rank, op: "ShardedAdamW::load_state".into(), detail };
        let find = |key: &str| {
            let entry = state.iter().find(|(name, _)| name == key).map(|(_, t)| t);
            entry.ok_or_else(|| invalid(format!("no optimizer entry `{key}`")))
        };
        let step =
            Vec::<i64>::try_from(find("step")?).ok().and_then(|s| s.first().copied()).filter(|&s| s >= 0);
        let step = step.ok_or_else(|| invalid("the optimizer entry `step` is not a step count".into()))?;
        for bucket in &mut self.buckets {
            let (offset, len) = (bucket.shard.offset as i64, bucket.shard.len as i64);
            for prefix in ["exp_avg", "exp_avg_sq"] {
                let mut flats = vec![];
                for &i in &bucket.members {
                    let (name, param) = &self.params[i];
                    let (key, saved) = (format!("{prefix}.{name}"), find(&format!("{prefix}.{name}"))?);
                    if saved.size() != param.size() || saved.kind() != param.kind() {
                        let (kind, size) = (param.kind(), param.size());
                        let found = format!("{:?} {:?}", saved.kind(), saved.size());
                        return Err(invalid(format!(
                            "optimizer entry `{key}` is {found}, the model needs {kind:?} {size:?}"
                        )));
                    }
                    flats.push(saved.reshape([-1]));
                }
                let padding = bucket.shard.padded_numel - bucket.numel;
                flats.push(Tensor::zeros([padding as i64], (bucket.param.kind(), bucket.param.device())));
                let whole = Tensor::cat(&flats, 0); // [padded_numel]
                let mine = if prefix == "exp_avg" { &mut bucket.exp_avg } else { &mut bucket.exp_avg_sq };
                mine.copy_(&whole.narrow(0, offset, len));
            }
        }
        self.step = step;
        Ok(())
    }
}
