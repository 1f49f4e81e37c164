//! FNV-1a, 64 bits: a short, stable fingerprint of bytes. Ranks exchange
//! fingerprints instead of whole descriptions (of a model's structure, of a
//! bucket layout), and checkpoints carry one to catch damage.
//!
//! Not cryptographic: it catches accidents, not tampering. The same bytes give
//! the same number on every rank, machine and run.
//!
//! ```
//! use ddp_workbook::fingerprint::{fnv1a, Fnv1a};
//!
//! let mut hash = Fnv1a::new();
//! hash.write(b"layers.0.weight|");
//! hash.write(b"Float[16, 4]");
//! assert_eq!(hash.finish(), fnv1a("layers.0.weight|Float[16, 4]"));
//! ```

/// An FNV-1a hash being computed: feed it bytes with [`write`](Self::write).
#[derive(Clone, Copy, Debug)]
pub struct Fnv1a {
    state: u64,
}

impl Fnv1a {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    pub fn new() -> Self {
        Fnv1a { state: Self::OFFSET_BASIS }
    }

    pub fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.state = (self.state ^ u64::from(byte)).wrapping_mul(Self::PRIME);
        }
    }

    /// The hash as an `i64`, the integer type tensors exchange most easily.
    pub fn finish(&self) -> i64 {
        self.state as i64
    }
}

impl Default for Fnv1a {
    fn default() -> Self {
        Self::new()
    }
}

/// The FNV-1a hash of `text`'s bytes.
pub fn fnv1a(text: &str) -> i64 {
    let mut hash = Fnv1a::new();
    hash.write(text.as_bytes());
    hash.finish()
}
