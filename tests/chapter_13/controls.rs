//! Chapter 13 tests, part 3: the controls, which never run your code.
//! Compiled into `cargo test --test chapter_13` (see `tests/chapter_13.rs`).
//!
//! The ground the chapter's claims stand on: the library's own ZeRO-2 takes
//! the workbook's DDP's steps bit for bit, and DDP those of one process
//! within `TOLERANCE`. A control passes on the untouched stubs too.

use super::training::{assert_ddps_steps, one_process, train_ddp, train_zero2, Whose, CAPS};

#[test]
fn the_librarys_zero2_takes_ddps_steps() {
    for world in [2, 3] {
        let zero2 = train_zero2(Whose::Library, world, CAPS, 1);
        assert_ddps_steps(
            &format!("library, {world} ranks"),
            &zero2,
            &train_ddp(world, CAPS, 1),
            &one_process(world, 1),
        );
    }
}

/// `clear_grad` fails with an `AutogradError`; `reduce_scatter_bucket`
/// returns a `DistError`: the chapter's `autograd_error` turns one into the
/// other, naming the rank and keeping the cause.
#[test]
fn autograd_error_turns_clear_grads_error_into_a_dist_error() {
    use ddp_workbook::autograd::AutogradError;
    use ddp_workbook::ch13_sharded_gradients::autograd_error;
    use ddp_workbook::dist::{DistError, Group};

    let got = crate::common::run(2, |pg: Group| {
        let cause = AutogradError::Invalid("not a leaf".into());
        Ok((pg.rank(), autograd_error(pg.as_ref(), "letting `w` go")(cause)))
    });
    for (rank, error) in got {
        match &error {
            DistError::Invalid { rank: r, op, detail } => {
                assert_eq!((*r, op.as_str(), detail.as_str()), (rank, "letting `w` go", "not a leaf"));
            }
            other => panic!("rank {rank}: expected DistError::Invalid, got {other:?}"),
        }
        assert!(error.to_string().contains(&format!("rank {rank}")), "{error} does not name rank {rank}");
    }
}
