//! When a rank panics, returns an error, leaves early, skips a call or makes
//! a different call, every rank gets an error that names the culprit, fast,
//! and no rank ever gets a wrong answer.
//! Run: `cargo test --test dist failures`

use std::time::{Duration, Instant};

use ddp_workbook::dist::{DistError, Group, RankFailure, ReduceOp};
use ddp_workbook::tch::{Kind, Tensor};

use super::{dist_error, failed_ranks, run_err, run_ok, GENEROUS, PROMPT, SHORT};

/// How long a rank that skips a call stays alive: far past `SHORT`, so that
/// its peers time out (and do not see it leave) even on a busy machine.
const ASLEEP: Duration = Duration::from_secs(3);

fn one(kind: Kind) -> Tensor {
    Tensor::ones([4], (kind, ddp_workbook::tch::Device::Cpu))
}

/// Every rank in `ranks` failed with PeerGone naming `peer`, during `op`.
fn assert_peer_gone(
    error: &ddp_workbook::dist::SpawnError,
    ranks: &[usize],
    peer_want: usize,
    op_part: &str,
    why: &str,
) {
    for &r in ranks {
        match dist_error(error, r) {
            DistError::PeerGone { rank, op, peer, reason } => {
                assert_eq!((*rank, *peer), (r, peer_want), "rank {r}: {op}: {reason}");
                assert!(op.contains(op_part), "rank {r}: the error names {op:?}, not {op_part:?}");
                assert!(reason.contains(why), "rank {r}: the reason {reason:?} does not say {why:?}");
            }
            other => panic!("rank {r}: expected PeerGone naming rank {peer_want}, got {other}"),
        }
    }
}

#[test]
fn a_panicking_rank_fails_its_peers_promptly() {
    // 0 ms: the others meet the dead rank in their next call.
    // 200 ms: they are already waiting in it when the rank panics.
    for delay in [0, 200] {
        let started = Instant::now();
        let error = run_err(4, GENEROUS, |pg| {
            let mut t = one(Kind::Float);
            pg.all_reduce(&mut t, ReduceOp::Sum)?; // call #0 succeeds everywhere
            if pg.rank() == 2 {
                std::thread::sleep(Duration::from_millis(delay));
                panic!("rank two exploded");
            }
            pg.all_reduce(&mut t, ReduceOp::Sum)?; // call #1 can never complete
            Ok(())
        });
        assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());
        assert_eq!(failed_ranks(&error)[0], 2, "the cause must come first: {error}");
        assert!(matches!(error.failure_of(2), Some(RankFailure::Panicked(m)) if m == "rank two exploded"));
        assert!(error.to_string().starts_with("rank 2 panicked: rank two exploded"), "{error}");
        assert_peer_gone(
            &error,
            &[0, 1, 3],
            2,
            "all_reduce(sum) of Float[4] (call #1)",
            "panicked: rank two exploded",
        );
    }
}

#[test]
fn a_rank_returning_an_error_fails_its_peers_promptly() {
    let started = Instant::now();
    let error = run_err(3, GENEROUS, |pg| {
        if pg.rank() == 1 {
            std::thread::sleep(Duration::from_millis(100));
            anyhow::bail!("the data file is missing");
        }
        pg.broadcast(&mut one(Kind::Double), 0)?;
        Ok(())
    });
    assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());
    assert_eq!(failed_ranks(&error)[0], 1, "{error}");
    assert!(error.to_string().starts_with("rank 1 returned an error: the data file is missing"), "{error}");
    assert_peer_gone(&error, &[0, 2], 1, "broadcast(root=0)", "the data file is missing");
}

#[test]
fn a_rank_that_finishes_early_fails_peers_waiting_in_a_collective() {
    let started = Instant::now();
    let error = run_err(3, GENEROUS, |pg| {
        if pg.rank() != 0 {
            pg.all_gather(&one(Kind::Float))?;
        }
        Ok(())
    });
    assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());
    assert_eq!(failed_ranks(&error).len(), 2, "rank 0 itself did nothing wrong: {error}");
    assert!(error.failure_of(0).is_none());
    assert_peer_gone(&error, &[1, 2], 0, "all_gather", "finished");
}

