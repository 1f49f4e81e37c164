//! Chapter 05, already solved: what a bucket layout is made of ([`ParamMeta`],
//! [`Bucket`]), the default caps, and the checks the wrapper runs on a layout
//! before it trusts it. Your planner, `plan_buckets` in `exercise.rs`, turns a
//! list of [`ParamMeta`] into a list of [`Bucket`].
//!
//! Check your work: `cargo test --test chapter_05`

use tch::{Device, Kind, Tensor};

/// One mebibyte, 1024 × 1024 bytes: PyTorch counts `bucket_cap_mb` in these.
pub const MIB: usize = 1024 * 1024;

// ANCHOR: caps
/// The cap of every bucket but the first: PyTorch's `bucket_cap_mb=25`.
pub const DEFAULT_BUCKET_CAP_BYTES: usize = 25 * MIB;

/// The cap of the first bucket of each dtype and device. Small, so that the
/// first all-reduce can start as soon as the last layers' gradients exist
/// (PyTorch's `dist._DEFAULT_FIRST_BUCKET_BYTES`, 1 MiB).
pub const DEFAULT_FIRST_BUCKET_CAP_BYTES: usize = MIB;
// ANCHOR_END: caps

// ANCHOR: types
/// What the planner needs to know about one parameter: its size, dtype and
/// device. The layout is computed from these, once, at construction; never
/// from gradients, which do not exist yet and may be missing in some steps.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamMeta {
    pub name: String,
    /// Number of elements.
    pub numel: usize,
    pub kind: Kind,
    pub device: Device,
}

impl ParamMeta {
    /// The size of this parameter's gradient in bytes.
    pub fn bytes(&self) -> usize {
        self.numel * self.kind.elt_size_in_bytes()
    }

    /// The metadata of each named tensor, in the same order.
    pub fn of(named: &[(String, Tensor)]) -> Vec<ParamMeta> {
        named
            .iter()
            .map(|(name, t)| ParamMeta {
                name: name.clone(),
                numel: t.numel(),
                kind: t.kind(),
                device: t.device(),
            })
            .collect()
    }
}

/// A group of parameters whose gradients travel together, in one flat buffer
/// of `numel` elements, in one all-reduce. All of them have the bucket's
/// dtype and device.
#[derive(Clone, Debug, PartialEq)]
pub struct Bucket {
    pub kind: Kind,
    pub device: Device,
    /// Indices into the parameter list (registration order), in the order
    /// their gradients sit in the buffer: the first one at offset 0.
    pub params: Vec<usize>,
    /// Total number of elements: the sum of the members' `numel`.
    pub numel: usize,
}

impl Bucket {
    /// An empty bucket for gradients of this dtype and device.
    pub fn new(kind: Kind, device: Device) -> Bucket {
        Bucket { kind, device, params: Vec::new(), numel: 0 }
    }

    /// The size of the bucket's buffer in bytes.
    pub fn bytes(&self) -> usize {
        self.numel * self.kind.elt_size_in_bytes()
    }
}
// ANCHOR_END: types

/// Checks that `buckets` is a usable layout for `metas`: every parameter in
/// exactly one bucket, no empty bucket, and each bucket's dtype, device and
/// `numel` consistent with its members. Returns what is wrong, for a learner.
pub fn check_plan(metas: &[ParamMeta], buckets: &[Bucket]) -> Result<(), String> {
    let mut seen = vec![None; metas.len()]; // seen[param] = Some(bucket)
    for (b, bucket) in buckets.iter().enumerate() {
        if bucket.params.is_empty() {
            return Err(format!("bucket {b} is empty: every bucket must hold at least one parameter"));
        }
        let mut numel = 0;
        for &p in &bucket.params {
            let Some(meta) = metas.get(p) else {
                return Err(format!(
                    "bucket {b} lists parameter #{p}, but the model has {} parameters",
                    metas.len()
                ));
            };
            if let Some(other) = seen[p] {
                return Err(format!(
                    "`{}` (#{p}) is in bucket {other} and in bucket {b}: put it in one",
                    meta.name
                ));
            }
            seen[p] = Some(b);
            if (meta.kind, meta.device) != (bucket.kind, bucket.device) {
                return Err(format!(
                    "`{}` is {:?} on {:?} but sits in bucket {b} of {:?} on {:?}: \
                     a bucket holds one dtype on one device",
                    meta.name, meta.kind, meta.device, bucket.kind, bucket.device
                ));
            }
            numel += meta.numel;
        }
        if numel != bucket.numel {
            return Err(format!(
                "bucket {b} says numel = {}, but its parameters hold {numel} elements together",
                bucket.numel
            ));
        }
    }
    if let Some(p) = seen.iter().position(Option::is_none) {
        return Err(format!(
            "`{}` (#{p}) is in no bucket: its gradient would never be averaged",
            metas[p].name
        ));
    }
    Ok(())
}

/// A 64-bit FNV-1a hash of a layout (dtypes, devices, members, in order):
/// equal on two ranks exactly when they planned the same buckets.
pub fn fingerprint(buckets: &[Bucket]) -> i64 {
    let text = buckets
        .iter()
        .map(|b| format!("{:?}@{:?}:{:?}", b.kind, b.device, b.params))
        .collect::<Vec<_>>()
        .join("|");
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash as i64
}
