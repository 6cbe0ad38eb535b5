//! Architectures: what a model family's blocks are, as data ([`Architecture`]: norms and
//! where they sit, activation, rotary embedding with its layout and scaling, q/k norms,
//! biases, sliding-window layers, tied or scaled embeddings), read from a GGUF file's metadata
//! by the family's own `describe` function ([`ARCHITECTURES`]: [`llama`], [`qwen`],
//! [`gemma`]), and the one assembly of a model's layers from a description ([`layers`]) that
//! both backends load through ([`crate::neural::native`], [`crate::neural::candle`]).
//!
//! Adding an architecture is a file here with its `describe`, a row of [`ARCHITECTURES`], and
//! a test against a reference implementation (`tests/architectures/`); a block feature no
//! field describes yet is a new field, assembled in [`layers`] and run by both passes
//! ([`crate::neural::native::decoder::Decoder`],
//! [`crate::neural::candle::decoder::CandleDecoder`]).

pub mod gemma;
pub mod layers;
pub mod llama;
pub mod qwen;

use crate::error::Result;
use crate::neural::load::gguf::Gguf;

/// The attention heads of a layer: what the backend's attention needs to know of a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (a group of `n_head / n_kv_head` query heads shares each).
    pub n_kv_head: usize,
    /// Width of a head.
    pub head_dim: usize,
}

impl Heads {
    /// Width of a row of queries (all heads).
    pub fn q_width(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of a row of keys or values.
    pub fn kv_width(&self) -> usize {
        self.n_kv_head * self.head_dim
    }
}

/// The normalization before each block (RMS norm in every family infgram reads).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Norm {
    /// ε inside the square root.
    pub eps: f32,
    /// Added to the stored weights (Gemma stores `w − 1`: 1.0; llama: 0.0).
    pub weight_offset: f32,
}

/// The feed-forward block's gate activation (`act(gate) · up`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (llama, Qwen).
    Silu,
    /// GELU, tanh approximation (Gemma).
    GeluTanh,
}

/// How rotary angles are scaled beyond the trained context.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// None: `θ_i = base^(−2i/d)`.
    None,
    /// Positions divided by a factor (linear scaling).
    Linear(f32),
    /// Per-frequency factors stored in the file (`rope_freqs.weight`: Llama 3.1's scaling).
    Frequencies,
}

/// Which dimensions of a head the rotary embedding turns together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(2i, 2i + 1)`: llama files (whose converter permuted q and k for it).
    Interleaved,
    /// Pairs `(i, i + d/2)` (GPT-NeoX's layout): Qwen, Gemma.
    Halves,
}

/// The rotary position embedding.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    /// The base of the angles.
    pub base: f32,
    /// Scaling beyond the trained context.
    pub scaling: RopeScaling,
    /// The pairs' layout.
    pub style: RopeStyle,
}

impl Rope {
    /// The angle per position of each of a head's `head_dim / 2` pairs: `base^(−2i/d)`, over
    /// the scaling's factor (`factors`: the file's `rope_freqs.weight` for
    /// [`RopeScaling::Frequencies`]).
    pub fn frequencies(&self, head_dim: usize, factors: Option<&[f32]>) -> Vec<f32> {
        (0..head_dim / 2)
            .map(|i| {
                let freq = 1.0 / self.base.powf(2.0 * i as f32 / head_dim as f32);
                match (self.scaling, factors) {
                    (RopeScaling::Linear(f), _) => freq / f,
                    (RopeScaling::Frequencies, Some(factors)) => freq / factors[i],
                    _ => freq,
                }
            })
            .collect()
    }
}

/// Layers that attend to a window of recent positions only.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlidingWindow {
    /// Positions a windowed layer sees, its own included.
    pub size: usize,
    /// Every this-many-th layer attends globally (Gemma 3: 6, layers 5, 11, 17…); the others
    /// are windowed.
    pub global_every: usize,
    /// The rotary base of the windowed layers (Gemma 3: 10,000 where global layers use 10⁶).
    pub local_base: f32,
}

