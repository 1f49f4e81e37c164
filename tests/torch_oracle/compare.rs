//! How close the workbook's numbers must be
//! to PyTorch's, and the comparison, tensor by tensor, with src/check.rs.
//! Compiled into `cargo test --features solutions,mpi,nccl --test torch_oracle`.
//!
//! On 2 ranks both sides compute (a + b) / 2 exactly: PyTorch multiplies
//! each gradient by 1/2 before the sum, which is exact, and the sum of two
//! halves is the half of the sum. So they must agree bitwise.
//!
//! On 3 ranks PyTorch scales each gradient by 1/3 before the sum (a rounded
//! 1/3, or a division, each rounds on its own) and gloo adds the three in
//! an order that depends on where the element lies in the buffer; the
//! workbook adds in rank order and divides once. Each result is within a
//! few ulps of the true mean, so of each other, relative to the size of
//! the terms: where the terms cancel, the difference is absolute, not
//! relative to the small result. Hence a bound per tensor: RELATIVE times
//! the tensor's largest magnitude, plus an absolute FLOOR.

use ddp_workbook::check::{compare_to_reference, max_abs_diff, same_bits};
use ddp_workbook::tch::Tensor;

use super::stages::{Bf16Hook, Stage};

/// Per tensor: |workbook - torch| <= RELATIVE * max|torch| + FLOOR. Measured
/// here on 3 ranks (every stage prints it with `-- --nocapture`): at most
/// 7.2e-15 of a tensor's largest value and 3.4e-16 absolute, so the bound
/// leaves a margin of about 100; a wrong division is off by a third or more.
pub const RELATIVE: f64 = 1e-12;
pub const FLOOR: f64 = 1e-14;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Agreement {
    Bitwise,
    /// Within RELATIVE and FLOOR.
    Close,
}

impl Agreement {
    /// What the cross-check expects on `world_size` ranks.
    pub fn on(world_size: usize) -> Agreement {
        if world_size == 2 {
            Agreement::Bitwise
        } else {
            Agreement::Close
        }
    }

    /// What `stage` must give on `world_size` ranks, or None where there is
    /// no bound to hold it to. The bf16 hook: in PyTorch's order, bitwise on
    /// any number of ranks (the sums in gloo's order, gloo_order.rs); in
    /// the workbook's, bitwise on 2 ranks (a division by 2 is exact in bf16
    /// too), while on 3 it rounds once less than PyTorch, which
    /// `the_workbooks_bf16_order_rounds_once_less_than_pytorchs_on_3_ranks`
    /// checks.
    pub fn of(stage: &Stage, world_size: usize) -> Option<Agreement> {
        match stage.bf16_hook {
            Some(Bf16Hook::PyTorchOrder) => Some(Agreement::Bitwise),
            Some(Bf16Hook::WorkbookOrder) if world_size > 2 => None,
            _ => Some(Agreement::on(world_size)),
        }
    }
}

/// The largest differences found, to print next to the bound.
#[derive(Clone, Copy, Debug, Default)]
pub struct Measured {
    pub max_abs_diff: f64,
    /// The largest of |workbook - torch| / max|torch| over the tensors.
    pub max_relative: f64,
}

impl Measured {
    pub fn merge(self, other: Measured) -> Measured {
        Measured {
            max_abs_diff: self.max_abs_diff.max(other.max_abs_diff),
            max_relative: self.max_relative.max(other.max_relative),
        }
    }
}

/// Compares the workbook's tensors with PyTorch's, by name: the same names
/// (check::compare_to_reference reports a missing or unexpected one), and
/// values bitwise equal or within the bound. `what` says which stage,
/// world size and rank, for the message.
pub fn compare(
    what: &str,
    workbook: &[(String, Tensor)],
    torch: &[(String, Tensor)],
    agreement: Agreement,
) -> Result<Measured, String> {
    let hint = "the workbook's gradients or update differ from PyTorch's DistributedDataParallel: \
                look at the first step and tensor listed (a factor of 2 or 3: the division by the \
                world size; a gradient missing: find_unused_parameters or no_sync)";
    compare_to_reference(workbook, torch, f64::INFINITY)
        .map_err(|report| format!("{what}: {}", report.hint(hint)))?;
    let mut measured = Measured::default();
    let mut failures = Vec::new();
    for (name, expected) in torch {
        let (_, actual) = workbook.iter().find(|(n, _)| n == name).expect("checked above");
        let diff = max_abs_diff(actual, expected);
        let scale = if expected.numel() == 0 { 0.0 } else { expected.abs().max().double_value(&[]) };
        let relative = if scale > 0.0 { diff / scale } else { diff };
        measured = measured.merge(Measured { max_abs_diff: diff, max_relative: relative });
        let fails = match agreement {
            Agreement::Bitwise => !same_bits(actual, expected),
            Agreement::Close => {
                let bound = RELATIVE * scale + FLOOR;
                compare_to_reference(
                    &[(name.clone(), actual.shallow_clone())],
                    &[(name.clone(), expected.shallow_clone())],
                    bound,
                )
                .is_err()
            }
        };
        if fails {
            failures.push(format!(
                "  `{name}`: max abs diff {diff:.3e}, {relative:.3e} of its largest value {scale:.3e}"
            ));
        }
    }
    if failures.is_empty() {
        return Ok(measured);
    }
    let expected = match agreement {
        Agreement::Bitwise => "bitwise equal".to_string(),
        Agreement::Close => format!("within {RELATIVE:e} of each tensor's largest value plus {FLOOR:e}"),
    };
    let listed: Vec<String> = failures.iter().take(8).cloned().collect();
    Err(format!(
        "{what}: {} tensor(s) not {expected} to PyTorch's:\n{}{}\n  what to try: {hint}",
        failures.len(),
        listed.join("\n"),
        if failures.len() > 8 { format!("\n  ... and {} more", failures.len() - 8) } else { String::new() }
    ))
}
