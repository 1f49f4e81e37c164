//! FSDP's memory and timing claims: freeing really frees (the storage
//! autograd saved is 0 bytes between forward and backward), each rank's
//! peak of parameter bytes (from the library's ledger) stays below DDP's,
//! which holds every full parameter all the time, and the next unit's
//! all-gather is issued before the current unit's compute ends, forward
//! and backward.

use super::{batch, build, loss, Case, Model, Net, Opt};
use common::run;
use ddp_workbook::autograd::storage_bytes;
use ddp_workbook::ddp::{tensor_bytes, FsdpEvent};
use ddp_workbook::models::{named_parameters, Gpt, GptConfig};
use ddp_workbook::tch::Kind;

use super::common;

/// One GPT step on 2 ranks; what `f` makes of rank 0's run.
fn gpt_step<T: Send>(
    reshard: bool,
    f: impl Fn(&super::FullyShard, &Net, &[(String, ddp_workbook::tch::Tensor)]) -> T + Sync,
) -> T {
    let case = Case::new(Model::Gpt, Opt::Sgd, reshard);
    run(2, |pg| {
        let (vs, net) = build(case);
        let fsdp = super::shard_with(case, &net, &vs, pg, true);
        Ok(f(&fsdp, &net, &named_parameters(&vs)))
    })
    .swap_remove(0)
}

#[test]
fn resharding_frees_the_blocks_storage_between_forward_and_backward() {
    let case = Case::new(Model::Gpt, Opt::Sgd, true);
    let (during, after) = gpt_step(true, |fsdp, net, params| {
        let (x, y) = batch(case, 0, 4);
        let l = loss(case, &net.sharded(fsdp, &x), &y);
        let bytes = |prefix: &str| -> usize {
            params.iter().filter(|(n, _)| n.starts_with(prefix)).map(|(_, p)| storage_bytes(p)).sum()
        };
        let during = (bytes("blocks."), bytes("tok_emb"));
        fsdp.backward(&l).unwrap();
        (during, bytes(""))
    });
    assert_eq!(
        during.0, 0,
        "after forward, every block's full parameters must be freed (0 bytes of storage)"
    );
    assert!(during.1 > 0, "the root keeps its parameters between forward and backward, as FSDP2 does");
    assert_eq!(after, 0, "after backward, every full parameter must be freed");
}

#[test]
fn keeping_after_forward_keeps_the_blocks_storage() {
    let case = Case::new(Model::Gpt, Opt::Sgd, false);
    let during = gpt_step(false, |fsdp, net, params| {
        let (x, _) = batch(case, 0, 4);
        let _ = net.sharded(fsdp, &x);
        params
            .iter()
            .filter(|(n, _)| n.starts_with("blocks."))
            .all(|(_, p)| storage_bytes(p) == tensor_bytes(p))
    });
    assert!(during, "reshard_after_forward=false keeps each block's full parameters after its forward");
}

#[test]
fn peak_parameter_bytes_per_rank_stay_below_ddps() {
    // Eight blocks: with two, one gathered block, the next one's prefetch
    // and the root outweigh the half of the model a rank stops holding.
    let cfg = GptConfig { n_layer: 8, ..super::gpt_config() };
    let case = Case::new(Model::Gpt, Opt::AdamW, true);
    for reshard in [true, false] {
        let (peak, ddp, moments) = run(2, |pg| {
            let (vs, gpt) = Gpt::seeded(1, &cfg, Kind::Double);
            let options = super::fsdp_options(reshard);
            let fsdp = super::FullyShard::gpt(&gpt, &vs, pg, options)?;
            let adamw = super::FsdpAdamW::new(&fsdp, 0.01, 0.0);
            fsdp.ledger().reset_peak();
            let (x, y) = batch(case, 0, 4);
            let logits = fsdp.forward_with(|hooks| gpt.forward_with_hooks(&x, hooks))?;
            fsdp.backward(&loss(case, &logits, &y))?;
            drop(adamw);
            // DDP holds every full parameter on every rank the whole time.
            let ddp: usize = named_parameters(&vs).iter().map(|(_, p)| tensor_bytes(p)).sum();
            Ok((fsdp.ledger().peak_by_kind(), ddp, fsdp.ledger().alive().optimizer_state))
        })
        .swap_remove(0);
        println!(
            "reshard_after_forward={reshard}: peak parameter bytes {} of DDP's {ddp}; AdamW moments {moments} of DDP's {}",
            peak.parameters,
            2 * ddp
        );
        if reshard {
            assert!(
                peak.parameters < ddp,
                "FSDP's peak of parameter bytes ({}) must stay below DDP's {ddp}",
                peak.parameters
            );
        }
        assert!(moments <= ddp + 64 * 8, "each rank keeps the moments of its shard only ({moments} bytes)");
    }
}

#[test]
fn prefetch_issues_the_next_gather_before_the_current_unit_ends() {
    let case = Case::new(Model::Gpt, Opt::Sgd, true);
    let events = gpt_step(true, |fsdp, net, _| {
        let (x, y) = batch(case, 0, 4);
        let l = loss(case, &net.sharded(fsdp, &x), &y);
        fsdp.backward(&l).unwrap();
        fsdp.take_events()
    });
    println!("{events:?}");
    let at = |event: FsdpEvent| {
        events
            .iter()
            .position(|e| *e == event)
            .unwrap_or_else(|| panic!("{event:?} never happened: {events:?}"))
    };
    // Forward: units 0 (root), 1 and 2 (the blocks).
    for unit in 0..2 {
        assert!(
            at(FsdpEvent::GatherIssued(unit + 1)) < at(FsdpEvent::PostForward(unit)),
            "the all-gather of unit {} must be issued before unit {unit}'s forward ends",
            unit + 1
        );
    }
    // Backward: block 2, then block 1; block 1's gather leaves before block 2 ends.
    let backward_gather = events
        .iter()
        .enumerate()
        .filter(|(_, e)| **e == FsdpEvent::GatherIssued(1))
        .map(|(i, _)| i)
        .nth(1)
        .expect("block 1 is gathered again for backward");
    assert!(
        at(FsdpEvent::PreBackward(2)) < backward_gather && backward_gather < at(FsdpEvent::PostBackward(2)),
        "block 1's backward all-gather must be issued while block 2's backward computes"
    );
    assert!(
        at(FsdpEvent::PostBackward(2)) < at(FsdpEvent::PreBackward(1)),
        "units end backward in reverse order"
    );
}

