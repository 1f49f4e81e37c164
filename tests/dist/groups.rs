//! Sub-groups made with `new_group`: collectives among their members only,
//! ranks renumbered in the order given, and failures that still propagate.
//! Run: `cargo test --test dist groups`

use std::time::{Duration, Instant};

use ddp_workbook::dist::{DistError, Group, ReduceOp};
use ddp_workbook::tch::Tensor;

use super::{dist_error, failed_ranks, run_err, run_ok, GENEROUS, PROMPT};

/// Every rank makes both pairs, {0, 1} and {2, 3}, and keeps the one it is in.
fn my_pair(pg: &Group) -> anyhow::Result<Group> {
    let low = pg.new_group(&[0, 1])?;
    let high = pg.new_group(&[2, 3])?;
    anyhow::ensure!(low.is_some() != high.is_some(), "rank {} is in exactly one pair", pg.rank());
    Ok(low.or(high).expect("checked just above"))
}

#[test]
fn two_pairs_all_reduce_within_each_pair() {
    let results = run_ok(4, |pg| {
        let pair = my_pair(&pg)?;
        let mut t = Tensor::from(10.0f32.powi(pg.rank() as i32)); // 1, 10, 100, 1000
        pair.all_reduce(&mut t, ReduceOp::Sum)?;
        let mut everyone = Tensor::from(1.0f32);
        pg.all_reduce(&mut everyone, ReduceOp::Sum)?; // the parent still works alongside
        Ok((
            pair.rank(),
            pair.world_size(),
            t.double_value(&[]),
            everyone.double_value(&[]),
            pair.stats().all_reduce,
        ))
    });
    let want = [(0, 2, 11.0), (1, 2, 11.0), (0, 2, 1100.0), (1, 2, 1100.0)];
    for (rank, ((sub_rank, size, sum, everyone, calls), want)) in results.into_iter().zip(want).enumerate() {
        assert_eq!((sub_rank, size, sum), want, "rank {rank}: (rank in its pair, pair size, pair sum)");
        assert_eq!(everyone, 4.0, "rank {rank}: all_reduce on the parent group");
        assert_eq!(calls, 1, "rank {rank}: the pair's handle counts its own calls");
    }
}

#[test]
fn members_are_renumbered_in_the_order_given_and_others_get_none() {
    let results = run_ok(4, |pg| {
        let group = pg.new_group(&[3, 1, 2])?;
        let Some(group) = group else { return Ok(None) };
        let mut t = Tensor::from(pg.rank() as f64);
        group.broadcast(&mut t, 0)?; // sub-rank 0 is parent rank 3
        let gathered = group.all_gather(&Tensor::from(pg.rank() as i64))?;
        let order: Vec<i64> = gathered.iter().map(|g| g.int64_value(&[])).collect();
        Ok(Some((group.rank(), group.world_size(), t.double_value(&[]), order)))
    });
    assert_eq!(results[0], None, "rank 0 is not in [3, 1, 2]");
    for (rank, sub_rank) in [(3, 0), (1, 1), (2, 2)] {
        assert_eq!(results[rank], Some((sub_rank, 3, 3.0, vec![3, 1, 2])), "parent rank {rank}");
    }
}

#[test]
fn a_sub_group_of_a_sub_group_works() {
    let results = run_ok(4, |pg| {
        let Some(upper) = pg.new_group(&[1, 2, 3])? else { return Ok(None) };
        // Ranks of `upper`: parent ranks 1, 2, 3 are 0, 1, 2 here.
        let Some(inner) = upper.new_group(&[2, 0])? else { return Ok(None) };
        let mut t = Tensor::from(pg.rank() as f32);
        inner.all_reduce(&mut t, ReduceOp::Max)?;
        Ok(Some((inner.rank(), t.double_value(&[]))))
    });
    assert_eq!(results, vec![None, Some((1, 3.0)), None, Some((0, 3.0))]);
}

#[test]
fn different_lists_fail_on_every_rank() {
    let started = Instant::now();
    let error = run_err(4, GENEROUS, |pg| {
        let ranks: &[usize] = if pg.rank() < 2 { &[0, 1] } else { &[2, 3] };
        pg.new_group(ranks)?; // wrong: every rank must pass the same list
        Ok(())
    });
    assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());
    for r in 0..4 {
        match dist_error(&error, r) {
            DistError::Mismatch { detail, .. } => {
                assert!(
                    detail.contains("new_group([0, 1])") && detail.contains("new_group([2, 3])"),
                    "rank {r}: {detail}"
                );
            }
            other => panic!("rank {r}: expected a Mismatch, got {other}"),
        }
    }
}

#[test]
fn bad_lists_are_invalid_on_every_rank() {
    for (ranks, problem) in [(vec![], "empty"), (vec![0, 4], "not a rank"), (vec![1, 2, 1], "twice")] {
        let errors = run_ok(4, |pg| Ok(pg.new_group(&ranks).err().map(|e| e.to_string())));
        for (rank, error) in errors.iter().enumerate() {
            let error =
                error.as_deref().unwrap_or_else(|| panic!("rank {rank}: new_group({ranks:?}) must fail"));
            assert!(error.contains("invalid new_group") && error.contains(problem), "rank {rank}: {error}");
        }
    }
}

#[test]
fn a_member_that_panics_fails_its_sub_group_peers_promptly() {
    for delay in [0, 200] {
        let started = Instant::now();
        let error = run_err(4, GENEROUS, |pg| {
            let pair = my_pair(&pg)?;
            if pg.rank() == 3 {
                std::thread::sleep(Duration::from_millis(delay));
                panic!("rank three exploded");
            }
            pair.all_reduce(&mut Tensor::from(1.0f32), ReduceOp::Sum)?;
            pair.barrier()?; // ranks 0 and 1 get here; rank 2 must not
            Ok(())
        });
        assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());
        assert_eq!(failed_ranks(&error), vec![3, 2], "only rank 3 and its partner fail: {error}");
        match dist_error(&error, 2) {
            // Named by their ranks in the whole world: rank 2 (not "rank 0" of
            // the pair) lost rank 3; the call says which group it was in.
            DistError::PeerGone { rank: 2, peer: 3, op, reason } => {
                assert!(op.contains("all_reduce(sum)") && op.contains("of sub-group [2, 3]"), "{op}");
                assert!(reason.contains("rank three exploded"), "{reason}");
            }
            other => panic!("rank 2: expected PeerGone naming rank 3, got {other}"),
        }
    }
}

#[test]
fn a_member_that_finishes_fails_its_sub_group_peers() {
    // Rank 1 makes the group, then finishes without using it. (One call
    // site for both ranks: a call made from two places is a mismatch.)
    let error = run_err(2, GENEROUS, |pg| {
        if pg.rank() == 0 {
            std::thread::sleep(Duration::from_millis(100));
        }
        let pair = pg.new_group(&[0, 1])?.expect("both ranks are members");
        if pg.rank() == 1 {
            return Ok(());
        }
        pair.barrier()?;
        Ok(())
    });
    assert_eq!(failed_ranks(&error), vec![0], "{error}");
    assert!(
        matches!(dist_error(&error, 0), DistError::PeerGone { peer: 1, reason, .. } if reason.contains("finished"))
    );
}
