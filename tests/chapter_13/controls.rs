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
