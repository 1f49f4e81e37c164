//! Chapter 14 tests, part 5: memory per rank, measured by the library's
//! ledger (every shard, gather, free, gradient shard and moment your
//! schedule causes) during one AdamW step of a GPT with eight blocks,
//! against DDP, which holds every full parameter, its gradient and both
//! moments on every rank all the time.

use ddp_workbook::ch14_fsdp::{FsdpAdamW, FsdpOptions, FullyShard};
use ddp_workbook::ddp::tensor_bytes;
use ddp_workbook::models::{named_parameters, Gpt, GptConfig};
use ddp_workbook::tch::Kind;

use super::schedule::assert_your_schedule_is_sound;
use super::training::{batch, gpt_config, loss, Case, Model, Opt};
use crate::common::run;

#[test]
fn peak_bytes_per_rank_stay_below_ddps_and_fall_with_more_ranks() {
    assert_your_schedule_is_sound();
    // Eight blocks: with two, one gathered block, the next one's prefetch
    // and the root outweigh the half of the model a rank stops holding.
    let cfg = GptConfig { n_layer: 8, ..gpt_config() };
    let case = Case::new(Model::Gpt, Opt::AdamW, true);
    let mut previous = usize::MAX;
    for world in [2, 4] {
        let (peak, ddp) = run(world, |pg| {
            let (vs, gpt) = Gpt::seeded(1, &cfg, Kind::Double);
            let options = FsdpOptions { reshard_after_forward: true, ..FsdpOptions::default() };
            let fsdp = FullyShard::gpt(&gpt, &vs, pg, options)?;
            let mut adamw = FsdpAdamW::new(&fsdp, 0.01, 0.0);
            fsdp.ledger().reset_peak();
            let (x, y) = batch(case, 0, 4);
            let logits = fsdp.forward_with(|hooks| gpt.forward_with_hooks(&x, hooks))?;
            fsdp.backward(&loss(case, &logits, &y))?;
            adamw.step(&fsdp)?;
            // DDP: parameters, gradients and two moments, all full.
            let ddp: usize = named_parameters(&vs).iter().map(|(_, p)| 4 * tensor_bytes(p)).sum();
            Ok((fsdp.ledger().peak().total(), ddp))
        })
        .swap_remove(0);
        println!("{world} ranks: peak {peak} bytes per rank with your FSDP, {ddp} with DDP");
        assert!(
            peak < ddp,
            "{world} ranks: your FSDP's peak ({peak} bytes of parameters, gradients and moments) must stay \
             below DDP's {ddp}: did you forget to free a unit after its forward or backward?"
        );
        assert!(peak < previous, "more ranks must mean fewer bytes per rank ({peak} after {previous})");
        previous = peak;
    }
}