#[test]
fn a_rank_that_finishes_early_fails_a_recv_after_its_last_message() {
    let started = Instant::now();
    let error = run_err(2, GENEROUS, |pg| {
        let mut t = one(Kind::Float);
        if pg.rank() == 0 {
            pg.send(&(&t * 7), 1)?; // one message, then rank 0 is done
            return Ok(());
        }
        pg.recv(&mut t, 0)?; // the message sent before leaving still arrives
        anyhow::ensure!(t.double_value(&[0]) == 7.0, "rank 1 received {t}");
        pg.recv(&mut t, 0)?; // no second message will ever come
        Ok(())
    });
    assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());
    assert_eq!(failed_ranks(&error), vec![1], "{error}");
    assert_peer_gone(&error, &[1], 0, "recv from rank 0", "finished");
}

#[test]
fn sending_to_a_rank_that_left_fails() {
    let error = run_err(2, GENEROUS, |pg| {
        if pg.rank() == 1 {
            return Ok(()); // gone at once; anything sent to it would be lost
        }
        let started = Instant::now();
        while started.elapsed() < PROMPT {
            pg.send(&one(Kind::Float), 1)?; // succeeds (buffered) until rank 1 has left
            std::thread::sleep(Duration::from_millis(10));
        }
        anyhow::bail!("send kept succeeding long after rank 1 finished")
    });
    assert_peer_gone(&error, &[0], 1, "send to rank 1", "finished");
}

#[test]
fn a_rank_that_leaves_after_joining_an_async_call_still_contributes() {
    // Rank 1 starts the all-reduce (its input is on the table), then panics
    // without waiting. The others get the full sum, then fail at the barrier.
    let sums = std::sync::Mutex::new(Vec::new());
    let error = run_err(3, GENEROUS, |pg| {
        let t = Tensor::from((pg.rank() + 1) as f32);
        let work = pg.all_reduce_async(&t, ReduceOp::Sum)?;
        if pg.rank() == 1 {
            panic!("rank one gave up after starting the all-reduce");
        }
        work.wait()?;
        sums.lock().unwrap().push(t.double_value(&[]));
        pg.barrier()?;
        Ok(())
    });
    assert_eq!(sums.into_inner().unwrap(), vec![6.0, 6.0], "1 + 2 + 3 on ranks 0 and 2");
    assert_eq!(failed_ranks(&error)[0], 1, "{error}");
    assert_peer_gone(&error, &[0, 2], 1, "barrier (call #1)", "panicked");
}

#[test]
fn a_rank_that_leaves_while_its_thread_still_reduces_fails_no_one() {
    // The same, with a tensor large enough that rank 1's communication
    // thread is still reducing its slice (in place, into every rank's
    // tensor) when rank 1 panics. Ranks 0 and 2 must get the whole sum, not
    // an error while the chain goes on writing into their tensors.
    for round in 0..3 {
        let sums = std::sync::Mutex::new(Vec::new());
        let error = run_err(3, GENEROUS, |pg| {
            let t = Tensor::ones([1 << 24], (Kind::Float, ddp_workbook::tch::Device::Cpu));
            let work = pg.all_reduce_async(&t, ReduceOp::Sum)?;
            if pg.rank() == 1 {
                panic!("rank one gave up while its slice was being reduced");
            }
            work.wait()?;
            let (low, high) = (t.min().double_value(&[]), t.max().double_value(&[]));
            sums.lock().unwrap().push((pg.rank(), low, high));
            Ok(())
        });
        let mut sums = sums.into_inner().unwrap();
        sums.sort_by_key(|(rank, _, _)| *rank);
        assert_eq!(
            sums,
            vec![(0, 3.0, 3.0), (2, 3.0, 3.0)],
            "round {round}: 1 + 1 + 1 everywhere on ranks 0 and 2"
        );
        assert_eq!(failed_ranks(&error), vec![1], "round {round}: only rank 1 fails: {error}");
    }
}

