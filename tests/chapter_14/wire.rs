//! Chapter 14 tests, part 4: the bytes each rank hands to every collective
//! call in one step, counted call by call by a group around the
//! library's, against values worked out by hand and against the
//! workbook's DDP counted the same way.
//!
//! What FSDP sends per step, with `reshard_after_forward`: one all-gather
//! per unit in forward, one more per block in backward (freed after
//! forward, so gathered again; the root is kept after forward, so it is
//! not), and one reduce-scatter per unit. On a ring each rank sends N - 1
//! times its all-gather input and (N - 1)/N of its reduce-scatter input;
//! DDP's all-reduce sends 2(N - 1)/N of the gradients. When every
//! parameter is in a block and no shard is padded, that is 1.5 times DDP's:
//! the reduce-scatter and the forward all-gather are, together, DDP's
//! all-reduce; the backward all-gather is the extra half. Without
//! `reshard_after_forward` nothing is gathered twice: DDP's bytes.

use ddp_workbook::ch14_fsdp::FsdpOptions;
use ddp_workbook::ddp::SimpleDistributedDataParallelism;
use ddp_workbook::models::named_parameters;

use super::schedule::assert_your_schedule_is_sound;
use super::training::{batch, build, gpt_config, local_rows, loss, shard, Case, Model, Opt, LOCAL};
use crate::common::counting::{counted, ring_bytes, Call};
use crate::common::run;

/// The calls of rank 0 in one step of your FSDP (after construction).
fn fsdp_calls(case: Case, world: usize) -> Vec<Call> {
    assert_your_schedule_is_sound();
    run(world, |pg| {
        let (group, calls) = counted(&pg);
        let (vs, net) = build(case);
        let fsdp = shard(case, &net, &vs, group, FsdpOptions::default());
        calls.take();
        let (start, len) = local_rows(case, world as i64, 0, pg.rank() as i64, 0);
        let (x, y) = batch(case, start, len);
        fsdp.backward(&loss(case, &net.sharded(&fsdp, &x), &y))?;
        Ok(calls.take())
    })
    .swap_remove(0)
}

/// The calls of rank 0 in one step of the workbook's DDP.
fn ddp_calls(case: Case, world: usize) -> Vec<Call> {
    run(world, |pg| {
        let (group, calls) = counted(&pg);
        let (vs, net) = build(case);
        let ddp = SimpleDistributedDataParallelism::new(net, &vs, group)?;
        calls.take();
        let (x, y) = batch(case, pg.rank() as i64 * LOCAL, LOCAL);
        ddp.backward(&loss(case, &ddp.forward(&x), &y))?;
        Ok(calls.take())
    })
    .swap_remove(0)
}

fn sorted_by_op(calls: &[Call], op: &str) -> Vec<usize> {
    let mut bytes: Vec<usize> = calls.iter().filter(|c| c.0 == op).map(|c| c.1).collect();
    bytes.sort_unstable();
    bytes
}

