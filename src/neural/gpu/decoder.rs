//! [`GpuDecoder`]: a GGUF model's passes on an NVIDIA GPU, on infgram's own fused kernels
//! (`kernels.cu`), each pass replayed from a CUDA graph captured once per row count.
//!
//! A layer is five launches: q/k/v in one matrix-vector kernel with the norm before it fused
//! in, and the rotation and the cache write on the way out; attention over the cache, its
//! positions in chunks over many blocks; the output product added to the residual; gate
//! and up in one kernel with the activation; down added to the residual. Per-head norms (Qwen
//! 3, Gemma 3) move the rotation into a kernel of its own, and Gemma's norms after the blocks
//! add two (eight launches). The matrix kernels come for 1, 2, 4 and [`TOKENS`] rows of a pass
//! a block (a pass takes the smallest that holds it), each compiled per weight type, and each
//! launch's grid is what the GPU holds of that kernel at once. The weights stay in the file's
//! blocks on the device; activations are f32, and a pass's rows of logits stay on the device
//! until [`Pass::rows`] copies the ones the caller reads. Every buffer is allocated at load,
//! the KV cache with a room of [`CAPACITY`] positions for one sequence (more rooms as sequences
//! are added: the cache doubles, its positions copied, and the graphs are captured again), and
//! what varies between passes of one row count (each row's token, position, sequence room and
//! cached length, and the slots of its branch) lives in a parameter array in device memory, so
//! a graph captured for `t` rows replays any pass of `t` rows, of one sequence or several.
//! Rolling back is a length change, as on the CPU.

use crate::error::{Error, Result};
use crate::neural::arch::layers::{rope_frequencies, weights, Backend};
use crate::neural::arch::Architecture;
use crate::neural::gpu::{
    gpu_type, Pass, Sequence, BRANCHES, CAPACITY, GREEDY_CHUNK, MAX_CHUNKS, MAX_ROWS, PARAMS_LEN,
    TOKENS,
};
use crate::neural::load::gguf::Gguf;
use candle_core::cuda_backend::cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaGraph, CudaModule, CudaSlice, CudaStream, DevicePtr,
    DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
use candle_core::quantized::{GgmlDType, QTensor};
use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

mod launches;

/// The kernels, compiled by `build.rs` with the pinned nvcc into a fat binary: machine code for
/// `CUDA_COMPUTE_CAP` (loaded as it is) and PTX (compiled by the driver on a newer GPU).
const KERNELS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/infgram_kernels.fatbin"));

/// A matrix as the kernels read it (`struct Mat` in `kernels/common.cuh`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Mat {
    w: u64,
    ty: i32,
    rows: i32,
    cols: i32,
    row_bytes: i32,
}

/// Up to three matrices reading one input (`struct Mats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Mats {
    m: [Mat; 3],
    out: [u64; 3],
    bias: [u64; 3],
    n: i32,
    _pad: i32,
}

// SAFETY: plain old data laid out as the kernels' structs (repr(C), pointers as u64).
unsafe impl DeviceRepr for Mat {}
// SAFETY: as above.
unsafe impl DeviceRepr for Mats {}

fn gpu_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Model(format!("the GPU pass: {what}: {e}"))
}

/// A device allocation and its address (taken once: kernels get raw addresses, so that a
/// captured graph never meets candle's or cudarc's per-use events).
struct Buffer<T> {
    slice: CudaSlice<T>,
    ptr: u64,
}

impl<T: DeviceRepr> Buffer<T> {
    fn new(slice: CudaSlice<T>, stream: &CudaStream) -> Self {
        let ptr = {
            let (ptr, _sync) = slice.device_ptr(stream);
            ptr
        };
        Buffer { slice, ptr }
    }
}

/// What loading puts on the device: matrices in their blocks, vectors as f32.
struct Upload<'a> {
    stream: &'a Arc<CudaStream>,
    owned: Vec<Buffer<u8>>,
    vectors: Vec<Buffer<f32>>,
}

