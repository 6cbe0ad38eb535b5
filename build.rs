//! With the `cuda` feature: compiles the GPU step's kernels (`src/neural/gpu/kernels.cu` and the
//! parts it includes from `kernels/`, one translation unit) into a fat binary (machine code for
//! the GPU, and PTX for newer ones) with nvcc (`$NVCC`, else `nvcc` on the PATH;
//! `scripts/build-cuda.sh` sets it to the pinned pip toolchain), for `CUDA_COMPUTE_CAP`
//! (default 90: H100, H200). Without it, nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/neural/gpu/kernels.cu");
    println!("cargo:rerun-if-changed=src/neural/gpu/kernels");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo:rerun-if-env-changed=INFGRAM_CUDA_LINK_DIR");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    // Where scripts/build-cuda.sh keeps the static CUDA runtime candle's kernels link: a search
    // path of this crate's links rather than RUSTFLAGS, whose change would rebuild every
    // dependency (so the cuda check shares the default build's compiled crates).
    if let Ok(dir) = std::env::var("INFGRAM_CUDA_LINK_DIR") {
        println!("cargo:rustc-link-search=native={dir}");
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".into());
    let fatbin = out.join("infgram_kernels.fatbin");
    let status = std::process::Command::new(&nvcc)
        .args([
            "--fatbin",
            "-O3",
            &format!("-gencode=arch=compute_{cap},code=sm_{cap}"),
            &format!("-gencode=arch=compute_{cap},code=compute_{cap}"),
            "-o",
        ])
        .arg(&fatbin)
        .arg("src/neural/gpu/kernels.cu")
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{nvcc} failed on src/neural/gpu/kernels.cu ({s})"),
        Err(e) => panic!(
            "the cuda feature compiles src/neural/gpu/kernels.cu with nvcc ({nvcc}: {e}); \
             build with scripts/build-cuda.sh, which fetches it"
        ),
    }
}
