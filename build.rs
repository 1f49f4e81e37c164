//! Build steps for every binary of this package (tests, examples, benches).
//!
//! 1. Find libtorch at run time without LD_LIBRARY_PATH, and keep CUDA
//!    usable. torch-sys tells us where libtorch's shared libraries are
//!    through DEP_TCH_LIBTORCH_LIB (its `links = "tch"` metadata). We bake
//!    that folder into the binaries as an rpath. We also link
//!    libtorch_cuda.so with --no-as-needed: nothing in our code calls it
//!    directly, so the linker would drop it, and then
//!    `tch::Cuda::is_available()` is false even on a GPU.
//! 2. With the `mpi` feature, compile src/dist/mpi/in_place.c with the MPI
//!    compiler wrapper (`mpicc`, or the one MPICC names).

use std::path::Path;

fn main() {
    link_libtorch();
    if std::env::var_os("CARGO_FEATURE_MPI").is_some() {
        compile_mpi_shim();
    }
}

fn link_libtorch() {
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

fn compile_mpi_shim() {
    const SHIM: &str = "src/dist/mpi/in_place.c";
    println!("cargo:rerun-if-changed={SHIM}");
    println!("cargo:rerun-if-env-changed=MPICC");
    let mpicc = std::env::var("MPICC").unwrap_or_else(|_| "mpicc".to_string());
    if let Err(error) = cc::Build::new().compiler(&mpicc).file(SHIM).try_compile("ddp_mpi_in_place") {
        panic!(
            "the `mpi` feature needs an MPI C compiler wrapper, and `{mpicc}` failed: {error}\n\
             -> run scripts/setup.sh (it installs Open MPI), or build without `--features mpi`"
        );
    }
}