impl Upload<'_> {
    fn matrix_of(&mut self, t: QTensor) -> Result<Mat> {
        let (rows, cols) = match t.shape().dims() {
            [rows, cols] => (*rows, *cols),
            other => return Err(Error::Model(format!("a matrix of shape {other:?}"))),
        };
        // Types the kernels do not read go to Q8_0, as the native backend does.
        let t = match gpu_type(t.dtype()) {
            Some(_) => t,
            None => QTensor::quantize(&t.dequantize(&candle_core::Device::Cpu)?, GgmlDType::Q8_0)?,
        };
        let ty = gpu_type(t.dtype()).expect("a type the kernels read");
        let data = t.data()?;
        let slice = self
            .stream
            .clone_htod(data.as_ref())
            .map_err(|e| gpu_err("copying weights", e))?;
        let buffer = Buffer::new(slice, self.stream);
        let mat = Mat {
            w: buffer.ptr,
            ty,
            rows: rows as i32,
            cols: cols as i32,
            row_bytes: (data.len() / rows) as i32,
        };
        self.owned.push(buffer);
        Ok(mat)
    }

    fn floats(&mut self, values: &[f32]) -> Result<u64> {
        let slice = self
            .stream
            .clone_htod(values)
            .map_err(|e| gpu_err("copying weights", e))?;
        let buffer = Buffer::new(slice, self.stream);
        let ptr = buffer.ptr;
        self.vectors.push(buffer);
        Ok(ptr)
    }

    fn zeros(&mut self, len: usize) -> Result<u64> {
        let slice = self
            .stream
            .alloc_zeros::<f32>(len.max(1))
            .map_err(|e| gpu_err("allocating activations", e))?;
        let buffer = Buffer::new(slice, self.stream);
        let ptr = buffer.ptr;
        self.vectors.push(buffer);
        Ok(ptr)
    }
}

impl Backend for Upload<'_> {
    type Matrix = Mat;
    type Vector = u64;

    fn matrix(&mut self, gguf: &mut Gguf, name: &str) -> Result<Mat> {
        let t = gguf.tensor(name)?;
        self.matrix_of(t)
    }

    fn shape(m: &Mat) -> (usize, usize) {
        (m.rows as usize, m.cols as usize)
    }

    fn vector(&mut self, values: Vec<f32>) -> Result<u64> {
        self.floats(&values)
    }
}

/// A layer's weights on the device, and its slice of the KV cache (`GpuDecoder::caches`).
struct Layer {
    w: crate::neural::arch::layers::Layer<Mat, u64>,
    kcache: u64,
    vcache: u64,
}

/// Every layer's keys and values for `rooms` sequences of [`CAPACITY`] positions each: layer
/// l's keys `buffers[2l]`, values `buffers[2l + 1]`, each kv head's `rooms · CAPACITY` slots
/// of head_dim floats one after another.
struct Caches {
    buffers: Vec<Buffer<f32>>,
    rooms: usize,
}

impl Caches {
    /// Zeroed caches of `rooms` rooms for `cfg`'s layers.
    fn alloc(stream: &Arc<CudaStream>, cfg: &Architecture, rooms: usize) -> Result<Caches> {
        let per_layer = cfg.heads.n_kv_head * rooms * CAPACITY * cfg.heads.head_dim;
        let buffers = (0..2 * cfg.n_layer)
            .map(|_| {
                let slice = stream
                    .alloc_zeros::<f32>(per_layer)
                    .map_err(|e| gpu_err("allocating the KV cache", e))?;
                Ok(Buffer::new(slice, stream))
            })
            .collect::<Result<_>>()?;
        Ok(Caches { buffers, rooms })
    }

    /// Points each of `layers` at its keys and values here.
    fn point(&self, layers: &mut [Layer]) {
        for (layer, kv) in layers.iter_mut().zip(self.buffers.chunks_exact(2)) {
            (layer.kcache, layer.vcache) = (kv[0].ptr, kv[1].ptr);
        }
    }
}

/// The activations of a pass, [`MAX_ROWS`] rows each.
struct Acts {
    x: u64,
    q: u64,
    k: u64,
    v: u64,
    att: u64,
    proj: u64,
    act: u64,
    /// The attention's per-chunk partials and per-(row, head) counters (`attend`).
    att_part: u64,
    att_count: u64,
    logits: u64,
    logits_buf: CudaSlice<f32>,
    /// `pick_part`'s (value, index) pairs: a row's chunks of GREEDY_CHUNK logits.
    pick_part: u64,
    /// `pick`'s (value bits, id) a row, copied back by `picks`.
    picks: CudaSlice<i32>,
    logits_host: LockedHost,
    params: CudaSlice<i32>,
    params_ptr: u64,
}

/// A captured pass. The driver's graph handles carry no thread affinity; the decoder that
/// owns one uses it from one thread at a time (`&mut self`).
struct Graph(CudaGraph);

// SAFETY: see above; CUDA's graph objects may be launched from any thread with the context
// bound (cudarc binds it on every launch).
unsafe impl Send for Graph {}

