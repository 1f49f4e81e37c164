//! The plumbing of one FSDP unit (PyTorch's `FSDPParamGroup` of
//! `FSDPParam`s): each parameter's shard, the full parameter whose storage
//! is filled and emptied, the copy into the all-gather's input and out of
//! its output, and the copy of the full gradients into the reduce-scatter's
//! input. What is done when is the schedule's (`schedule.rs`); this file
//! only knows how.

use tch::{Kind, Tensor};

use crate::autograd::{clear_grad, resize_storage, storage_bytes};
use crate::ddp::memory::{Holding, MemoryLedger};
use crate::dist::{DistError, ProcessGroup};

/// One parameter, sharded along dim 0 (FSDP2's `FSDPParam`).
pub(crate) struct FsdpParam {
    pub name: String,
    /// The model's own tensor, the full ("unsharded") parameter: a leaf
    /// whose storage holds its values only while the unit is gathered.
    pub full: Tensor,
    /// Rows along dim 0 (1 for a 0-d tensor), and elements per row.
    pub rows: i64,
    pub row_numel: i64,
    /// `ceil(rows / world_size)`: every rank's padded shard has this many rows.
    pub chunk: i64,
    /// This rank's rows: `(first, count)`; count may be 0.
    pub own: (i64, i64),
    /// Every rank's rows, as `shard_rows` gave them.
    pub layout: Vec<(i64, i64)>,
    /// This rank's shard, padded to `chunk * row_numel` elements, flat.
    pub padded_shard: Tensor,
    /// This rank's averaged gradient shard (padded, flat), once reduced.
    pub grad_shard: Option<Tensor>,
    /// Whether the ledger counts a full gradient of this parameter now.
    pub grad_counted: bool,
}

impl FsdpParam {
    pub fn padded_numel(&self) -> i64 {
        self.chunk * self.row_numel
    }

    /// The rows this rank owns of the shard (a view), what the optimizer steps.
    pub fn shard(&self) -> Tensor {
        self.padded_shard.narrow(0, 0, self.own.1 * self.row_numel)
    }

    /// The owned part of the gradient shard, if there is one.
    pub fn grad(&self) -> Option<Tensor> {
        self.grad_shard.as_ref().map(|g| g.narrow(0, 0, self.own.1 * self.row_numel))
    }

    /// Copies every rank's rows of this parameter out of an all-gather's
    /// output (its part starts at `offset` in each rank's input) into
    /// `flat`, the full parameter's elements, each rank's rows where
    /// `shard_rows` put them.
    pub fn copy_rows(&self, gathered: &[Tensor], offset: i64, flat: &Tensor) -> Result<(), tch::TchError> {
        tch::no_grad(|| {
            for (part, &(start, count)) in gathered.iter().zip(&self.layout) {
                if count > 0 {
                    let source = part.f_narrow(0, offset, count * self.row_numel)?;
                    flat.f_narrow(0, start * self.row_numel, count * self.row_numel)?.f_copy_(&source)?;
                }
            }
            Ok(())
        })
    }

    pub fn full_bytes(&self) -> usize {
        (self.rows * self.row_numel) as usize * self.full.kind().elt_size_in_bytes()
    }
}

/// A unit's parameters and whether their full values are present.
pub(crate) struct Unit {
    pub name: String,
    pub params: Vec<FsdpParam>,
    pub gathered: bool,
    pub kind: Kind,
}

fn torch(pg: &dyn ProcessGroup, what: &str) -> impl FnOnce(tch::TchError) -> DistError {
    let (rank, op) = (pg.rank(), what.to_string());
    move |cause| DistError::Torch { rank, op, cause }
}

fn shim(pg: &dyn ProcessGroup, what: &str) -> impl FnOnce(crate::autograd::AutogradError) -> DistError {
    let (rank, op) = (pg.rank(), what.to_string());
    move |error| DistError::Invalid { rank, op, detail: error.to_string() }
}

