//! Chapter 05 tests, the planner's rules on hand-made sizes that the MLP of
//! the chapter's table does not reach: when the first cap stops applying,
//! and that every dtype AND every device has its own first cap and its own
//! open bucket. `plan_buckets` reads only sizes, dtypes and devices, so a
//! `ParamMeta` on `Device::Cuda(0)` needs no GPU.
//!
//! Compiled into `cargo test --test chapter_05` (see `tests/chapter_05.rs`).

use ddp_workbook::ch05_bucketing::{learner, ParamMeta};

use super::training::assert_layout;
use ddp_workbook::tch::{Device, Kind};

/// A parameter `name` of `numel` elements.
fn meta(name: &str, numel: usize, kind: Kind, device: Device) -> ParamMeta {
    ParamMeta { name: name.to_string(), numel, kind, device }
}

/// `plan_buckets` on `metas`, as lists of parameter names per bucket.
fn plan(metas: &[ParamMeta], cap_bytes: usize, first_cap_bytes: usize) -> Vec<Vec<String>> {
    let buckets = learner::plan_buckets(metas, cap_bytes, first_cap_bytes);
    buckets.iter().map(|b| b.params.iter().map(|&p| metas[p].name.clone()).collect()).collect()
}

/// Names per bucket, for hand-written expectations.
fn names(layout: &[&[&str]]) -> Vec<Vec<String>> {
    layout.iter().map(|b| b.iter().map(|n| n.to_string()).collect()).collect()
}

#[test]
fn the_first_cap_stops_applying_the_moment_the_first_bucket_closes() {
    // f32, registered c, b, a, so walked a, b, c: 60 B, 152 B, 48 B.
    // Cap 1000 B, first cap 100 B.
    //   a: opens the first bucket (60 B).
    //   b: 60 + 152 > 100 (the first cap): the first bucket [a] is closed.
    //      From now on the limit is the cap, 1000 B: b opens a bucket, and
    //      152 B is far from full, so it stays open.
    //   c: 152 + 48 = 200 <= 1000: joins b.
    // Computing the limit once per parameter, before closing [a], measures b
    // against the first cap a second time (152 >= 100: "full") and sends b and
    // c alone: one more all-reduce, and a second bucket held to the first cap.
    let metas = [
        meta("c", 12, Kind::Float, Device::Cpu), // 48 B
        meta("b", 38, Kind::Float, Device::Cpu), // 152 B
        meta("a", 15, Kind::Float, Device::Cpu), // 60 B
    ];
    let got = plan(&metas, 1000, 100);
    let expected = names(&[&["a"], &["b", "c"]]);
    assert_layout(
        &got,
        &expected,
        &format!(
            "your plan_buckets(cap 1000 B, first cap 100 B) on f32 parameters walked as a (60 B), b (152 B), c (48 B): \
         your code gave {got:?}, the chapter expects {expected:?}, because the first cap holds only while no \
         bucket of that dtype and device has been closed: once b closes [a], b's limit is the cap (1000 B), so \
         b does not fill its bucket and c joins it. Decide the limit again after closing a bucket, before you \
         ask whether the new one is full"
        ),
    );
}

#[test]
fn every_dtype_has_its_own_first_cap() {
    // Walked: f1 (f32, 60 B), f0 (f32, 60 B), d1 (f64, 80 B), d0 (f64, 40 B).
    // Cap 1000 B, first cap 100 B.
    //   f32: [f1] closes when f0 would take it to 120 > 100; f0 opens the
    //        second f32 bucket, under the cap.
    //   f64: no f64 bucket has closed yet, so its first bucket is held to the
    //        first cap too: [d1] closes when d0 would take it to 120 > 100.
    let metas = [
        meta("d0", 5, Kind::Double, Device::Cpu),  // 40 B
        meta("d1", 10, Kind::Double, Device::Cpu), // 80 B
        meta("f0", 15, Kind::Float, Device::Cpu),  // 60 B
        meta("f1", 15, Kind::Float, Device::Cpu),  // 60 B
    ];
    let got = plan(&metas, 1000, 100);
    let expected = names(&[&["f1"], &["f0"], &["d1"], &["d0"]]);
    assert_layout(
        &got,
        &expected,
        &format!(
            "your plan_buckets(cap 1000 B, first cap 100 B) on f32 f1 (60 B), f0 (60 B), then f64 d1 (80 B), d0 (40 B): \
         your code gave {got:?}, the chapter expects {expected:?}, because the limit is first_cap_bytes for the \
         first bucket of EACH dtype and device: closing the first f32 bucket must not lift the first cap of the \
         f64 ones (keep \"has a bucket of this dtype and device closed yet?\", not \"has any bucket closed?\")"
        ),
    );
}

#[test]
fn every_device_has_its_own_buckets_and_its_own_first_cap() {
    // The same dtype on two devices: a flat buffer lives on one device, so
    // they never share a bucket, and each device's first bucket is small.
    // Walked: g1 (cuda:0, 80 B), c1 (cpu, 60 B), g0 (cuda:0, 40 B), c0 (cpu, 60 B).
    // Cap 1000 B, first cap 100 B.
    //   cuda:0: [g1] closes when g0 would take it to 120 > 100; then [g0].
    //   cpu:    [c1] closes when c0 would take it to 120 > 100; then [c0].
    let (cpu, gpu) = (Device::Cpu, Device::Cuda(0));
    let metas = [
        meta("c0", 15, Kind::Float, cpu), // 60 B
        meta("g0", 10, Kind::Float, gpu), // 40 B
        meta("c1", 15, Kind::Float, cpu), // 60 B
        meta("g1", 20, Kind::Float, gpu), // 80 B
    ];
    let buckets = learner::plan_buckets(&metas, 1000, 100);
    for (b, bucket) in buckets.iter().enumerate() {
        for &p in &bucket.params {
            assert_eq!(
                metas[p].device, bucket.device,
                "your bucket {b} ({:?}) holds `{}`, which lives on {:?}; the chapter expects one bucket per dtype \
                 AND device, because a bucket's buffer lives on one device: key the open buckets by (kind, device)",
                bucket.device, metas[p].name, metas[p].device
            );
        }
    }
    let got = plan(&metas, 1000, 100);
    let expected = names(&[&["g1"], &["c1"], &["g0"], &["c0"]]);
    assert_layout(
        &got,
        &expected,
        &format!(
            "your plan_buckets(cap 1000 B, first cap 100 B) on f32 g1 (cuda:0, 80 B), c1 (cpu, 60 B), g0 (cuda:0, 40 B), \
         c0 (cpu, 60 B): your code gave {got:?}, the chapter expects {expected:?}, because each device has its \
         own open bucket and its own first cap, and the buckets come out by their first member, highest index \
         first"
        ),
    );
}