/// The kernels of `kernels.cu` (the files of `kernels/` it includes).
struct Kernels {
    _module: Arc<CudaModule>,
    /// The products for 1, 2, 4 and TOKENS rows a block, in that order.
    products: [Products; 4],
    embed: CudaFunction,
    norm_add: CudaFunction,
    rope_cache: CudaFunction,
    attention: CudaFunction,
    keep_path: CudaFunction,
    pick_part: CudaFunction,
    pick: CudaFunction,
}

/// The matrix kernels for `rows` rows of a pass a block (`kernels/matvec.cu` instantiates each for
/// 1, 2, 4 and TOKENS: a block runs every one of its rows' chains, so a pass takes the
/// smallest that holds it; a row's arithmetic is the same in all).
struct Products {
    rows: usize,
    /// Units (rows, or a rotation's two rows) a warp takes at once: 1, or for the several-row
    /// kernels of a variant that says otherwise (`infgram_rows_per_warp`, which
    /// scripts/kernel-variants/split-rows.patch defines) its count.
    per_warp: usize,
    matvec: CudaFunction,
    gated: CudaFunction,
    qkv_rope: CudaFunction,
}

/// Host memory the logits come back into, page-locked where it lies (`cuMemHostRegister`), so
/// that the copy is one transfer rather than the driver's staging through a buffer of its own
/// (measured on an H100: a 16-row pass 0.2 ms faster). cudarc's page-locked slices were tried:
/// their event waits cost a one-row step 0.2 ms. Where locking fails, the copy is staged.
struct LockedHost {
    buf: Vec<f32>,
    locked: bool,
}

impl LockedHost {
    fn new(len: usize) -> Self {
        let mut buf = vec![0f32; len];
        let bytes = std::mem::size_of_val(buf.as_slice());
        // SAFETY: the range is this Vec's allocation, which lives (and never moves: the Vec is
        // never grown) until Drop unregisters it.
        let r = unsafe { sys::cuMemHostRegister_v2(buf.as_mut_ptr().cast(), bytes, 0) };
        let locked = r == sys::cudaError_enum::CUDA_SUCCESS;
        LockedHost { buf, locked }
    }
}

impl Drop for LockedHost {
    fn drop(&mut self) {
        if self.locked {
            // SAFETY: registered in `new`, unregistered once.
            unsafe {
                sys::cuMemHostUnregister(self.buf.as_mut_ptr().cast());
            }
        }
    }
}

/// A GGUF model on the GPU, run by infgram's fused kernels.
pub struct GpuDecoder {
    cfg: Architecture,
    stream: Arc<CudaStream>,
    kernels: Kernels,
    _upload: (Vec<Buffer<u8>>, Vec<Buffer<f32>>),
    embeddings: Mat,
    output: Mat,
    norm: u64,
    layers: Vec<Layer>,
    caches: Caches,
    /// `(cos, sin)` per rotary table, [`CAPACITY`] × head_dim/2 each.
    ropes: Vec<(u64, u64)>,
    acts: Acts,
    vocab: usize,
    /// The graph of a pass of each row count, once captured (`None`: capture failed, so that
    /// row count launches its kernels one by one).
    graphs: HashMap<usize, Option<Graph>>,
    use_graphs: bool,
    /// Rows of a pass a block of the matrix kernels takes at most (1, 2, 4 or TOKENS, the
    /// default; `INFGRAM_CUDA_BLOCK_ROWS`): fewer rows a block, more blocks, each on a shorter
    /// path, the same bits.
    block_rows: usize,
    /// The GPU's multiprocessors.
    sms: usize,
    /// Rows of logits the last pass left in `acts.logits_buf`.
    last_rows: usize,
}

const THREADS: u32 = 256;
const WARPS: usize = (THREADS / 32) as usize;

/// The shared memory the matrix kernels of `rows` rows a block take for `cols` inputs: a row
/// of input per row the block runs (rows past the pass's are zeros), each padded by 4 floats
/// per 32 (`padded` in kernels/common.cuh).
fn input_bytes(rows: usize, cols: usize) -> u32 {
    (rows * (cols + cols / 32 * 4) * 4) as u32
}

/// The kernels' fat binary: the one built in, or with `INFGRAM_CUDA_KERNELS=FILE` one compiled
/// from a variant of `kernels.cu` (same entry points and parameters; `nvcc --fatbin`), so that
/// a kernel change is measured on a GPU beside the built-in one without rebuilding infgram.
fn kernels_binary() -> Result<Vec<u8>> {
    match std::env::var_os("INFGRAM_CUDA_KERNELS") {
        None => Ok(KERNELS.to_vec()),
        Some(path) => std::fs::read(&path).map_err(|e| {
            Error::Model(format!(
                "INFGRAM_CUDA_KERNELS={}: {e}; unset it to use the built-in kernels",
                Path::new(&path).display()
            ))
        }),
    }
}