impl SlidingWindow {
    /// Whether layer `layer` (from 0) is windowed.
    pub fn windowed(&self, layer: usize) -> bool {
        !(layer + 1).is_multiple_of(self.global_every)
    }
}

/// The token embeddings and the output projection.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Embedding {
    /// The output projection is the embedding matrix (no `output.weight`).
    pub tied: bool,
    /// Embeddings are multiplied by this (Gemma: √dim).
    pub scale: Option<f32>,
}

/// One model family's decoder, described: everything a forward pass needs beyond the tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct Architecture {
    /// The family (`general.architecture`).
    pub name: String,
    /// Blocks.
    pub n_layer: usize,
    /// Width of the residual stream.
    pub dim: usize,
    /// Attention heads and their width.
    pub heads: Heads,
    /// The norm before each block (and at the end).
    pub norm: Norm,
    /// Each block's output is normed too before it joins the residual stream (Gemma 2 and 3:
    /// `post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// The feed-forward gate's activation.
    pub activation: Activation,
    /// The rotary embedding.
    pub rope: Rope,
    /// Queries and keys are RMS-normed per head before the rotation (Qwen 3, Gemma 3).
    pub qk_norm: bool,
    /// The q, k, v projections have biases (Qwen 2).
    pub attention_bias: bool,
    /// Windowed layers, if any.
    pub sliding_window: Option<SlidingWindow>,
    /// The embeddings.
    pub embedding: Embedding,
    /// End-of-sequence ids.
    pub eos: Vec<u32>,
    /// The token a sequence starts with, when the file asks for one (Gemma's `<bos>`).
    pub bos: Option<u32>,
}

/// Reads one family's description from a GGUF file's metadata.
pub type Describe = fn(&Gguf) -> Result<Architecture>;

/// The families infgram reads, each with the function that reads its description.
pub const ARCHITECTURES: &[(&str, Describe)] = &[
    ("llama", llama::describe),
    ("qwen2", qwen::describe_qwen2),
    ("qwen3", qwen::describe_qwen3),
    ("gemma3", gemma::describe),
];

/// The description of the model in `gguf`; a family not in [`ARCHITECTURES`] is refused by
/// name.
pub fn describe(gguf: &Gguf) -> Result<Architecture> {
    let name = gguf.architecture()?;
    match ARCHITECTURES.iter().find(|(family, _)| *family == name) {
        Some((_, describe)) => {
            let arch = describe(gguf)?;
            arch.check_values().map_err(|e| gguf.error(e))?;
            Ok(arch)
        }
        None => {
            let known: Vec<&str> = ARCHITECTURES.iter().map(|(f, _)| *f).collect();
            Err(gguf.error(format!(
                "architecture {name:?} is not supported (supported: {})",
                known.join(", ")
            )))
        }
    }
}

impl Architecture {
    /// Refuses numbers no model has, which would load and generate garbage (or divide by
    /// zero) instead of failing: the error names the metadata key.
    fn check_values(&self) -> std::result::Result<(), String> {
        let key = |k: &str| format!("{}.{k}", self.name);
        let positive = |k: &str, v: f32| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!(
                    "{} is {v}: it must be a finite number above 0; the file is damaged",
                    key(k)
                ))
            }
        };
        if self.n_layer == 0 || self.dim == 0 {
            return Err(format!(
                "{} is {} and {} is {}: a model needs at least one block of some width; the \
                 file is damaged",
                key("block_count"),
                self.n_layer,
                key("embedding_length"),
                self.dim
            ));
        }
        positive("attention.layer_norm_rms_epsilon", self.norm.eps)?;
        positive("rope.freq_base", self.rope.base)?;
        if let RopeScaling::Linear(f) = self.rope.scaling {
            positive("rope.scaling.factor", f)?;
        }
        if let Some(w) = &self.sliding_window {
            positive("rope.local_freq_base", w.local_base)?;
            if w.size == 0 {
                return Err(format!(
                    "{} is 0: a window sees at least its own position",
                    key("attention.sliding_window")
                ));
            }
        }
        if let Some(scale) = self.embedding.scale {
            positive("embedding scale", scale)?;
        }
        Ok(())
    }
}

