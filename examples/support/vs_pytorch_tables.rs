//! The tables of
//! examples/bench_vs_pytorch.rs, from the rates it measured: tokens per
//! second of each contender, the ratios per round, and the cost of
//! distribution of each side (support/table_file.rs writes them, with the
//! machine, its load, the date and the command). Included by bench_vs_pytorch.rs:
//! `cargo run --release --features mpi --example bench_vs_pytorch`; bench_sizes.rs
//! includes it too, for each size.

use std::fmt::Write;

use super::table_file::summary;

/// One run of a contender: its tokens per second (all ranks together) and
/// the time of one optimizer step, both over the timed steps.
#[derive(Clone, Copy)]
pub struct Rate {
    pub tokens_per_second: f64,
    pub step_ms: f64,
}

/// A contender's name and its rate in every round.
pub struct Column<'a> {
    pub name: &'a str,
    pub rates: &'a [Rate],
}

/// Per round, `f` of the two contenders' rates, then median, min and max.
fn per_round(a: &Column, b: &Column, f: impl Fn(&Rate, &Rate) -> f64) -> (f64, f64, f64) {
    summary(&a.rates.iter().zip(b.rates).map(|(a, b)| f(a, b)).collect::<Vec<_>>())
}

/// The tokens/s table, the ratios (`ratios`: numerator, denominator) and the
/// cost of distribution (`costs`: the 2-rank run, the 1-rank run on the same
/// per-rank work), as markdown.
pub fn training_tables(columns: &[Column], ratios: &[(usize, usize)], costs: &[(usize, usize)]) -> String {
    let mut out = String::from("| run | tokens/s median | min | max | step, median |\n");
    out += "| --- | ---: | ---: | ---: | ---: |\n";
    for column in columns {
        let (median, min, max) =
            summary(&column.rates.iter().map(|r| r.tokens_per_second).collect::<Vec<_>>());
        let step = summary(&column.rates.iter().map(|r| r.step_ms).collect::<Vec<_>>()).0;
        let _ = writeln!(out, "| {} | {median:.0} | {min:.0} | {max:.0} | {step:.2} ms |", column.name);
    }
    out += "\n| ratio of tokens/s, per round | median | min | max |\n| --- | ---: | ---: | ---: |\n";
    for &(a, b) in ratios {
        let (a, b) = (&columns[a], &columns[b]);
        let (median, min, max) = per_round(a, b, |a, b| a.tokens_per_second / b.tokens_per_second);
        let _ = writeln!(out, "| {} / {} | {median:.2}x | {min:.2}x | {max:.2}x |", a.name, b.name);
    }
    out += "\nThe cost of distribution: a 2-rank step's time minus a 1-rank step's time on the same \
            per-rank work (per round, then median, min and max).\n\n";
    out += "| 2 ranks | 1 rank | step, 2 ranks | step, 1 rank | cost, median | min | max |\n";
    out += "| --- | --- | ---: | ---: | ---: | ---: | ---: |\n";
    for &(two, one) in costs {
        let (two, one) = (&columns[two], &columns[one]);
        let (median, min, max) = per_round(two, one, |a, b| a.step_ms - b.step_ms);
        let step = |c: &Column| summary(&c.rates.iter().map(|r| r.step_ms).collect::<Vec<_>>()).0;
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} ms | {:.2} ms | {median:.2} ms | {min:.2} ms | {max:.2} ms |",
            two.name,
            one.name,
            step(two),
            step(one)
        );
    }
    out
}

/// The all_reduce table: one row per size, one column per backend (seconds).
#[allow(dead_code)] // bench_vs_pytorch's; bench_sizes has no all_reduce table
pub fn all_reduce_table(sizes_mib: &[f64], backends: &[(&str, Vec<f64>)]) -> String {
    let names: Vec<&str> = backends.iter().map(|(name, _)| *name).collect();
    let mut out = format!("| MiB | {} |\n| ---: |{}\n", names.join(" | "), " ---: |".repeat(names.len()));
    for (i, mib) in sizes_mib.iter().enumerate() {
        let cells: Vec<String> = backends.iter().map(|(_, s)| format!("{:.3} ms", s[i] * 1e3)).collect();
        let _ = writeln!(out, "| {mib} | {} |", cells.join(" | "));
    }
    out
}