/// The rows a warp of the several-row kernels takes at once: the kernels' own
/// `infgram_rows_per_warp` where they define it (the `SPLIT` of
/// scripts/kernel-variants/split-rows.patch), else 1 (the built-in kernels: a warp a row).
fn rows_per_warp(module: &Arc<CudaModule>, stream: &Arc<CudaStream>) -> Result<usize> {
    let Ok(symbol) = module.get_global("infgram_rows_per_warp", stream) else {
        return Ok(1);
    };
    let bytes = stream
        .clone_dtoh(&symbol)
        .map_err(|e| gpu_err("reading the kernels' layout", e))?;
    let split = bytes
        .get(..4)
        .map_or(1, |b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    match split {
        1 | 2 | 4 => Ok(split as usize),
        _ => Err(Error::Model(format!(
            "the GPU kernels say {split} rows a warp (1, 2 or 4 expected); rebuild them"
        ))),
    }
}

/// `INFGRAM_CUDA_BLOCK_ROWS`: the most rows of a pass a block of the matrix kernels takes (1,
/// 2, 4 or TOKENS, the products `kernels/matvec.cu` instantiates; TOKENS when unset). A row's arithmetic is
/// the same in every one, so
/// this trades the blocks' count against their paths without changing a bit. Measured on an
/// H200 (BENCHMARKS.md): 4 makes SmolLM2's 8- and 16-row passes 4–6% faster and Gemma 3's
/// 16-row pass 5% slower (its 262k-row output product decodes each weight for fewer rows);
/// halving only for matrices too small to fill the GPU was worse for Gemma too. So 8 stays.
fn block_rows() -> Result<usize> {
    match std::env::var("INFGRAM_CUDA_BLOCK_ROWS") {
        Err(_) => Ok(TOKENS),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if [1, 2, 4, TOKENS].contains(&n) => Ok(n),
            _ => Err(Error::input(format!(
                "INFGRAM_CUDA_BLOCK_ROWS={v}: give 1, 2, 4 or {TOKENS} (rows a block of the \
                 GPU's matrix kernels takes), or unset it"
            ))),
        },
    }
}

/// Blocks per (head, row) of the attention kernel: more for short passes, so that a one-token
/// step fills the GPU. Which block takes a chunk changes none of its arithmetic.
fn attention_blocks(t: usize) -> u32 {
    (64 / t).clamp(2, 32) as u32
}

impl Kernels {
    /// The kernels of the fat binary (`kernels_binary`), loaded into `ctx`: the matrix kernels
    /// for every block of rows, and the attention kernel of heads `head_dim` wide.
    fn load(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>, head_dim: usize) -> Result<Kernels> {
        let module = ctx
            .load_module(Ptx::from_binary(kernels_binary()?))
            .map_err(|e| gpu_err("loading the kernels", e))?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| gpu_err("loading a kernel", e))
        };
        let split = rows_per_warp(&module, stream)?;
        let products = |rows: usize| -> Result<Products> {
            let suffix = match rows {
                TOKENS => String::new(),
                _ => rows.to_string(),
            };
            Ok(Products {
                rows,
                per_warp: if rows > 1 { split } else { 1 },
                matvec: f(&format!("matvec{suffix}"))?,
                gated: f(&format!("gated{suffix}"))?,
                qkv_rope: f(&format!("qkv_rope{suffix}"))?,
            })
        };
        Ok(Kernels {
            products: [products(1)?, products(2)?, products(4)?, products(TOKENS)?],
            embed: f("embed")?,
            norm_add: f("norm_add")?,
            rope_cache: f("rope_cache")?,
            // One attention kernel per head width (check_shapes admits these).
            attention: f(&format!("attention_{head_dim}"))?,
            keep_path: f("keep_path")?,
            pick_part: f("pick_part")?,
            pick: f("pick")?,
            _module: module,
        })
    }

    /// Lets every matrix kernel take `smem` bytes of dynamic shared memory.
    fn allow_shared_memory(&self, smem: i32) -> Result<()> {
        for f in self
            .products
            .iter()
            .flat_map(|p| [&p.matvec, &p.gated, &p.qkv_rope])
        {
            f.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem,
            )
            .map_err(|e| gpu_err("the kernels' shared memory", e))?;
        }
        Ok(())
    }
}