/// Refuses a description whose numbers the file's tensors cannot back (before a backend
/// allocates by them): more blocks than the file has tensors, a block with no tensor
/// (`blk.N.*`), and a width or head layout that the embeddings' and the first block's query
/// projection do not have. Both backends call it after [`describe`].
pub fn check_blocks(gguf: &Gguf, arch: &Architecture) -> Result<()> {
    let heads = arch.heads;
    let q_width = heads.n_head.checked_mul(heads.head_dim);
    for (tensor, want) in [
        ("token_embd.weight", None),
        ("blk.0.attn_q.weight", q_width),
    ] {
        let Some(shape) = gguf.shape(tensor) else {
            return Err(gguf.error(format!("the file has no tensor {tensor}")));
        };
        let fits =
            shape.len() == 2 && shape[1] == arch.dim && want.is_none_or(|rows| shape[0] == rows);
        if !fits {
            return Err(gguf.error(format!(
                "{tensor} is {shape:?}, which the metadata ({}.embedding_length {}, {} heads of \
                 width {}) does not describe; the file is damaged",
                arch.name, arch.dim, heads.n_head, heads.head_dim
            )));
        }
    }
    check_special_ids(gguf)?;
    let key = format!("{}.block_count", arch.name);
    if arch.n_layer > gguf.tensor_count() {
        return Err(gguf.error(format!(
            "{key} is {}, more blocks than the file has tensors ({}); the file is damaged",
            arch.n_layer,
            gguf.tensor_count()
        )));
    }
    let mut seen = vec![false; arch.n_layer];
    for name in gguf.tensor_names() {
        let block = name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|n| n.parse::<usize>().ok());
        if let Some(slot) = block.and_then(|b| seen.get_mut(b)) {
            *slot = true;
        }
    }
    match seen.iter().position(|s| !s) {
        Some(missing) => Err(gguf.error(format!(
            "{key} is {}, but the file has no tensor of block {missing} (blk.{missing}.*); the \
             file is damaged or cut short",
            arch.n_layer
        ))),
        None => Ok(()),
    }
}

/// Refuses a special token id (`tokenizer.ggml.eos_token_id` and the others) outside the
/// vocabulary: the model's (the embedding's rows) and the tokenizer's. An end-of-sequence id
/// no token has would let generation run to its limit every time.
fn check_special_ids(gguf: &Gguf) -> Result<()> {
    let rows = gguf.shape("token_embd.weight").map(|s| s[0]);
    let vocab = match (rows, gguf.token_count()) {
        (Some(r), Some(t)) => r.min(t),
        (r, t) => r.or(t).unwrap_or(0),
    };
    for (key, id) in gguf.special_ids() {
        if id < 0 || id >= vocab as i128 {
            return Err(gguf.error(format!(
                "{key} is {id}, outside the vocabulary of {vocab} tokens; the file is damaged \
                 (or its metadata was edited): fix the key or fetch the model again"
            )));
        }
    }
    Ok(())
}

