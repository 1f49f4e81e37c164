//! Chapter 11 tests, part 6: the controls, which never run your code.
//! Compiled into `cargo test --test chapter_11` (see `tests/chapter_11.rs`).
//!
//! They check the ground the chapter's claims stand on: the plain DDP run
//! the tests compare ZeRO-1 with matches one process; the AdamW arithmetic
//! gives the same bits on slices of a flat buffer as on the whole (so a rank
//! that steps its shard computes what DDP computes there); and the wrong ways of averaging `step_bucket.rs` looks for really give other
//! moments on its bucket than sum-then-divide (else it could not see them). A
//! control passes on the untouched stubs too; `cargo xtask test --only
//! teeth` checks that it does.

use ddp_workbook::ch11_zero::AdamW;
use ddp_workbook::check::same_bits;
use ddp_workbook::tch::{Device, Kind, Tensor};
use ddp_workbook::with_seed;

use super::step_bucket::{adamw_on_the_whole, averages};
use super::training::{one_process, train_ddp, LR, STEPS, WEIGHT_DECAY};
use crate::common::{assert_matches_one_process, Hints, Named, TOLERANCE};

#[test]
fn plain_ddp_with_adamw_matches_one_process() {
    for world_size in [2, 3, 4] {
        let ddp: Vec<Vec<Named>> = train_ddp(world_size).into_iter().map(|r| r.after_each_step).collect();
        let hints = Hints { replicas: "the library's DDP replicas differ", reference: "the library's DDP" };
        let largest = assert_matches_one_process("DDP", &ddp, &one_process(world_size), TOLERANCE, &hints);
        println!(
            "{world_size} ranks: plain DDP with AdamW within {largest:e} of one process over {STEPS} steps"
        );
    }
}

#[test]
fn adamw_on_slices_of_a_flat_buffer_gives_the_bits_of_adamw_on_the_whole() {
    // Seeded under the crate's lock: a bare randn would disturb the seeded
    // models that other tests build at the same time.
    let random = |seed: i64| with_seed(seed, || Tensor::randn([47], (Kind::Double, Device::Cpu)));
    let values = random(41);
    let whole = values.copy().set_requires_grad(true);
    let mut adamw = AdamW::new(&[("whole".to_string(), whole.shallow_clone())], LR, WEIGHT_DECAY);
    let sliced = values.copy(); // the same values, stepped in three slices
    let (m, v) = (sliced.zeros_like(), sliced.zeros_like());
    for step in 1..=3 {
        let grad = random(41 + step);
        (&whole * &grad).sum(Kind::Double).backward(); // whole.grad = grad
        adamw.step().expect("AdamW steps");
        adamw.zero_grad();
        let update = adamw.update_at(step);
        for (start, len) in [(0, 7), (7, 20), (27, 20)] {
            let (mut p, g) = (sliced.narrow(0, start, len), grad.narrow(0, start, len));
            let (mut ms, mut vs) = (m.narrow(0, start, len), v.narrow(0, start, len));
            update.apply(&mut p, &g, &mut ms, &mut vs).expect("the update runs");
        }
        assert!(same_bits(&whole.detach(), &sliced), "step {step}: slices differ from the whole");
    }
}

#[test]
fn the_ways_of_averaging_the_probe_bucket_give_other_first_moments() {
    let averages = averages();
    let moments: Vec<Tensor> = averages.iter().map(|(_, g)| adamw_on_the_whole(g).1).collect();
    for i in 0..moments.len() {
        for j in i + 1..moments.len() {
            let (a, b) = (averages[i].0, averages[j].0);
            assert!(!same_bits(&moments[i], &moments[j]), "two averages give the same moments:\n{a}\n{b}");
        }
    }
}