/// A model's weights on the device (each layer's KV cache comes after: [`Caches`]).
struct Weights {
    embeddings: Mat,
    output: Mat,
    norm: u64,
    layers: Vec<Layer>,
    ropes: Vec<(u64, u64)>,
}

impl Weights {
    /// Uploads the weights of `gguf` (`cfg` describes it) through `up`, in the file's blocks.
    fn upload(gguf: &mut Gguf, cfg: &Architecture, up: &mut Upload) -> Result<Weights> {
        let embd = gguf.tensor("token_embd.weight")?;
        let embeddings = up.matrix_of(embd)?;
        let output = match gguf.has("output.weight") {
            true => up.matrix(gguf, "output.weight")?,
            false => embeddings,
        };
        let w = crate::neural::arch::layers::layers(gguf, cfg, up)?;
        let norm = up.floats(&weights(
            gguf,
            "output_norm.weight",
            cfg.dim,
            cfg.norm.weight_offset,
        )?)?;
        let ropes = rope_frequencies(gguf, cfg)?
            .iter()
            .map(|freqs| {
                let (cos, sin) = crate::neural::gpu::rope_table(freqs, CAPACITY);
                Ok((up.floats(&cos)?, up.floats(&sin)?))
            })
            .collect::<Result<Vec<_>>>()?;
        let layers = w
            .into_iter()
            .map(|w| Layer {
                w,
                kcache: 0,
                vcache: 0,
            })
            .collect();
        Ok(Weights {
            embeddings,
            output,
            norm,
            layers,
            ropes,
        })
    }
}

impl Acts {
    /// Every buffer of a pass, [`MAX_ROWS`] rows each, allocated once at load (`widest`: the
    /// widest activation, `ffn`: the feed-forward width).
    fn alloc(
        up: &mut Upload,
        cfg: &Architecture,
        vocab: usize,
        ffn: usize,
        widest: usize,
    ) -> Result<Acts> {
        let (stream, heads, hd) = (up.stream, cfg.heads, cfg.heads.head_dim);
        let logits_buf = stream
            .alloc_zeros::<f32>(MAX_ROWS * vocab)
            .map_err(|e| gpu_err("allocating logits", e))?;
        let picks = stream
            .alloc_zeros::<i32>(2 * MAX_ROWS)
            .map_err(|e| gpu_err("allocating greedy picks", e))?;
        let params = stream
            .alloc_zeros::<i32>(PARAMS_LEN)
            .map_err(|e| gpu_err("allocating parameters", e))?;
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| gpu_err("binding the context", e))?;
        let logits_host = LockedHost::new(MAX_ROWS * vocab);
        Ok(Acts {
            att_part: up.zeros(MAX_ROWS * heads.n_head * MAX_CHUNKS * (hd + 2))?,
            att_count: up.zeros(MAX_ROWS * heads.n_head)?,
            pick_part: up.zeros(2 * MAX_ROWS * vocab.div_ceil(GREEDY_CHUNK))?,
            picks,
            logits_host,
            x: up.zeros(MAX_ROWS * cfg.dim)?,
            q: up.zeros(MAX_ROWS * heads.q_width())?,
            k: up.zeros(MAX_ROWS * heads.kv_width())?,
            v: up.zeros(MAX_ROWS * heads.kv_width())?,
            att: up.zeros(MAX_ROWS * heads.q_width())?,
            proj: up.zeros(MAX_ROWS * widest)?,
            act: up.zeros(MAX_ROWS * ffn)?,
            logits: {
                let (p, _s) = logits_buf.device_ptr(stream);
                p
            },
            params_ptr: {
                let (p, _s) = params.device_ptr(stream);
                p
            },
            logits_buf,
            params,
        })
    }
}