#[test]
fn resharding_sends_one_and_a_half_times_ddps_all_reduce() {
    // By hand, [4, 8, 6, 2] on 2 ranks, every layer a unit, the root empty:
    // layer 0 is 8x4 + 8 = 40 doubles, layer 1 6x8 + 6 = 54, layer 2
    // 2x6 + 2 = 14: 108 doubles, 864 bytes. Every row count divides by 2,
    // so a rank's shards are 20, 27 and 7 doubles: 160, 216 and 56 bytes,
    // gathered in forward and again in backward; each reduce-scatter takes
    // the unit's full gradient: 320, 432 and 112 bytes.
    let case = Case::new(Model::EvenMlp, Opt::Sgd, true);
    let calls = fsdp_calls(case, 2);
    assert_eq!(
        sorted_by_op(&calls, "all_gather"),
        [56, 56, 160, 160, 216, 216],
        "all-gathers of one step, bytes each: every layer in forward, and again in backward (freed after \
         forward). Fewer: your schedule skips a gather; more: it gathers something twice. Calls: {calls:?}"
    );
    assert_eq!(
        sorted_by_op(&calls, "reduce_scatter"),
        [112, 320, 432],
        "one reduce-scatter per unit: {calls:?}"
    );
    assert_eq!(
        sorted_by_op(&calls, "all_reduce"),
        Vec::<usize>::new(),
        "FSDP all-reduces nothing: {calls:?}"
    );
    // On a ring: all-gathers 1 x 864, reduce-scatters 1/2 x 864: 1296 bytes.
    let fsdp = ring_bytes(&calls, 2);
    assert_eq!(fsdp, 1296.0, "bytes rank 0 sends per step on a ring");
    // DDP: one all-reduce of 864 bytes of gradients, 2 x 1/2 x 864 on a ring.
    let ddp_calls = ddp_calls(case, 2);
    let ddp = ring_bytes(&ddp_calls, 2);
    assert_eq!(ddp, 864.0, "the workbook's DDP sends 2(N-1)/N of 864 bytes: {ddp_calls:?}");
    // And its end-of-backward check: 2 x 6 parameters + 2 ranks int32 flags.
    assert_eq!(sorted_by_op(&ddp_calls, "flags"), [56], "DDP's flags: {ddp_calls:?}");
    println!("[4, 8, 6, 2] on 2 ranks: FSDP sends {fsdp} bytes per step, DDP {ddp}: {}x", fsdp / ddp);
    assert_eq!(fsdp / ddp, 1.5);
}

#[test]
fn kept_after_forward_sends_what_ddp_sends() {
    let case = Case::new(Model::EvenMlp, Opt::Sgd, false);
    let calls = fsdp_calls(case, 2);
    assert_eq!(
        sorted_by_op(&calls, "all_gather"),
        [56, 160, 216],
        "reshard_after_forward=false: each layer is gathered once per step (kept until its backward): {calls:?}"
    );
    assert_eq!(ring_bytes(&calls, 2), 864.0, "SHARD_GRAD_OP sends what DDP's all-reduce sends");
}

#[test]
fn the_gpt_sends_what_its_shapes_say_less_than_one_and_a_half_times_ddp() {
    // The root (embeddings, ln_f, lm_head) is kept after forward: only the
    // blocks are gathered again. So FSDP sends, per step, on N ranks,
    // (N - 1) x (root + 2 x blocks) shard bytes plus (N - 1)/N of the
    // padded full bytes; computed here from the shapes, as by hand.
    let case = Case::new(Model::Gpt, Opt::Sgd, true);
    let world = 2;
    let (vs, _) = build(case);
    let (mut root, mut blocks, mut padded, mut full) = (0.0, 0.0, 0.0, 0.0);
    for (name, p) in named_parameters(&vs) {
        let rows = p.size().first().copied().unwrap_or(1);
        let chunk = (rows + world as i64 - 1) / world as i64;
        let shard = (chunk * p.numel() as i64 / rows) as f64 * 8.0;
        if name.starts_with("blocks.") {
            blocks += shard;
        } else {
            root += shard;
        }
        padded += shard * world as f64;
        full += p.numel() as f64 * 8.0;
    }
    let n = world as f64;
    let expected = (n - 1.0) * (root + 2.0 * blocks) + (n - 1.0) / n * padded;
    let fsdp = ring_bytes(&fsdp_calls(case, world), world);
    assert_eq!(fsdp, expected, "bytes per step: root once, blocks twice, one reduce-scatter per unit");
    let ddp = 2.0 * (n - 1.0) / n * full;
    assert_eq!(ring_bytes(&ddp_calls(case, world), world), ddp, "DDP all-reduces every gradient once");
    println!(
        "GPT {:?} on 2 ranks: FSDP {fsdp} bytes per step, DDP {ddp}: {:.3}x (the root, {:.0}% of the \
         shard bytes, is gathered once)",
        gpt_config(),
        fsdp / ddp,
        100.0 * root / (root + blocks)
    );
    assert!(fsdp > ddp && fsdp < 1.5 * ddp);
}
