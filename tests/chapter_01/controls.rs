//! Chapter 01 tests, the controls: they never run your code, and show that
//! the checks of `tests/chapter_01.rs` can fail. Compiled into
//! `cargo test --test chapter_01` (libtest names them `controls::...`).
//!
//! A control passes on the untouched stubs too; `cargo xtask test --only
//! teeth` checks that it does, and that every test outside `mod controls`
//! reaches your code (fails on the stubs, naming `exercise ch01:`).

use ddp_workbook::dist::{DistError, ProcessGroup, ReduceOp};
use ddp_workbook::tch::Tensor;

use super::{
    check_only_point_to_point, compare_across_ranks, compare_with_builtin, integer_valued_f32, run_case,
};

/// The cautionary tale from the design notes: an "all-reduce" that returns its input.
fn fake_all_reduce(_pg: &dyn ProcessGroup, _tensor: &mut Tensor) -> Result<(), DistError> {
    Ok(())
}

/// Passes every check but the last: it calls the built-in.
fn builtin_all_reduce(pg: &dyn ProcessGroup, tensor: &mut Tensor) -> Result<(), DistError> {
    pg.all_reduce(tensor, ReduceOp::Sum)
}

#[test]
fn negative_control_a_fake_all_reduce_is_caught() {
    let outcomes = run_case(3, &[7], integer_valued_f32, fake_all_reduce);
    let error = compare_with_builtin(&outcomes, &[7], 0.0, "fake").expect_err("must differ");
    assert!(error.contains("rank 0, element [0]"), "the report must name rank and element: {error}");
    compare_across_ranks(&outcomes, &[7], "fake").expect_err("the ranks kept different inputs");
}

#[test]
fn negative_control_calling_the_builtin_is_caught() {
    let outcomes = run_case(2, &[7], integer_valued_f32, builtin_all_reduce);
    compare_with_builtin(&outcomes, &[7], 0.0, "built-in").expect("the built-in agrees with itself");
    let error = check_only_point_to_point(&outcomes[0].stats, 0, "built-in").expect_err("one all_reduce");
    assert!(error.contains("1 collective call"), "{error}");
}