impl GpuDecoder {
    /// Loads a GGUF file onto GPU 0 (`--device cuda`).
    pub fn load(path: &Path, requantize: Option<GgmlDType>) -> Result<Sequence<Self>> {
        if requantize.is_some() {
            return Err(Error::input(
                "--requantize: the GPU kernels read the file's own blocks; leave it out",
            ));
        }
        let mut gguf = Gguf::open(path)?;
        let cfg = crate::neural::arch::describe(&gguf)?;
        crate::neural::arch::check_blocks(&gguf, &cfg)?;
        crate::neural::gpu::check_shapes(&cfg)?;
        let device = crate::neural::candle::cuda::device()?;
        let ctx = match &device {
            candle_core::Device::Cuda(d) => d.cuda_stream().context().clone(),
            _ => return Err(Error::Model("--device cuda opened no GPU".into())),
        };
        let stream = ctx.new_stream().map_err(|e| gpu_err("a stream", e))?;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| gpu_err("the multiprocessor count", e))?;
        let kernels = Kernels::load(&ctx, &stream, cfg.heads.head_dim)?;
        let mut up = Upload {
            stream: &stream,
            owned: Vec::new(),
            vectors: Vec::new(),
        };
        let Weights {
            embeddings,
            output,
            norm,
            mut layers,
            ropes,
        } = Weights::upload(&mut gguf, &cfg, &mut up)?;
        let vocab = embeddings.rows as usize;
        let heads = cfg.heads;
        let ffn = layers.first().map_or(0, |l| l.w.w_gate.rows as usize);
        let widest = cfg.dim.max(heads.q_width()).max(ffn);
        // The matrix kernels keep up to TOKENS input rows in shared memory: past the 48 KB a
        // launch gets by default once inputs are wider than about 1,300.
        kernels.allow_shared_memory(input_bytes(TOKENS, widest) as i32)?;
        let acts = Acts::alloc(&mut up, &cfg, vocab, ffn, widest)?;
        let upload = (up.owned, up.vectors);
        let caches = Caches::alloc(&stream, &cfg, 1)?;
        caches.point(&mut layers);
        stream
            .synchronize()
            .map_err(|e| gpu_err("loading the model", e))?;
        Ok(Sequence::new(GpuDecoder {
            cfg,
            stream,
            kernels,
            _upload: upload,
            embeddings,
            output,
            norm,
            layers,
            caches,
            ropes,
            acts,
            vocab,
            graphs: HashMap::new(),
            use_graphs: std::env::var_os("INFGRAM_CUDA_GRAPHS").is_none_or(|v| v != "0"),
            block_rows: block_rows()?,
            sms: sms.max(1) as usize,
            last_rows: 0,
        }))
    }

    /// Slots of each kv head's cache: [`CAPACITY`] a room.
    fn capacity(&self) -> usize {
        self.caches.rooms * CAPACITY
    }

    /// Launches every kernel of a pass of `t` rows, reading the parameters already on the
    /// device ([`launches`]).
    fn launch_pass(&self, t: usize) -> Result<()> {
        launches::PassLaunches::new(self, t).run()
    }

    /// Runs a pass of `t` rows whose parameters are on the device: its graph's replay, once
    /// captured (captured at its first use), or its kernels one by one.
    fn run_pass(&mut self, t: usize) -> Result<()> {
        if !self.use_graphs {
            return self.launch_pass(t);
        }
        if !self.graphs.contains_key(&t) {
            // The first pass of a row count runs directly (modules load, nothing is captured
            // half-way), and is captured for the next.
            self.launch_pass(t)?;
            let graph = self.capture(t);
            if let Err(e) = &graph {
                diag!("infgram: the GPU pass of {t} rows runs without a CUDA graph: {e}");
            }
            self.graphs.insert(t, graph.ok());
            return Ok(());
        }
        match &self.graphs[&t] {
            Some(graph) => graph
                .0
                .launch()
                .map_err(|e| gpu_err("replaying a graph", e)),
            None => self.launch_pass(t),
        }
    }

    /// Captures a pass of `t` rows into a graph, without running it.
    fn capture(&self, t: usize) -> Result<Graph> {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        self.stream
            .begin_capture(mode)
            .map_err(|e| gpu_err("starting a capture", e))?;
        let launched = self.launch_pass(t);
        let graph = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(|e| gpu_err("ending a capture", e))?;
        launched?;
        let graph = graph.ok_or_else(|| Error::Model("an empty CUDA graph".into()))?;
        graph
            .upload()
            .map_err(|e| gpu_err("uploading a graph", e))?;
        Ok(Graph(graph))
    }

    /// Refuses rows the last pass did not leave.
    fn check_rows(&self, rows: &Range<usize>) -> Result<()> {
        match rows.end > self.last_rows {
            true => Err(Error::Model("rows past the last pass's".into())),
            false => Ok(()),
        }
    }

    /// The greedy picks of `n` rows of `len` logits at `logits` (device address): `pick_part`
    /// over chunks of GREEDY_CHUNK into `part` (2 · n · ⌈len / GREEDY_CHUNK⌉ ints), `pick` a
    /// warp a row into `out`, queued behind whatever the stream holds; then a copy of two
    /// numbers a row, and a wait (which reports the pass's errors too).
    fn launch_picks(
        &self,
        logits: u64,
        len: usize,
        n: usize,
        part: u64,
        out: &CudaSlice<i32>,
    ) -> Result<Vec<Option<(u32, f32)>>> {
        let mut host = vec![0i32; 2 * n];
        if n > 0 {
            let chunks = len.div_ceil(GREEDY_CHUNK);
            let (len_i, chunks_i) = (len as i32, chunks as i32);
            // SAFETY: pick_part's and pick's signatures; the caller's buffers hold n rows of
            // len logits, their chunks' pairs and two ints a row.
            unsafe {
                self.stream
                    .launch_builder(&self.kernels.pick_part)
                    .arg(&logits)
                    .arg(&len_i)
                    .arg(&part)
                    .launch(LaunchConfig {
                        grid_dim: (chunks as u32, n as u32, 1),
                        block_dim: (THREADS, 1, 1),
                        shared_mem_bytes: 0,
                    })
                    .map_err(|e| gpu_err("picking greedy tokens", e))?;
                self.stream
                    .launch_builder(&self.kernels.pick)
                    .arg(&part)
                    .arg(&chunks_i)
                    .arg(out)
                    .launch(LaunchConfig {
                        grid_dim: (n as u32, 1, 1),
                        block_dim: (32, 1, 1),
                        shared_mem_bytes: 0,
                    })
                    .map_err(|e| gpu_err("picking greedy tokens", e))?;
            }
            self.stream
                .memcpy_dtoh(&out.slice(0..2 * n), &mut host)
                .map_err(|e| gpu_err("copying greedy picks back", e))?;
        }
        self.stream
            .synchronize()
            .map_err(|e| gpu_err("a pass", e))?;
        Ok(host
            .chunks_exact(2)
            .map(|p| (p[1] >= 0).then(|| (p[1] as u32, f32::from_bits(p[0] as u32))))
            .collect())
    }
}

