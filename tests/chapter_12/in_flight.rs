//! Chapter 12's check of WHEN a hook touches its tensors: a process group
//! under which an all-reduce's tensor has no value while it is in flight,
//! and the hook's contract checked around it. Part of `tests/chapter_12.rs`
//! (`cargo test --test chapter_12`).
//!
//! The in-process backend sums on a thread of its own, so a hook that reads
//! the result before waiting gets this rank's share, the sum, or a mix,
//! depending on timing; the values then only look wrong, or differ between
//! ranks. Under this group the same mistake is certain and named: the
//! tensor holds NaN from the all-reduce's start until its `Work` is waited
//! on (the `Work` contract: do not read it before, nor write into it).

use std::sync::{Arc, Mutex};

use crate::common::forwarding::{Forwarding, Intercept};
use ddp_workbook::check::same_bits;
use ddp_workbook::ddp::CommHook;
use ddp_workbook::dist::{DistError, Group, ReduceOp, Work};
use ddp_workbook::tch::{self, Kind, Tensor};

/// One all-reduce a hook started: what it carried, and whether its `Work`
/// was waited on.
#[derive(Clone, Debug)]
pub struct Launch {
    pub kind: Kind,
    pub numel: usize,
    pub waited: bool,
}

/// Every all-reduce started through the group, in order.
pub type Launches = Arc<Mutex<Vec<Launch>>>;

// ANCHOR: undefined_until_wait
/// Keeps a copy of each floating-point all-reduce's tensor and fills the
/// tensor with NaN (an odd one: [`odd_nan`]); at the wait, checks that nobody wrote into it, puts the
/// copy back and runs the real all-reduce. Integer tensors (the wrapper's
/// own checks) go through untouched.
pub struct UndefinedUntilWait(pub Launches);

impl Intercept for UndefinedUntilWait {
    fn all_reduce_async(&self, inner: &Group, tensor: &Tensor, op: ReduceOp) -> Result<Work, DistError> {
        let Some(poison) = odd_nan(tensor) else {
            return inner.all_reduce_async(tensor, op);
        };
        let index = {
            let mut launches = self.0.lock().unwrap();
            launches.push(Launch { kind: tensor.kind(), numel: tensor.numel(), waited: false });
            launches.len() - 1
        };
        let (sent, mut in_flight) = tch::no_grad(|| (tensor.copy(), tensor.shallow_clone()));
        tch::no_grad(|| in_flight.copy_(&poison));
        let (inner, launches) = (inner.clone(), self.0.clone());
        Ok(Work::new(move || {
            launches.lock().unwrap()[index].waited = true;
            if !same_bits(&in_flight, &poison) {
                return Err(DistError::Invalid {
                    rank: inner.rank(),
                    op: "all_reduce".into(),
                    detail:
                        "your hook wrote into the tensor of an all-reduce it had started, before waiting \
                             on its Work: until then the backend owns it (it may be on the wire). Change it \
                             before the all-reduce starts, or copy the result out after wait()"
                            .into(),
                });
            }
            tch::no_grad(|| in_flight.copy_(&sent));
            inner.all_reduce(&mut in_flight, op)
        }))
    }
}
// ANCHOR_END: undefined_until_wait

/// A tensor like `tensor` full of a NaN no arithmetic makes: negative, with
/// payload 1. libtorch writes every NaN it computes in bf16 as 0x7FC0, so
/// any write into a bf16 tensor full of 0xFFC1 changes its bits. None for
/// integer tensors.
fn odd_nan(tensor: &Tensor) -> Option<Tensor> {
    let (bits, pattern) = match tensor.kind() {
        Kind::BFloat16 => (Kind::Int16, 0xFFC1u16 as i16 as i64),
        Kind::Half => (Kind::Int16, 0xFE01u16 as i16 as i64),
        Kind::Float => (Kind::Int, 0xFFC0_0001u32 as i32 as i64),
        Kind::Double => (Kind::Int64, 0xFFF8_0000_0000_0001u64 as i64),
        _ => return None,
    };
    let words = Tensor::full(tensor.size(), pattern, (bits, tensor.device()));
    Some(words.view_dtype(tensor.kind()))
}

