//! Tests of the memory plan (`ddp::plan_memory`): every number is worked
//! by hand from the bytes per parameter (4 + 4 + 8 in float32, 2 + 2 + 12
//! in mixed precision), each sharded term divided by the device count.

use ddp_workbook::ddp::{plan_memory, PlanError, Precision, ShardingStage, Verdict, GIB};

/// One device's bytes per stage, DDP to FSDP, in GB.
fn gb_per_device(parameters: f64, devices: usize, precision: Precision) -> Vec<f64> {
    let plan = plan_memory(parameters, devices, 80.0 * GIB, precision).expect("a valid plan");
    plan.rows().iter().map(|row| row.per_device_bytes() / 1e9).collect()
}

fn assert_close(got: &[f64], by_hand: &[f64]) {
    assert_eq!(got.len(), by_hand.len());
    for (g, h) in got.iter().zip(by_hand) {
        assert!((g - h).abs() < 1e-9, "got {got:?}, by hand {by_hand:?}");
    }
}

#[test]
fn a_7b_model_on_four_devices_takes_112_70_49_and_28_gb_in_float32() {
    // 7e9 x 16, 7e9 x (4 + 4 + 8/4), 7e9 x (4 + 4/4 + 8/4), 7e9 x 16/4.
    assert_close(&gb_per_device(7e9, 4, Precision::Float32), &[112.0, 70.0, 49.0, 28.0]);
}

#[test]
fn a_7b_model_on_four_devices_takes_112_49_38_5_and_28_gb_in_mixed_precision() {
    // 7e9 x 16, 7e9 x (2 + 2 + 12/4), 7e9 x (2 + 14/4), 7e9 x 16/4.
    assert_close(&gb_per_device(7e9, 4, Precision::Mixed), &[112.0, 49.0, 38.5, 28.0]);
}

#[test]
fn three_devices_divide_each_sharded_term_by_three() {
    let plan = plan_memory(3e9, 3, 80.0 * GIB, Precision::Mixed).unwrap();
    let zero2 = plan.row(ShardingStage::Zero2).bytes_per_parameter;
    assert_eq!((zero2.parameters, zero2.gradients, zero2.optimizer_state), (2.0, 2.0 / 3.0, 4.0));
    // 3e9 x (2 + 2/3 + 4) = 20e9 bytes.
    assert!((plan.row(ShardingStage::Zero2).per_device_bytes() - 20e9).abs() < 1.0);
    assert!(plan
        .markdown()
        .contains("| ZeRO-2 (SHARD_GRAD_OP) | + gradients | 2 | 0.67 | 4 | 6.67 | 20.0 GB |"));
}

#[test]
fn on_one_device_every_stage_keeps_all_16_bytes() {
    for precision in [Precision::Float32, Precision::Mixed] {
        assert_close(&gb_per_device(1e9, 1, precision), &[16.0; 4]);
    }
}

#[test]
fn the_verdict_is_the_least_sharding_that_fits() {
    let verdict =
        |params: f64, gib: f64, precision| plan_memory(params, 4, gib * GIB, precision).unwrap().verdict();
    // 1e9 x 16 = 16 GB fits on one 80 GiB device.
    assert_eq!(verdict(1e9, 80.0, Precision::Float32), Verdict::Ddp);
    // 7B: DDP's 112 GB do not fit in 85.9 GB; ZeRO-1's 70 (float32), 49 (mixed) do.
    assert_eq!(verdict(7e9, 80.0, Precision::Float32), Verdict::Shard(ShardingStage::Zero1));
    assert_eq!(verdict(7e9, 80.0, Precision::Mixed), Verdict::Shard(ShardingStage::Zero1));
    // On 40 GiB = 42.9 GB: float32 needs FSDP (28 GB; ZeRO-2 takes 49),
    // mixed precision ZeRO-2 (38.5 GB; ZeRO-1 takes 49).
    assert_eq!(verdict(7e9, 40.0, Precision::Float32), Verdict::Shard(ShardingStage::Fsdp));
    assert_eq!(verdict(7e9, 40.0, Precision::Mixed), Verdict::Shard(ShardingStage::Zero2));
    // 70B: 70e9 x 16 / 4 = 280 GB per device even fully sharded.
    let plan = plan_memory(70e9, 4, 80.0 * GIB, Precision::Mixed).unwrap();
    assert_eq!(plan.verdict(), Verdict::CutTheModel);
    // 1120e9 / 85.9e9 = 13.04: FSDP alone needs 14 such devices.
    assert_eq!(plan.devices_for_full_shard(), 14);
    assert!(plan.advice().starts_with("tensor or pipeline parallelism"), "{}", plan.advice());
    assert!(plan.advice().contains("at least 14"), "{}", plan.advice());
}

#[test]
fn states_that_exactly_fill_the_device_fit() {
    let plan = plan_memory(7e9, 4, 112e9, Precision::Float32).unwrap();
    assert_eq!(plan.row(ShardingStage::Ddp).left_bytes(), 0.0);
    assert_eq!(plan.verdict(), Verdict::Ddp);
}

#[test]
fn bad_input_is_refused_saying_what_to_pass() {
    let plan = |params: f64, devices, bytes: f64| plan_memory(params, devices, bytes, Precision::Float32);
    assert_eq!(plan(7e9, 0, 80.0 * GIB).unwrap_err(), PlanError::NoDevices);
    for params in [-7e9, 0.0, 0.5, f64::INFINITY] {
        assert_eq!(plan(params, 4, 80.0 * GIB).unwrap_err(), PlanError::Parameters(params));
    }
    assert!(matches!(plan(f64::NAN, 4, 80.0 * GIB), Err(PlanError::Parameters(p)) if p.is_nan()));
    assert!(matches!(plan(7e9, 4, 0.0), Err(PlanError::DeviceMemory(_))));
    assert!(matches!(plan(7e9, 4, f64::NAN), Err(PlanError::DeviceMemory(_))));
    let message = plan(7e9, 0, 80.0 * GIB).unwrap_err().to_string();
    assert!(message.contains("got 0") && message.contains("pass how many devices"), "{message}");
    let message = plan(-1.0, 4, 80.0 * GIB).unwrap_err().to_string();
    assert!(message.contains("got -1") && message.contains("e.g. 7e9"), "{message}");
}