impl Sequence<GpuDecoder> {
    /// Whether passes replay captured CUDA graphs (on unless `INFGRAM_CUDA_GRAPHS=0`).
    pub fn with_graphs(mut self, on: bool) -> Self {
        self.pass_mut().use_graphs = on;
        self
    }

    /// The greedy pick of each of `rows` (of one length) by the device's kernels, as a pass's
    /// rows get theirs: for checking the kernels on rows chosen for it (ties, NaN, −∞, −0,
    /// rows of several chunks).
    pub fn picks_of(&mut self, rows: &[Vec<f32>]) -> Result<Vec<Option<(u32, f32)>>> {
        let len = rows.first().map_or(0, Vec::len);
        if rows.iter().any(|r| r.len() != len) || len == 0 {
            return Err(Error::input(
                "picks_of: rows of one length, at least one value",
            ));
        }
        let d = self.pass_mut();
        let err = |e| gpu_err("picks_of's buffers", e);
        let flat: Vec<f32> = rows.concat();
        let logits = d.stream.clone_htod(&flat).map_err(err)?;
        let part = d
            .stream
            .alloc_zeros::<i32>(2 * rows.len() * len.div_ceil(GREEDY_CHUNK))
            .map_err(err)?;
        let out = d.stream.alloc_zeros::<i32>(2 * rows.len()).map_err(err)?;
        let (lp, _l) = logits.device_ptr(&d.stream);
        let (pp, _p) = part.device_ptr(&d.stream);
        d.launch_picks(lp, len, rows.len(), pp, &out)
    }
}

impl Pass for GpuDecoder {
    fn architecture(&self) -> &Architecture {
        &self.cfg
    }

    fn vocab(&self) -> usize {
        self.vocab
    }

    /// Copies the parameters up and queues the pass (its graph's replay); the logits stay on
    /// the device.
    fn run(&mut self, params: &[i32], tokens: &[u32]) -> Result<()> {
        let t = tokens.len();
        // What rows past t would read is never read: the copy stops at row t's branch.
        let len = BRANCHES + t * MAX_ROWS;
        self.stream
            .memcpy_htod(&params[..len], &mut self.acts.params.slice_mut(0..len))
            .map_err(|e| gpu_err("copying a pass's parameters", e))?;
        self.last_rows = 0;
        self.run_pass(t)?;
        self.last_rows = t;
        Ok(())
    }