impl Unit {
    /// Cuts this rank's shard out of each full parameter (`rows` as the
    /// schedule's `shard_rows` says) and frees the full storage.
    pub fn new(
        pg: &dyn ProcessGroup,
        name: String,
        params: Vec<(String, Tensor)>,
        shard_rows: fn(i64, usize, usize) -> (i64, i64),
        ledger: &MemoryLedger,
    ) -> Result<Unit, DistError> {
        let (world, rank) = (pg.world_size(), pg.rank());
        let kind = params.first().map(|(_, p)| p.kind()).unwrap_or(Kind::Float);
        let mut sharded = vec![];
        for (pname, full) in params {
            let invalid = |detail: String| DistError::Invalid { rank, op: "fully_shard".into(), detail };
            if !full.is_contiguous() || full.kind() != kind || !full.device().eq(&tch::Device::Cpu) {
                return Err(invalid(format!(
                    "parameter `{pname}` of unit `{name}` must be a contiguous CPU tensor of the unit's dtype {kind:?} \
                     (it is {:?} on {:?}, contiguous: {}): FSDP here shards CPU parameters of one dtype per unit",
                    full.kind(),
                    full.device(),
                    full.is_contiguous()
                )));
            }
            let rows = full.size().first().copied().unwrap_or(1);
            let row_numel = if rows == 0 { 0 } else { full.numel() as i64 / rows };
            let chunk = (rows + world as i64 - 1) / world as i64;
            let layout: Vec<(i64, i64)> = (0..world).map(|r| shard_rows(rows, world, r)).collect();
            for (r, &(start, count)) in layout.iter().enumerate() {
                if start < 0 || count < 0 || count > chunk || start + count > rows {
                    return Err(invalid(format!(
                        "shard_rows({rows}, {world}, {r}) gave rows {:?}: want at most ceil(rows / world_size) = {chunk} rows inside 0..{rows}",
                        (start, count)
                    )));
                }
            }
            if layout.iter().map(|l| l.1).sum::<i64>() != rows {
                return Err(invalid(format!(
                    "shard_rows gives the ranks {layout:?} of the {rows} rows of `{pname}`: every row must be on exactly one rank"
                )));
            }
            let own = layout[rank];
            let padded_shard = tch::no_grad(|| -> Result<Tensor, tch::TchError> {
                let shard = Tensor::f_zeros([chunk * row_numel], (kind, full.device()))?;
                let mine = full.f_reshape([-1])?.f_narrow(0, own.0 * row_numel, own.1 * row_numel)?;
                shard.f_narrow(0, 0, own.1 * row_numel)?.f_copy_(&mine)?;
                Ok(shard)
            })
            .map_err(torch(pg, "cutting a shard"))?;
            ledger.alloc(
                Holding::Parameters,
                padded_shard.numel() * kind.elt_size_in_bytes(),
                &format!("shard of {pname}"),
            );
            sharded.push(FsdpParam {
                name: pname,
                full,
                rows,
                row_numel,
                chunk,
                own,
                layout,
                padded_shard,
                grad_shard: None,
                grad_counted: false,
            });
        }
        let mut unit = Unit { name, params: sharded, gathered: true, kind };
        // The full parameters were alive (the model built them): count them,
        // then free them as every later free does.
        let bytes = unit.params.iter().map(FsdpParam::full_bytes).sum();
        ledger.alloc(Holding::Parameters, bytes, &format!("full parameters of {} (as built)", unit.name));
        unit.free(pg, ledger)?;
        Ok(unit)
    }

    /// The all-gather's input: this rank's padded shards, concatenated.
    pub fn all_gather_input(&self, pg: &dyn ProcessGroup) -> Result<Tensor, DistError> {
        let shards: Vec<&Tensor> = self.params.iter().map(|p| &p.padded_shard).collect();
        if shards.is_empty() {
            return Tensor::f_zeros([0], (self.kind, tch::Device::Cpu))
                .map_err(torch(pg, "all-gather input"));
        }
        tch::no_grad(|| Tensor::f_cat(&shards, 0)).map_err(torch(pg, "all-gather input"))
    }

    /// Allocates the full parameters' storage again and copies every rank's
    /// rows out of the all-gather's output (`gathered[r]` is rank r's input).
    pub fn copy_out(
        &mut self,
        pg: &dyn ProcessGroup,
        gathered: &[Tensor],
        ledger: &MemoryLedger,
    ) -> Result<(), DistError> {
        let mut offset = 0;
        for p in &self.params {
            resize_storage(&p.full, p.full_bytes()).map_err(shim(pg, "allocating a full parameter"))?;
            // `data()` shares the storage with a version counter of its own:
            // autograd's saved references to `full` must not see an in-place
            // change (PyTorch's `_unsafe_preserve_version_counter`).
            let flat = p.full.data().reshape([-1]);
            p.copy_rows(gathered, offset, &flat).map_err(torch(pg, "copying out the all-gather"))?;
            offset += p.padded_numel();
        }
        self.gathered = true;
        let bytes = self.params.iter().map(FsdpParam::full_bytes).sum();
        ledger.alloc(Holding::Parameters, bytes, &format!("gather {}", self.name));
        Ok(())
    }

    /// After a failed gather: memory for the full parameters, filled with
    /// NaN, so that compute which cannot be stopped (a backward already
    /// running) reads no freed memory; the error is reported afterwards.
    pub fn fill_after_failure(&mut self) {
        for p in &self.params {
            if resize_storage(&p.full, p.full_bytes()).is_ok() {
                let _ = tch::no_grad(|| p.full.data().f_fill_(f64::NAN));
            }
        }
    }

