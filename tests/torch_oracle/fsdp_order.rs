//! FSDP2's order of additions, put into the workbook's naive gradient sync,
//! so that its run can be held to PyTorch's `fully_shard` bit for bit on 3
//! ranks too: the proof that the only 3-rank difference between the
//! workbook's DDP and FSDP2 is the order in which gloo adds.
//! Compiled into `cargo test --features solutions,mpi,nccl --test torch_oracle`.
//!
//! FSDP2 reduce-scatters each unit's gradients as one flat buffer of N parts
//! (`foreach_reduce_scatter_copy_in`): part r holds, for each parameter of
//! the unit in registration order, its r-th chunk along dim 0 (chunks of
//! ceil(rows / N) rows, the last ones padded with zeros). gloo adds each
//! element of that buffer in the ring order of its position
//! (gloo_order.rs). So a parameter's element (row i, rest j) lies at
//! c S + offset + (i - c rows_c) cols + j, where c = i / rows_c is the
//! rank that keeps it, S the part's length and offset the length of the
//! unit's earlier parameters' chunks. This group sums each all-reduce of the
//! naive sync (one per parameter, tagged with its name) in that order.

use std::collections::HashMap;

use ddp_workbook::dist::{current_tag, torch_error, DistError, Group, ReduceOp, Work};
use ddp_workbook::models::named_parameters;
use ddp_workbook::tch::{self, Kind, Tensor};

use crate::forwarding::{Forwarding, Intercept};
use crate::gloo_order::gloo_chunks;
use crate::stages::{build, FsdpUnits, Stage};

/// The `fully_shard` unit a parameter belongs to: `blocks.K` for a
/// transformer block's, when each block is a unit, or the root's ("").
fn unit_of(units: FsdpUnits, name: &str) -> String {
    match (units, name.strip_prefix("blocks.")) {
        (FsdpUnits::PerBlock, Some(rest)) => format!("blocks.{}", rest.split('.').next().unwrap_or_default()),
        _ => String::new(),
    }
}

/// The rows of a parameter of `rows` rows that each rank keeps at most on
/// `world_size` ranks (torch.chunk's chunks): rank r keeps the rows from
/// r times this on, if any are left.
pub fn rows_per_rank(rows: i64, world_size: usize) -> i64 {
    (rows + world_size as i64 - 1) / world_size as i64
}

/// A parameter in its unit's buffer: name, shape, rows per chunk (ceil(rows
/// / N)), and elements per row.
struct Member {
    name: String,
    shape: Vec<i64>,
    rows_c: i64,
    cols: i64,
}

/// For every parameter of `stage`'s model, the ring chunk of gloo's
/// reduce-scatter that adds each of its elements on `world_size` ranks,
/// as an i64 tensor of the parameter's shape.
pub fn ring_chunks(stage: &Stage, world_size: usize) -> HashMap<String, Tensor> {
    let units =
        stage.fully_shard.unwrap_or_else(|| panic!("stage `{}` has no fully_shard", stage.name)).units;
    let (vs, _) = build(&stage.model);
    let params = named_parameters(&vs);
    let n = world_size as i64;
    // Per unit, its members in registration order.
    let mut by_unit: Vec<(String, Vec<Member>)> = Vec::new();
    for (name, p) in &params {
        let shape = p.size();
        let rows = shape.first().copied().unwrap_or(1);
        let cols: i64 = shape.iter().skip(1).product();
        let unit = unit_of(units, name);
        let entry = Member { name: name.clone(), shape, rows_c: rows_per_rank(rows, world_size), cols };
        match by_unit.iter_mut().find(|(u, _)| *u == unit) {
            Some((_, members)) => members.push(entry),
            None => by_unit.push((unit, vec![entry])),
        }
    }
    let mut chunks = HashMap::new();
    for (_, members) in by_unit {
        let part: i64 = members.iter().map(|m| m.rows_c * m.cols).sum();
        let ring = gloo_chunks((part * n) as usize, 8, world_size);
        let chunk_at =
            |position: i64| ring.iter().position(|r| r.contains(&(position as usize))).unwrap() as i64;
        let mut offset = 0;
        for Member { name, shape, rows_c, cols } in members {
            let numel: i64 = shape.iter().product();
            let of_element: Vec<i64> = (0..numel)
                .map(|e| {
                    let (i, j) = (e / cols, e % cols);
                    let c = i / rows_c;
                    chunk_at(c * part + offset + (i - c * rows_c) * cols + j)
                })
                .collect();
            chunks.insert(name, Tensor::from_slice(&of_element).reshape(shape.as_slice()));
            offset += rows_c * cols;
        }
    }
    chunks
}

/// Sums each float64 all-reduce (SUM) of a parameter's gradient, as the
/// naive sync tags it, in the order FSDP2's gloo reduce-scatter adds it.
struct Fsdp2Order {
    /// Per parameter, as i64 numbers (tensors are not Sync): the ring chunk
    /// of each element, and its shape.
    chunks: HashMap<String, (Vec<i64>, Vec<i64>)>,
}

impl Intercept for Fsdp2Order {
    fn all_reduce_async(&self, inner: &Group, tensor: &Tensor, op: ReduceOp) -> Result<Work, DistError> {
        let tag = current_tag().unwrap_or_default();
        let name = tag.rsplit_once("gradient of `").and_then(|(_, rest)| rest.strip_suffix('`'));
        let (Some((chunks, shape)), Kind::Double, ReduceOp::Sum) =
            (name.and_then(|n| self.chunks.get(n)), tensor.kind(), op)
        else {
            return inner.all_reduce_async(tensor, op);
        };
        let everyone = inner.all_gather(tensor)?;
        let chunk_of = Tensor::from_slice(chunks).reshape(shape.as_slice());
        let n = everyone.len();
        let mut sum = tensor.zeros_like();
        for k in 0..n {
            // chunk k: (((x[k-1] + x[k-2]) + ...) + x[k]), ranks mod n
            let ring = (2..=n).fold(everyone[(k + n - 1) % n].copy(), |s, j| s + &everyone[(k + n - j) % n]);
            sum = ring.where_self(&chunk_of.eq(k as i64), &sum);
        }
        let mut result = tensor.shallow_clone();
        let written = torch_error(inner.as_ref(), "writing FSDP2's sum into the all-reduce's tensor");
        Ok(Work::new(move || tch::no_grad(|| result.f_copy_(&sum)).map(|_| ()).map_err(written)))
    }
}

/// `pg`, with the naive sync's float64 sums of `stage`'s gradients in the
/// order of FSDP2's gloo reduce-scatter on this world size.
pub fn in_fsdp2_order(stage: &Stage, pg: Group) -> Group {
    let chunks = ring_chunks(stage, pg.world_size())
        .into_iter()
        .map(|(name, t)| (name, (Vec::<i64>::try_from(t.reshape([-1])).unwrap(), t.size())))
        .collect();
    std::sync::Arc::new(Forwarding {
        inner: pg,
        name: "float64 sums in FSDP2's reduce-scatter order",
        intercept: Fsdp2Order { chunks },
    })
}
