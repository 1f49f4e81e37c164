//! Makes every binary of this package (tests, examples, benches) find
//! libtorch at run time without LD_LIBRARY_PATH, and keeps CUDA usable.
//!
//! torch-sys tells us where libtorch's shared libraries are through
//! DEP_TCH_LIBTORCH_LIB (its `links = "tch"` metadata). We bake that folder
//! into the binaries as an rpath. We also link libtorch_cuda.so with
//! --no-as-needed: nothing in our code calls it directly, so the linker would
//! drop it, and then `tch::Cuda::is_available()` is false even on a GPU.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        // torch-sys found libtorch some other way (or this is a doc build).
        return;
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    if Path::new(&lib).join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
}
