//! Opening the GPU for the candle passes (`--device cuda`).
//!
//! A build with the `cuda` feature (made by `scripts/build-cuda.sh`) opens the CUDA libraries
//! when a model is first put on the GPU, not when it starts: the same binary runs every CPU
//! path on a machine without a driver. Before candle opens them (it would abort on a missing
//! one), [`device`] looks for each by the names candle's loader tries and says which are
//! missing and where they come from.

use crate::error::{Error, Result};
use candle_core::Device;

/// The libraries candle's CUDA backend opens, with where each comes from.
#[cfg(feature = "cuda")]
const LIBRARIES: [(&str, &str); 5] = [
    ("cuda", "the NVIDIA driver"),
    ("cublas", "cuBLAS; pip: nvidia-cublas"),
    ("cublasLt", "cuBLASLt; pip: nvidia-cublas"),
    ("curand", "cuRAND; pip: nvidia-curand"),
    ("nvrtc", "NVRTC; pip: nvidia-cuda-nvrtc"),
];

/// The file names a library is looked for under (those of candle's loader, cudarc, that
/// Linux uses): unversioned, the driver's `.1`, and the CUDA major versions.
#[cfg(feature = "cuda")]
fn candidates(lib: &str) -> Vec<String> {
    let mut names = vec![format!("lib{lib}.so"), format!("lib{lib}.so.1")];
    names.extend(["13", "12", "11", "10"].map(|major| format!("lib{lib}.so.{major}")));
    names
}

/// Whether the dynamic loader finds `name` (the handle is kept: candle opens it next).
#[cfg(feature = "cuda")]
fn loadable(name: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(name) else {
        return false;
    };
    // SAFETY: a NUL-terminated name; the handle is never closed, as candle keeps its own.
    !unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) }.is_null()
}

/// The CUDA libraries that cannot be opened here, as "libNAME (where it comes from)".
#[cfg(feature = "cuda")]
pub fn missing_libraries() -> Vec<String> {
    LIBRARIES
        .iter()
        .filter(|(lib, _)| !candidates(lib).iter().any(|n| loadable(n)))
        .map(|(lib, from)| format!("lib{lib} ({from})"))
        .collect()
}

/// GPU 0 (of those `CUDA_VISIBLE_DEVICES` shows), or an error that says what is missing.
#[cfg(feature = "cuda")]
pub fn device() -> Result<Device> {
    let missing = missing_libraries();
    if !missing.is_empty() {
        return Err(Error::input(format!(
            "--device cuda: this machine has no {} on the library path. A GPU needs the NVIDIA \
             driver, and the CUDA 13 libraries on LD_LIBRARY_PATH (from pip, or PyTorch's \
             site-packages/nvidia/cu13/lib); without a GPU, leave --device out (the CPU)",
            missing.join(", ")
        )));
    }
    match std::panic::catch_unwind(|| Device::new_cuda(0)) {
        Ok(Ok(device)) => Ok(device),
        Ok(Err(e)) => Err(Error::input(format!(
            "--device cuda: the CUDA libraries are here but no GPU could be opened ({e}); check \
             nvidia-smi and CUDA_VISIBLE_DEVICES, or leave --device out (the CPU)"
        ))),
        Err(_) => Err(Error::input(
            "--device cuda: opening the GPU failed inside the CUDA libraries (see the message \
             above); check that the driver supports CUDA 13 (nvidia-smi), or leave --device \
             out (the CPU)",
        )),
    }
}

/// In a build without the `cuda` feature: the error that says how to get one.
#[cfg(not(feature = "cuda"))]
pub fn device() -> Result<Device> {
    Err(not_built())
}

/// The error of `--device cuda` in a build without the `cuda` feature.
pub fn not_built() -> Error {
    Error::input(
        "--device cuda: this infgram was built without the `cuda` feature; build one with \
         `bash scripts/build-cuda.sh` (docs/gpu.md), or leave --device out (the CPU)",
    )
}
