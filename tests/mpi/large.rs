//! Messages of more than 2^31 − 1 elements on the MPI backend, which MPI
//! cannot count in one call (its counts are `int`): the backend cuts them
//! into calls of at most that many (`src/dist/mpi/ffi.rs`). A resume
//! broadcasts the checkpoint file as one byte tensor, so a checkpoint over
//! 2 GiB depends on it. Each rank checks what it received against the
//! bytes it computes itself; the test prints how long the transfer took.
//!
//! Run: cargo test --features mpi --test mpi large (about 6.6 GB of memory)

use std::time::Instant;

use ddp_workbook::tch::{Device, Kind, Tensor};

use crate::harness::launch;

/// What each rank prints when its body returned (`FINISHED` in harness.rs).
const FINISHED: &str = "mpi-test-rank-finished";

/// Bytes of the message: more than i32::MAX (2,147,483,647).
const LEN: i64 = 2_200_000_001;

/// The bytes repeat with a prime period, so a piece that lands at the
/// wrong offset, or twice, differs from what is expected there.
const PERIOD: i64 = 251;

fn period() -> Tensor {
    Tensor::arange(PERIOD, (Kind::Uint8, Device::Cpu))
}

/// The message: byte i is i mod 251.
fn message() -> Tensor {
    period().repeat([LEN / PERIOD + 1]).narrow(0, 0, LEN).contiguous()
}

/// Whether `t` holds the message, compared in pieces of 64 MiB or so.
fn holds_the_message(t: &Tensor) -> anyhow::Result<()> {
    anyhow::ensure!(t.size() == [LEN], "a tensor of {:?} bytes", t.size());
    let rows_per_piece = (64 << 20) / PERIOD;
    let whole_rows = LEN / PERIOD;
    let rows = t.narrow(0, 0, whole_rows * PERIOD).view([whole_rows, PERIOD]);
    let mut row = 0;
    while row < whole_rows {
        let n = rows_per_piece.min(whole_rows - row);
        let want = period().expand([n, PERIOD], false);
        anyhow::ensure!(rows.narrow(0, row, n).equal(&want), "rows {row}..{} differ", row + n);
        row += n;
    }
    let tail = LEN - whole_rows * PERIOD;
    anyhow::ensure!(
        t.narrow(0, whole_rows * PERIOD, tail).equal(&period().narrow(0, 0, tail)),
        "the tail differs"
    );
    Ok(())
}

fn report(rank: usize, what: &str, started: Instant) {
    eprintln!("rank {rank}: {what} of {LEN} bytes took {:.2} s", started.elapsed().as_secs_f64());
}

// A resume's broadcast of the checkpoint, and a send of the same size.
#[test]
fn a_broadcast_and_a_send_of_more_than_2_gib_arrive_whole_on_2_processes() {
    let name = "large::a_broadcast_and_a_send_of_more_than_2_gib_arrive_whole_on_2_processes";
    let job = launch(2, name, &[], |pg| {
        let rank = pg.rank();
        let mut t = match rank {
            0 => message(),
            _ => Tensor::zeros([LEN], (Kind::Uint8, Device::Cpu)),
        };
        let started = Instant::now();
        pg.broadcast(&mut t, 0)?;
        report(rank, "broadcast", started);
        holds_the_message(&t)?;
        let started = Instant::now();
        match rank {
            0 => pg.send(&t, 1)?,
            _ => {
                _ = t.zero_();
                pg.recv(&mut t, 0)?;
                report(rank, "send and recv", started);
                holds_the_message(&t)?;
            }
        }
        Ok(())
    });
    let Some(job) = job else { return };
    let finished = job.output.matches(FINISHED).count();
    assert!(
        job.success && finished == 2,
        "exit {:?}, {finished} of 2 ranks finished:\n{}",
        job.code,
        job.output
    );
    // The measurement, for `--nocapture`.
    for line in job.output.lines().filter(|l| l.contains(" took ")) {
        println!("{line}");
    }
    println!("the whole job took {:.1} s", job.elapsed.as_secs_f64());
}
