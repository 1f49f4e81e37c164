//! Chapter 02 tests, the control: it never runs your code, and shows what
//! the check protects against. Compiled into `cargo test --test chapter_02`
//! (libtest names it `controls::...`). A control passes on the untouched
//! stubs too; `cargo xtask test --only teeth` checks that it does, and that
//! every test outside `mod controls` reaches your code.

use ddp_workbook::check::compare_replicas;
use ddp_workbook::models::Mlp;
use ddp_workbook::tch::Kind;

use super::{all_tensors, run, SEED, SIZES};

#[test]
fn negative_control_without_the_check_different_seeds_really_differ() {
    // Nobody wraps a model here: this shows what the check protects against.
    let (per_rank, _) = run(2, |pg| {
        let (vs, _mlp) = Mlp::seeded(SEED + pg.rank() as i64, SIZES, Kind::Double);
        Ok(all_tensors(&vs))
    });
    let report = compare_replicas(&per_rank, 0.0).expect_err("two seeds built the same model?");
    println!("without the check:\n{report}");
    assert!(report.largest_difference() > 0.01, "{report}");
    // Same seed: bitwise equal, so the difference above comes from the seed alone.
    let (per_rank, _) = run(2, |_| Ok(all_tensors(&Mlp::seeded(SEED, SIZES, Kind::Double).0)));
    compare_replicas(&per_rank, 0.0).unwrap_or_else(|report| panic!("{report}"));
}
