//! Chapter 14 tests, part 2: `shard_rows` alone, against its contract
//! (rows in rank order, every row on one rank, no rank past
//! `ceil(rows / world_size)`, empty shards for the last ranks when there
//! are more ranks than rows) and against the chapter's table, worked out
//! by hand.

use ddp_workbook::ch14_fsdp::learner::shard_rows;

/// Rows, ranks, and each rank's `(first row, rows)`.
type Row = (i64, usize, &'static [(i64, i64)]);

#[test]
fn shard_rows_matches_the_chapters_table() {
    // By hand: ceil(7 / 2) = 4 rows, then the 3 left; ceil(2 / 3) = 1 row
    // each, and nothing left for rank 2; ceil(10 / 4) = 3, 3, 3, then 1.
    let table: [Row; 4] = [
        (7, 2, &[(0, 4), (4, 3)]),
        (2, 3, &[(0, 1), (1, 1), (2, 0)]),
        (10, 4, &[(0, 3), (3, 3), (6, 3), (9, 1)]),
        (1, 4, &[(0, 1), (1, 0), (1, 0), (1, 0)]),
    ];
    for (rows, world, expected) in table {
        let got: Vec<(i64, i64)> = (0..world).map(|r| shard_rows(rows, world, r)).collect();
        assert_eq!(got, expected, "shard_rows({rows}, {world}, rank) for each rank: (first row, rows)");
    }
}

#[test]
fn shard_rows_puts_every_row_on_one_rank_in_rank_order() {
    for rows in 0..20 {
        for world in 1..=6 {
            let chunk = (rows + world as i64 - 1) / world as i64;
            let mut next = 0;
            for rank in 0..world {
                let (start, count) = shard_rows(rows, world, rank);
                assert!(
                    start == next.min(rows) && (0..=chunk).contains(&count),
                    "shard_rows({rows}, {world}, {rank}) = {:?}: rank {rank} must start where rank {} ended \
                     (row {next}) and keep at most ceil(rows / world_size) = {chunk} rows",
                    (start, count),
                    rank.saturating_sub(1)
                );
                next = start + count;
            }
            assert_eq!(next, rows, "{rows} rows on {world} ranks: the shards must cover every row");
        }
    }
}