#[test]
fn after_backward_only_gradient_shards_stay_and_no_sync_keeps_full_gradients() {
    let case = Case::new(Model::Gpt, Opt::Sgd, true);
    let (kept, synced, shards, full, none_left) = gpt_step(true, |fsdp, net, params| {
        let (x, y) = batch(case, 0, 4);
        fsdp.set_requires_gradient_sync(false);
        fsdp.backward(&loss(case, &net.sharded(fsdp, &x), &y)).unwrap();
        let kept = fsdp.ledger().alive().gradients;
        fsdp.set_requires_gradient_sync(true);
        fsdp.backward(&loss(case, &net.sharded(fsdp, &x), &y)).unwrap();
        let synced = fsdp.ledger().alive().gradients;
        let none_left = params.iter().all(|(_, p)| !p.grad().defined());
        let full: usize = params.iter().map(|(_, p)| tensor_bytes(p)).sum();
        let padded: usize = fsdp
            .sharded_parameters()
            .iter()
            .map(|p| {
                let full = &params.iter().find(|(n, _)| *n == p.name).unwrap().1;
                let rows = full.size().first().copied().unwrap_or(1);
                let chunk = (rows + 1) / 2; // ceil(rows / 2 ranks)
                (chunk * full.numel() as i64 / rows) as usize * 8
            })
            .sum();
        (kept, synced, padded, full, none_left)
    });
    assert!(
        none_left,
        "after a synced backward no full parameter may keep its `.grad` (FSDP2 sets it to None)"
    );
    assert_eq!(kept, full, "inside no_sync every full gradient stays between micro-batches");
    assert_eq!(synced, shards, "after a synced backward only the padded gradient shards stay");
}

#[test]
fn a_forward_that_skips_the_hooks_is_an_error() {
    let case = Case::new(Model::Gpt, Opt::Sgd, false);
    let message = gpt_step(false, |fsdp, net, _| {
        let Net::Gpt(gpt) = net else { unreachable!("a GPT case") };
        let (x, _) = batch(case, 0, 4);
        // Every unit starts freed: a hooked forward first gathers the blocks
        // (kept: reshard_after_forward=false), so the unhooked one reads
        // real values, and only the check can catch it.
        let _ = net.sharded(fsdp, &x);
        let skipped = fsdp.forward_with(|_| ddp_workbook::tch::nn::Module::forward(&**gpt, &x));
        skipped.err().map(|e| e.to_string())
    });
    let message = message.expect("a forward without the unit hooks must fail");
    assert!(message.contains("forward_with_hooks"), "the error says what to call: {message}");
}

#[test]
fn gradient_peak_holds_one_units_gradients_and_one_reduce_scatter_in_flight() {
    // Eight 8 -> 8 layers, each a unit, on 2 ranks, float64. Worked by hand:
    // a layer's full gradients are 8*8 + 8 = 72 values (576 bytes); its shard
    // is 4 of the 8 rows of each (36 values, 288 bytes); its reduce-scatter
    // input is both ranks' rows (72 values, 576 bytes, no padding). As in
    // FSDP2, a unit's post-backward waits for the previous reduce-scatter
    // and lets its input go, so at most one input is in flight while the
    // next unit's gradients accumulate.
    const LAYERS: usize = 8;
    let full_unit = (8 * 8 + 8) * 8;
    let shard = (4 * 8 + 4) * 8;
    let in_flight = 2 * shard;
    let bound = full_unit + LAYERS * shard + in_flight;
    let (peak, shards) = run(2, |pg| {
        let (vs, mlp) = ddp_workbook::with_seed(3, || {
            let mut vs = ddp_workbook::tch::nn::VarStore::new(ddp_workbook::tch::Device::Cpu);
            let mlp = ddp_workbook::models::Mlp::new(&vs.root(), &[8; LAYERS + 1]);
            vs.set_kind(Kind::Double);
            (vs, mlp)
        });
        let fsdp = super::FullyShard::mlp(&mlp, &vs, pg, super::fsdp_options(true), true)?;
        fsdp.ledger().reset_peak();
        let x = ddp_workbook::tch::Tensor::ones([4, 8], (Kind::Double, ddp_workbook::tch::Device::Cpu));
        let out = fsdp.forward_with(|hooks| mlp.forward_with_hooks(&x, hooks))?;
        fsdp.backward(&out.square().sum(Kind::Double))?;
        Ok((fsdp.ledger().peak_by_kind().gradients, fsdp.ledger().alive().gradients))
    })
    .swap_remove(0);
    println!(
        "gradient peak {peak} bytes; bound {bound}; every input alive at once would be {}",
        LAYERS * in_flight
    );
    assert_eq!(shards, LAYERS * shard, "after backward only the gradient shards stay");
    assert!(
        peak <= bound,
        "the ledger's gradient peak ({peak} bytes) must be at most one unit's full gradients ({full_unit}) plus \
         the shards ({}) plus one reduce-scatter input in flight ({in_flight}): {bound}",
        LAYERS * shard
    );
}