    /// Frees the full parameters' storage (their sizes stay; autograd's
    /// saved references see 0 bytes until the next gather fills them).
    pub fn free(&mut self, pg: &dyn ProcessGroup, ledger: &MemoryLedger) -> Result<(), DistError> {
        if !self.gathered {
            return Ok(());
        }
        for p in &self.params {
            resize_storage(&p.full, 0).map_err(shim(pg, "freeing a full parameter"))?;
            debug_assert_eq!(storage_bytes(&p.full), 0);
        }
        self.gathered = false;
        let bytes = self.params.iter().map(FsdpParam::full_bytes).sum();
        ledger.free(Holding::Parameters, bytes, &format!("free {}", self.name));
        Ok(())
    }

    /// The reduce-scatter's input: each full gradient padded to
    /// `world_size * chunk` rows, cut into one chunk per rank, and the
    /// chunks laid out rank by rank (PyTorch's `_chunk_cat`), divided by
    /// `pre`; and which parameters it holds. Frees the full gradients.
    ///
    /// A parameter without a gradient is left out, as FSDP2's
    /// `post_backward` keeps only `fsdp_params_with_grad`: it then gets no
    /// gradient shard, and the optimizer skips it, where a zero gradient
    /// would let AdamW's moments and weight decay move it. As under FSDP2,
    /// every rank must have gradients for the same parameters (a parameter
    /// that some ranks used and others not gives inputs of other lengths).
    pub fn reduce_scatter_input(
        &mut self,
        pg: &dyn ProcessGroup,
        pre: f64,
        ledger: &MemoryLedger,
    ) -> Result<(Tensor, Vec<usize>), DistError> {
        let world = pg.world_size() as i64;
        let mut columns = vec![];
        let mut with_grad = vec![];
        for (j, p) in self.params.iter_mut().enumerate() {
            let grad = p.full.grad();
            if grad.defined() {
                let padded = tch::no_grad(|| -> Result<Tensor, tch::TchError> {
                    let padded = Tensor::f_zeros([world, p.padded_numel()], (self.kind, tch::Device::Cpu))?;
                    let flat = grad.f_reshape([-1])?;
                    for (r, &(start, count)) in p.layout.iter().enumerate() {
                        let rows = flat.f_narrow(0, start * p.row_numel, count * p.row_numel)?;
                        padded.get(r as i64).f_narrow(0, 0, count * p.row_numel)?.f_copy_(&rows)?;
                    }
                    Ok(padded)
                })
                .map_err(torch(pg, "reduce-scatter input"))?;
                columns.push(padded);
                with_grad.push(j);
            }
            if p.grad_counted {
                p.grad_counted = false;
                ledger.free(Holding::Gradients, p.full_bytes(), &format!("free the gradient of {}", p.name));
            }
            if grad.defined() {
                clear_grad(&p.full).map_err(shim(pg, "freeing a full gradient"))?;
            }
        }
        let input = tch::no_grad(|| -> Result<Tensor, tch::TchError> {
            let mut input = if columns.is_empty() {
                Tensor::f_zeros([0], (self.kind, tch::Device::Cpu))?
            } else {
                Tensor::f_cat(&columns, 1)?.f_reshape([-1])?
            };
            if pre != 1.0 {
                let _ = input.f_div_scalar_(pre)?;
            }
            Ok(input)
        })
        .map_err(torch(pg, "reduce-scatter input"))?;
        Ok((input, with_grad))
    }

    /// Takes this rank's output of the reduce-scatter of the parameters
    /// `with_grad` (as `reduce_scatter_input` gave them): divides by `post`
    /// and adds each one's part to its gradient shard (FSDP2 accumulates
    /// into a sharded gradient that was not zeroed).
    pub fn take_reduced(
        &mut self,
        pg: &dyn ProcessGroup,
        output: Tensor,
        with_grad: &[usize],
        post: f64,
        ledger: &MemoryLedger,
    ) -> Result<(), DistError> {
        let mut offset = 0;
        for &j in with_grad {
            let p = &mut self.params[j];
            let mut part = output.narrow(0, offset, p.padded_numel());
            offset += p.padded_numel();
            tch::no_grad(|| -> Result<(), tch::TchError> {
                if post != 1.0 {
                    let _ = part.f_div_scalar_(post)?;
                }
                match &p.grad_shard {
                    Some(g) => _ = g.shallow_clone().f_add_(&part)?,
                    None => {
                        let g = part.f_contiguous()?.copy();
                        ledger.alloc(
                            Holding::Gradients,
                            g.numel() * self.kind.elt_size_in_bytes(),
                            &format!("gradient shard of {}", p.name),
                        );
                        p.grad_shard = Some(g);
                    }
                }
                Ok(())
            })
            .map_err(torch(pg, "taking the reduce-scatter's output"))?;
        }
        Ok(())
    }
}
