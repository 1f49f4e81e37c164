//! Build steps for every binary of this package (tests, examples, benches).
//!
//! 1. Find libtorch at run time without LD_LIBRARY_PATH, and keep CUDA
//!    usable. torch-sys tells us where libtorch's shared libraries are
//!    through DEP_TCH_LIBTORCH_LIB (its `links = "tch"` metadata). We bake
//!    that folder into the binaries as an rpath. We also link
//!    libtorch_cuda.so with --no-as-needed: nothing in our code calls it
//!    directly, so the linker would drop it, and then
//!    `tch::Cuda::is_available()` is false even on a GPU.
//! 2. Compile src/autograd/shim.cpp against libtorch's headers: autograd
//!    hooks and `.grad` installation, which tch does not expose; and
//!    src/ddp/randperm.cpp: `torch.randperm` on a generator of its own.
//! 3. With the `mpi` feature, compile src/dist/mpi/in_place.c with the MPI
//!    compiler wrapper (`mpicc`, or the one MPICC names).
//! 4. With the `nccl` feature, add the project's .nccl/ folder (where
//!    scripts/setup.sh links NCCL's libnccl.so.2 as libnccl.so) as an rpath.

use std::path::Path;

fn main() {
    if let Some(lib) = link_libtorch() {
        compile_libtorch_shims(&lib);
    }
    if std::env::var_os("CARGO_FEATURE_MPI").is_some() {
        compile_mpi_shim();
    }
    if std::env::var_os("CARGO_FEATURE_NCCL").is_some() {
        // cudarc opens `libnccl.so` by name; scripts/setup.sh links it here.
        // Read when the script runs, not baked in when it was compiled: a
        // build script compiled for one checkout may be run for another.
        let root =
            std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR for build scripts");
        let folder = Path::new(&root).join(".nccl");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", folder.display());
    }
}

/// Returns libtorch's library folder, when torch-sys names it.
fn link_libtorch() -> Option<String> {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    // Without it, torch-sys found libtorch some other way (or this is a doc build).
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB").ok()?;
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    if Path::new(&lib).join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
    Some(lib)
}

/// The shims are compiled as torch-sys compiles its own C++: C++17, the C++
/// ABI of the libtorch it links (read from that library, see
/// `libtorch_cxx11_abi`), and glog's export macro.
fn compile_libtorch_shims(lib: &str) {
    const SHIMS: [&str; 2] = ["src/autograd/shim.cpp", "src/ddp/randperm.cpp"];
    for shim in SHIMS {
        println!("cargo:rerun-if-changed={shim}");
    }
    let abi = libtorch_cxx11_abi(lib);
    let include = Path::new(lib).join("../include");
    cc::Build::new()
        .cpp(true)
        .files(SHIMS)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .flag("-w") // libtorch's headers warn by the hundred; our lines are checked by hand
        .compile("ddp_libtorch_shims");
}

/// 1 when the libtorch in `lib` was built with the C++11 ABI of libstdc++,
/// 0 when with the old one: its libc10.so names `std::__cxx11::` strings in
/// its exported symbols exactly when it was built with the new ABI. A shim
/// built with the other ABI would fail to link, or worse, pass strings of
/// the wrong layout. LIBTORCH_CXX11_ABI (torch-sys's setting) must agree.
fn libtorch_cxx11_abi(lib: &str) -> &'static str {
    let c10 = Path::new(lib).join("libc10.so");
    println!("cargo:rerun-if-changed={}", c10.display());
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");
    let bytes = std::fs::read(&c10).unwrap_or_else(|error| {
        panic!(
            "cannot read {} to learn libtorch's C++ ABI: {error}\n\
             -> run scripts/setup.sh (it installs libtorch with the torch wheel)",
            c10.display()
        )
    });
    let abi = if bytes.windows(7).any(|w| w == b"__cxx11") { "1" } else { "0" };
    if let Ok(asked) = std::env::var("LIBTORCH_CXX11_ABI") {
        if asked != abi {
            panic!(
                "LIBTORCH_CXX11_ABI={asked}, but the libtorch in {lib} was built with \
                 _GLIBCXX_USE_CXX11_ABI={abi}\n-> unset LIBTORCH_CXX11_ABI, or set it to {abi}"
            );
        }
    }
    abi
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