#[test]
fn a_rank_that_skips_a_call_while_alive_makes_the_others_time_out() {
    let started = Instant::now();
    let error = run_err(3, SHORT, |pg| {
        if pg.rank() == 1 {
            std::thread::sleep(ASLEEP); // alive, but never calls the all-reduce
            return Ok(());
        }
        pg.all_reduce(&mut one(Kind::Float), ReduceOp::Max)?;
        Ok(())
    });
    assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());
    for r in [0, 2] {
        match dist_error(&error, r) {
            DistError::Timeout { rank, op, missing, waited } => {
                assert_eq!((*rank, missing.as_slice(), *waited), (r, &[1][..], SHORT), "{op}");
                assert!(op.starts_with("all_reduce(max)"), "{op}");
            }
            other => panic!("rank {r}: expected a Timeout naming rank 1, got {other}"),
        }
    }
    // A recv from a rank that never sends times out the same way.
    let error = run_err(2, SHORT, |pg| {
        if pg.rank() == 0 {
            pg.recv(&mut one(Kind::Float), 1)?;
        } else {
            std::thread::sleep(ASLEEP);
        }
        Ok(())
    });
    assert!(
        matches!(dist_error(&error, 0), DistError::Timeout { missing, op, .. } if missing == &[1] && op == "recv from rank 1")
    );
}

#[test]
fn a_rank_arriving_after_its_peers_gave_up_gets_an_error_not_a_result() {
    let error = run_err(2, SHORT, |pg| {
        let mut t = one(Kind::Float);
        if pg.rank() == 1 {
            std::thread::sleep(ASLEEP); // rank 0 times out meanwhile
        }
        pg.all_reduce(&mut t, ReduceOp::Sum)?;
        Ok(t)
    });
    assert!(matches!(dist_error(&error, 0), DistError::Timeout { missing, .. } if missing == &[1]));
    assert_peer_gone(
        &error,
        &[1],
        0,
        "all_reduce(sum)",
        "gave up on this call after waiting 300ms for rank(s) [1]",
    );
}

/// Runs a program in which rank 2 of 3 calls something else than ranks 0
/// and 1, and checks that every rank gets a Mismatch that shows both calls.
fn assert_mismatch_everywhere(
    same: impl Fn(&Group) -> Result<(), DistError> + Sync,
    different: impl Fn(&Group) -> Result<(), DistError> + Sync,
    detail_parts: &[&str],
) {
    let started = Instant::now();
    let error = run_err(3, GENEROUS, |pg| {
        if pg.rank() == 2 {
            different(&pg)?
        } else {
            same(&pg)?
        }
        Ok(())
    });
    assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());
    for r in 0..3 {
        match dist_error(&error, r) {
            DistError::Mismatch { rank, detail, .. } => {
                assert_eq!(*rank, r);
                for part in detail_parts {
                    assert!(detail.contains(part), "rank {r}: {detail:?} does not mention {part:?}");
                }
            }
            other => panic!("rank {r}: expected a Mismatch, got {other}"),
        }
    }
}

#[test]
fn mismatched_calls_fail_on_every_rank() {
    let sum = |kind: Kind, n: i64| {
        move |pg: &Group| {
            pg.all_reduce(&mut Tensor::ones([n], (kind, ddp_workbook::tch::Device::Cpu)), ReduceOp::Sum)
        }
    };
    // Shape, dtype, operation, reduce op, root, and a barrier against a gather.
    assert_mismatch_everywhere(sum(Kind::Float, 4), sum(Kind::Float, 5), &["Float[4]", "Float[5]"]);
    assert_mismatch_everywhere(sum(Kind::Float, 4), sum(Kind::Double, 4), &["Float[4]", "Double[4]"]);
    assert_mismatch_everywhere(
        sum(Kind::Float, 4),
        |pg| pg.broadcast(&mut one(Kind::Float), 0),
        &["all_reduce(sum)", "broadcast(root=0)"],
    );
    assert_mismatch_everywhere(
        sum(Kind::Float, 4),
        |pg| pg.all_reduce(&mut one(Kind::Float), ReduceOp::Max),
        &["all_reduce(sum)", "all_reduce(max)"],
    );
    assert_mismatch_everywhere(
        |pg| pg.broadcast(&mut one(Kind::Int64), 0),
        |pg| pg.broadcast(&mut one(Kind::Int64), 1),
        &["broadcast(root=0)", "broadcast(root=1)", "rank 2"],
    );
    assert_mismatch_everywhere(
        |pg| pg.barrier(),
        |pg| pg.all_gather(&one(Kind::Float)).map(drop),
        &["barrier", "all_gather"],
    );
}