    /// Copies rows of the last pass's logits back (queued behind the pass) and waits.
    fn rows(&mut self, rows: Range<usize>) -> Result<Vec<Vec<f32>>> {
        self.check_rows(&rows)?;
        let (from, to) = (rows.start * self.vocab, rows.end * self.vocab);
        let host = &mut self.acts.logits_host.buf[from..to];
        if !rows.is_empty() {
            let view = self.acts.logits_buf.slice(from..to);
            self.stream
                .memcpy_dtoh(&view, host)
                .map_err(|e| gpu_err("copying logits back", e))?;
        }
        self.stream
            .synchronize()
            .map_err(|e| gpu_err("a pass", e))?;
        Ok(host.chunks_exact(self.vocab).map(<[f32]>::to_vec).collect())
    }

    /// The greedy picks of the pass's rows `rows` (`GpuDecoder::launch_picks`).
    fn picks(&mut self, rows: Range<usize>) -> Result<Vec<Option<(u32, f32)>>> {
        self.check_rows(&rows)?;
        let first = self.acts.logits + (rows.start * self.vocab * 4) as u64;
        let (part, n) = (self.acts.pick_part, rows.len());
        self.launch_picks(first, self.vocab, n, part, &self.acts.picks)
    }

    /// `keep_path` over every layer, [`PARAMS_LEN`] slots a launch (the slots go up in the
    /// parameters' buffer, queued behind the passes before).
    fn move_slots(&mut self, from: &[usize], to: usize) -> Result<()> {
        for (k, chunk) in from.chunks(PARAMS_LEN).enumerate() {
            self.keep_path(chunk, to + k * PARAMS_LEN)?;
        }
        Ok(())
    }

    fn rooms(&self) -> usize {
        self.caches.rooms
    }

    /// New caches of twice the rooms (or `rooms`, if more), the old positions copied into
    /// their first rooms; the captured graphs, which name the old caches, are dropped.
    fn add_rooms(&mut self, rooms: usize) -> Result<()> {
        let old = self.caches.rooms;
        if rooms <= old {
            return Ok(());
        }
        let rooms = rooms.max(2 * old);
        let heads = self.cfg.heads;
        // (On failure nothing changed: the layers still point at the caches they had.)
        let mut grown = Caches::alloc(&self.stream, &self.cfg, rooms).map_err(|e| {
            Error::Unavailable(format!(
                "--device cuda: no GPU memory for the KV caches of {rooms} sequences ({e}); \
                 serve fewer at once (--parallel)"
            ))
        })?;
        let stretch = |rooms: usize| rooms * CAPACITY * heads.head_dim;
        for (from, to) in self.caches.buffers.iter().zip(grown.buffers.iter_mut()) {
            for kh in 0..heads.n_kv_head {
                let (a, b) = (kh * stretch(old), kh * stretch(rooms));
                self.stream
                    .memcpy_dtod(
                        &from.slice.slice(a..a + stretch(old)),
                        &mut to.slice.slice_mut(b..b + stretch(old)),
                    )
                    .map_err(|e| gpu_err("copying the KV cache", e))?;
            }
        }
        grown.point(&mut self.layers);
        self.caches = grown;
        self.graphs.clear();
        Ok(())
    }
}

impl GpuDecoder {
    /// Moves the keys and values at slots `slots[i]` to `base + i` in every layer.
    fn keep_path(&mut self, slots: &[usize], base: usize) -> Result<()> {
        let slots: Vec<i32> = slots.iter().map(|&n| n as i32).collect();
        self.stream
            .memcpy_htod(&slots, &mut self.acts.params.slice_mut(0..slots.len()))
            .map_err(|e| gpu_err("copying a path", e))?;
        let heads = self.cfg.heads;
        let (len, base_i) = (slots.len() as i32, base as i32);
        let (kv_heads, capacity, hd) = (
            heads.n_kv_head as i32,
            self.capacity() as i32,
            heads.head_dim as i32,
        );
        for layer in &self.layers {
            // SAFETY: keep_path's signature; the slots lie in the cache (rooms of sequences).
            unsafe {
                self.stream
                    .launch_builder(&self.kernels.keep_path)
                    .arg(&layer.kcache)
                    .arg(&layer.vcache)
                    .arg(&self.acts.params_ptr)
                    .arg(&len)
                    .arg(&base_i)
                    .arg(&kv_heads)
                    .arg(&capacity)
                    .arg(&hd)
                    .launch(LaunchConfig {
                        grid_dim: (heads.n_kv_head as u32, 1, 1),
                        block_dim: (THREADS, 1, 1),
                        shared_mem_bytes: 0,
                    })
                    .map_err(|e| gpu_err("keeping a path", e))?;
            }
        }
        Ok(())
    }
}