/// `pg` with every floating-point all-reduce undefined until its wait, and
/// the log of what was started through it.
pub fn undefined_until_wait(pg: Group) -> (Group, Launches) {
    let launches = Launches::default();
    let name = "local, all-reduces NaN until waited on";
    (Arc::new(Forwarding { inner: pg, name, intercept: UndefinedUntilWait(launches.clone()) }), launches)
}

/// The message for a bucket that holds NaN after the hook: it read the
/// all-reduce's tensor before waiting on its `Work`.
pub fn no_read_before_wait(bucket: &Tensor) -> anyhow::Result<()> {
    let nan = bucket.isnan();
    if nan.any().int64_value(&[]) != 0 {
        let first = nan.to_kind(Kind::Int64).argmax(None, false).int64_value(&[]);
        anyhow::bail!(
            "your hook read the all-reduce's tensor before waiting on its Work: the bucket holds NaN (first at \
             element {first}), which is what this test's group leaves in an all-reduce's tensor until its \
             Work is waited on (a real backend gives it no value while it travels). Copy the result back \
             inside the closure of the Work you return, after calling wait() on the all-reduce's Work"
        );
    }
    Ok(())
}

/// Runs `hook` on this rank's `buffer` under [`undefined_until_wait`], waits
/// on its `Work`, and checks the contract's timing on the way: one
/// all-reduce, of a bf16 tensor of the bucket's length; the bucket
/// unchanged until the wait; that all-reduce not waited on before the hook
/// returns, and waited on inside its Work; nothing read from
/// it before; the bucket written after. Leaves the hook's result in `buffer`.
pub fn run_hook(pg: Group, hook: CommHook, buffer: &Tensor) -> anyhow::Result<()> {
    let (group, launches) = undefined_until_wait(pg);
    let at_the_call = buffer.copy();
    let work = hook(group.as_ref(), buffer)?;
    let started = launches.lock().unwrap().clone();
    let [Launch { kind, numel, .. }] = started.as_slice() else {
        anyhow::bail!(
            "your hook started {} all-reduces for one bucket: the contract is one, of a bf16 tensor of the \
             bucket's length",
            started.len()
        );
    };
    anyhow::ensure!(
        (*kind, *numel) == (Kind::BFloat16, buffer.numel()),
        "your hook all-reduced a {kind:?} tensor of {numel} elements, for a bucket of {} {:?} elements: \
         the bucket must travel whole, as bf16 (a copy of it, cast with f_to_kind(Kind::BFloat16))",
        buffer.numel(),
        buffer.kind()
    );
    if !same_bits(buffer, &at_the_call) {
        no_read_before_wait(buffer)?;
        let changed =
            buffer.ne_tensor(&at_the_call).to_kind(Kind::Int64).argmax(None, false).int64_value(&[]);
        anyhow::bail!(
            "your hook changed the bucket before its Work was waited on (element {changed}: {} became {}): \
             the contract says its values must not change until then. The wrapper calls your hook during \
             backward and waits after it; write the mean into the bucket only inside the closure of the Work \
             you return, after waiting on the all-reduce's Work. Dividing the bucket in place counts (divide \
             into a new tensor), and so does a blocking all_reduce",
            at_the_call.double_value(&[changed]),
            buffer.double_value(&[changed])
        );
    }
    anyhow::ensure!(
        !started[0].waited,
        "your hook waited on the all-reduce's Work before returning: backward stops there until the bucket \
         has travelled, which is the overlap lost. Return a Work whose closure waits on it, so the wrapper \
         waits only after backward has launched every bucket"
    );
    work.wait()?;
    anyhow::ensure!(
        launches.lock().unwrap()[0].waited,
        "your hook's Work finished without waiting on the all-reduce's Work: the sum may not have arrived \
         yet. Move that Work into the closure of the Work you return, and call wait() on it first"
    );
    no_read_before_wait(buffer)?;
    anyhow::ensure!(
        !same_bits(buffer, &at_the_call),
        "the bucket still holds this rank's own gradients after your Work was waited on: the mean never \
         reached it. Write it into the bucket's own memory (a `buffer.shallow_clone()` moved into the \
         closure is that memory; `buffer.copy()` is a new tensor)"
    );
    Ok(())
}