#[test]
fn recv_into_a_buffer_of_the_wrong_shape_or_dtype_is_a_mismatch() {
    let errors = run_ok(2, |pg| {
        if pg.rank() == 0 {
            pg.send(&Tensor::ones([3], (Kind::Float, ddp_workbook::tch::Device::Cpu)), 1)?;
            pg.send(&Tensor::ones([3], (Kind::Float, ddp_workbook::tch::Device::Cpu)), 1)?;
            return Ok(vec![]);
        }
        let wrong_shape = pg.recv(&mut Tensor::zeros([4], (Kind::Float, ddp_workbook::tch::Device::Cpu)), 0);
        let wrong_kind = pg.recv(&mut Tensor::zeros([3], (Kind::Double, ddp_workbook::tch::Device::Cpu)), 0);
        Ok(vec![wrong_shape.unwrap_err(), wrong_kind.unwrap_err()])
    });
    for (error, want) in errors[1].iter().zip(["Float[4]", "Double[3]"]) {
        assert!(
            matches!(error, DistError::Mismatch { rank: 1, detail, .. } if detail.contains("Float[3]") && detail.contains(want)),
            "{error}"
        );
    }
}

#[test]
fn a_recv_that_times_out_asks_whether_the_sender_sends() {
    let error = run_err(2, SHORT, |pg| {
        if pg.rank() == 1 {
            pg.recv(&mut one(Kind::Float), 0)?; // rank 0 never sends
        } else {
            std::thread::sleep(ASLEEP); // alive, so the wait ends by the deadline
        }
        Ok(())
    });
    let message = dist_error(&error, 1).to_string();
    assert!(message.contains("is rank 0 sending to this rank?"), "{message}");
    assert!(!message.contains("same calls in the same order"), "that hint is for collectives: {message}");
}

#[test]
fn asynchronous_all_reduces_behind_a_silent_peer_time_out_one_timeout_after_their_call() {
    // Rank 0 starts four asynchronous all-reduces at once; rank 1 is alive
    // but makes none. Each call's deadline counts from the call, so all four
    // fail after about one timeout, not one timeout after the one before
    // (they wait in rank 0's communication thread one behind the other).
    const TIMEOUT: Duration = Duration::from_secs(1);
    let rank_0_done = std::sync::atomic::AtomicBool::new(false);
    let results =
        ddp_workbook::dist::spawn_with(ddp_workbook::dist::SpawnOptions::new(2).timeout(TIMEOUT), |pg| {
            if pg.rank() == 1 {
                let started = Instant::now(); // alive, and silent, until rank 0 has seen every failure
                while !rank_0_done.load(std::sync::atomic::Ordering::SeqCst) && started.elapsed() < PROMPT {
                    std::thread::sleep(Duration::from_millis(10));
                }
                return Ok(vec![]);
            }
            let called = Instant::now();
            let works: Vec<_> = (0..4)
                .map(|_| pg.all_reduce_async(&one(Kind::Float), ReduceOp::Sum))
                .collect::<Result<_, _>>()?;
            let failed: Vec<(Duration, String)> = works
                .into_iter()
                .map(|work| match work.wait() {
                    Err(error @ DistError::Timeout { .. }) => (called.elapsed(), error.to_string()),
                    other => panic!("rank 0: expected a Timeout, got {other:?}"),
                })
                .collect();
            rank_0_done.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(failed)
        })
        .unwrap_or_else(|error| panic!("{error}"));
    for (call, (after, message)) in results[0].iter().enumerate() {
        println!("call {call}: failed {after:?} after it was made: {message}");
        assert!(message.contains("[1]"), "call {call} must name the silent rank 1: {message}");
        assert!(
            *after < 2 * TIMEOUT,
            "call {call} failed {after:?} after it was made, with a timeout of {TIMEOUT:?}: its deadline \
             started when the communication thread got to it, not when it was called"
        );
    }
}
