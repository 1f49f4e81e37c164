//! Chapter 03 tests, the control: training without `sync_gradients` (it
//! never runs your code) makes the replicas drift far beyond the tolerance,
//! so the checks of `tests/chapter_03.rs` cannot pass by accident. Compiled
//! into `cargo test --test chapter_03` (libtest names it `controls::...`).
//! A control passes on the untouched stubs too; `cargo xtask test --only
//! teeth` checks that it does, and that every test outside `mod controls`
//! reaches your code.

use ddp_workbook::check::{max_reference_diff, max_replica_diff, snapshot};

use super::common::{global_batches, train_single_process, Optim, TOLERANCE};
use super::{data, mlp, train_ddp, GLOBAL_BATCH, STEPS};

#[test]
fn negative_control_without_sync_the_replicas_drift_apart() {
    for (world_size, optim) in [(2, Optim::Sgd), (3, Optim::Sgd), (2, Optim::Adam), (3, Optim::Adam)] {
        let runs = train_ddp(world_size, optim, false, mlp);
        let reference = train_single_process(mlp, optim, &global_batches(&data(), GLOBAL_BATCH, STEPS));
        let last: Vec<_> = runs.iter().map(|run| snapshot(&run.after_each_step[STEPS - 1])).collect();
        let drift = max_replica_diff(&last);
        let off = max_reference_diff(&last[0], &reference[STEPS - 1].params);
        println!("{optim:?} on {world_size} ranks WITHOUT sync: replicas {drift:e} apart, rank 0 {off:e} from one process");
        // Far beyond the tolerance: so the checks above cannot pass by accident.
        assert!(
            drift > 1e6 * TOLERANCE,
            "{optim:?}, {world_size} ranks: without sync the replicas still agree to {drift:e}"
        );
        assert!(
            off > 1e6 * TOLERANCE,
            "{optim:?}, {world_size} ranks: without sync rank 0 still matches one process to {off:e}"
        );
        assert!(
            runs.iter().all(|run| run.all_reduces.iter().all(|&n| n == 0)),
            "the control must not communicate"
        );
    }
}