/// The heads of `family`'s file: counts from `{family}.attention.head_count(_kv)`, the head
/// width from `{family}.attention.key_length` when the file has it (Qwen 3, Gemma 3), else the
/// width over the heads; counts that do not divide are refused.
pub(crate) fn heads_of(gguf: &Gguf, family: &str, dim: usize) -> Result<Heads> {
    let n_head = gguf.usize(&format!("{family}.attention.head_count"))?;
    let n_kv_head = gguf.usize(&format!("{family}.attention.head_count_kv"))?;
    if n_head == 0 || n_kv_head == 0 || n_head % n_kv_head != 0 {
        return Err(gguf.error(format!(
            "{n_kv_head} key/value heads do not divide {n_head} query heads"
        )));
    }
    let key_length = format!("{family}.attention.key_length");
    let head_dim = if gguf.has_metadata(&key_length) {
        gguf.usize(&key_length)?
    } else if dim.is_multiple_of(n_head) {
        dim / n_head
    } else {
        return Err(gguf.error(format!("{n_head} heads do not divide the width {dim}")));
    };
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(gguf.error(format!("a head width of {head_dim} cannot be rotated")));
    }
    Ok(Heads {
        n_head,
        n_kv_head,
        head_dim,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::gguf_file::{self, Value};
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};

    /// A GGUF file of `metadata` and one 2 × 32 f32 tensor per name in `tensors`.
    fn gguf(dir: &std::path::Path, metadata: &[(&str, Value)], tensors: &[&str]) -> Gguf {
        let shapes: Vec<(&str, usize, usize)> = tensors.iter().map(|&n| (n, 2, 32)).collect();
        shaped(dir, metadata, &shapes)
    }

    /// A GGUF file of `metadata` and f32 tensors of the given shapes (rows, columns).
    fn shaped(
        dir: &std::path::Path,
        metadata: &[(&str, Value)],
        tensors: &[(&str, usize, usize)],
    ) -> Gguf {
        let path = dir.join("shaped.gguf");
        let qt: Vec<(String, QTensor)> = tensors
            .iter()
            .map(|&(n, rows, cols)| {
                let t = Tensor::zeros((rows, cols), candle_core::DType::F32, &Device::Cpu).unwrap();
                let q = QTensor::quantize(&t, candle_core::quantized::GgmlDType::F32).unwrap();
                (n.to_string(), q)
            })
            .collect();
        let md: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
        let ts: Vec<(&str, &QTensor)> = qt.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let mut f = std::fs::File::create(&path).unwrap();
        gguf_file::write(&mut f, &md, &ts).unwrap();
        Gguf::open(&path).unwrap()
    }

    /// Metadata no model has (NaN or 0 where a positive number belongs, no blocks) loads and
    /// generates garbage unless refused: refused at description, the key named.
    #[test]
    fn impossible_metadata_is_refused_by_key() {
        let t = tempfile::tempdir().unwrap();
        let cases: [(&str, Value, &str); 6] = [
            (
                "llama.attention.layer_norm_rms_epsilon",
                Value::F32(f32::NAN),
                "layer_norm_rms_epsilon",
            ),
            (
                "llama.attention.layer_norm_rms_epsilon",
                Value::F32(0.0),
                "layer_norm_rms_epsilon",
            ),
            (
                "llama.rope.freq_base",
                Value::F32(f32::NAN),
                "rope.freq_base",
            ),
            ("llama.rope.freq_base", Value::F32(0.0), "rope.freq_base"),
            (
                "llama.rope.scaling.factor",
                Value::F32(f32::INFINITY),
                "rope.scaling.factor",
            ),
            ("llama.block_count", Value::U32(0), "block_count"),
        ];
        for (key, value, named) in cases {
            let mut md = llama_metadata();
            md.retain(|(k, _)| *k != key);
            md.push((key, value.clone()));
            let e = describe(&gguf(t.path(), &md, &["token_embd.weight"]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(named), "{key} = {value:?}: {e}");
        }
    }

    /// A block count of 2³² − 1 made both backends allocate per block (an abort): refused
    /// against the file's tensors first, as are widths the tensors do not have.
    #[test]
    fn counts_the_tensors_cannot_back_are_refused_before_loading() {
        let t = tempfile::tempdir().unwrap();
        let tensors = [
            ("token_embd.weight", 4, 64),
            ("blk.0.attn_q.weight", 64, 64),
            ("blk.1.attn_q.weight", 64, 64),
        ];
        let mut md = llama_metadata();
        md.retain(|(k, _)| *k != "llama.block_count");
        md.push(("llama.block_count", Value::U32(2)));
        let file = shaped(t.path(), &md, &tensors);
        check_blocks(&file, &describe(&file).unwrap()).unwrap();
        for (count, named) in [(u32::MAX, "more blocks than"), (3, "no tensor of block 2")] {
            md.retain(|(k, _)| *k != "llama.block_count");
            md.push(("llama.block_count", Value::U32(count)));
            let file = shaped(t.path(), &md, &tensors);
            let e = check_blocks(&file, &describe(&file).unwrap())
                .unwrap_err()
                .to_string();
            assert!(e.contains(named) && e.contains("llama.block_count"), "{e}");
            let path = t.path().join("shaped.gguf");
            let native = crate::neural::native::decoder::Decoder::load(&path, None);
            assert!(native.is_err());
            let reference = crate::neural::candle::decoder::CandleDecoder::load(&path, None);
            assert!(reference.is_err());
        }
        let mut wide = llama_metadata();
        wide.retain(|(k, _)| *k != "llama.embedding_length" && *k != "llama.block_count");
        wide.push(("llama.embedding_length", Value::U32(1 << 30)));
        wide.push(("llama.block_count", Value::U32(2)));
        let file = shaped(t.path(), &wide, &tensors);
        let e = check_blocks(&file, &describe(&file).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not describe"), "{e}");
    }

    fn llama_metadata() -> Vec<(&'static str, Value)> {
        vec![
            ("general.architecture", Value::String("llama".into())),
            ("llama.attention.head_count", Value::U32(4)),
            ("llama.attention.head_count_kv", Value::U32(2)),
            ("llama.embedding_length", Value::U32(64)),
            ("llama.block_count", Value::U32(3)),
            ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ]
    }

    /// A llama file is described from its metadata and tensors (q/k norms and Llama 3's
    /// rotary factors read from the tensors present); a family infgram does not read, and
    /// head counts that do not divide, are refused by name.
    #[test]
    fn descriptions_read_metadata_and_tensors() {
        let t = tempfile::tempdir().unwrap();
        let file = gguf(t.path(), &llama_metadata(), &["token_embd.weight"]);
        let arch = describe(&file).unwrap();
        assert_eq!(
            arch.heads,
            Heads {
                n_head: 4,
                n_kv_head: 2,
                head_dim: 16
            }
        );
        assert_eq!((arch.n_layer, arch.dim), (3, 64));
        assert_eq!(
            arch.rope,
            Rope {
                base: 10_000.0,
                scaling: RopeScaling::None,
                style: RopeStyle::Interleaved,
            }
        );
        assert!(arch.embedding.tied && !arch.qk_norm && !arch.attention_bias);

        let with_norms = gguf(
            t.path(),
            &llama_metadata(),
            &[
                "token_embd.weight",
                "blk.0.attn_q_norm.weight",
                "rope_freqs.weight",
            ],
        );
        let arch = describe(&with_norms).unwrap();
        assert!(arch.qk_norm);
        assert_eq!(arch.rope.scaling, RopeScaling::Frequencies);
        let freqs = arch.rope.frequencies(8, Some(&[1.0, 2.0, 4.0, 8.0]));
        assert_eq!(freqs[0], 1.0);
        assert_eq!(freqs[3], 1.0 / 10_000f32.powf(0.75) / 8.0);

        let mut mamba = llama_metadata();
        mamba[0].1 = Value::String("mamba".into());
        let e = describe(&gguf(t.path(), &mamba, &[]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"mamba\" is not supported (supported: llama, qwen2, qwen3, gemma3)"),
            "{e}"
        );

        let mut bad = llama_metadata();
        bad[2].1 = Value::U32(3);
        let e = describe(&gguf(t.path(), &bad, &[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("do not divide"), "{e}");
    }
}
