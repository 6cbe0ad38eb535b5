//! Every architecture's forward pass from a GGUF file, written with candle ops
//! ([`CandleDecoder`]): the reference the native pass ([`crate::neural::arch::decoder::Decoder`])
//! is checked against, and `--backend candle`.
//!
//! Unlike candle-transformers' quantized models, this pass returns the logits of every fed
//! position and keeps a KV cache that can be truncated to any length, and it reads the same
//! [`Architecture`] description as the native pass (candle-transformers' `quantized_gemma3`
//! also runs SiLU where Gemma has GELU, and masks cached positions in multi-token passes).
//! Weights stay in their GGUF quantization and are multiplied with candle's `QMatMul`;
//! embeddings are dequantized once.

use crate::error::Result;
use crate::lm::LanguageModel;
use crate::neural::arch::{describe, Activation, Architecture, Rope, RopeScaling, RopeStyle};
use crate::neural::load::gguf::Gguf;
use candle_core::quantized::QMatMul;
use candle_core::{DType, Device, Module, Tensor};
use std::path::Path;

struct Layer {
    wq: QMatMul,
    wk: QMatMul,
    wv: QMatMul,
    wo: QMatMul,
    w_gate: QMatMul,
    w_up: QMatMul,
    w_down: QMatMul,
    attn_norm: Tensor,
    ffn_norm: Tensor,
    /// q, k, v biases.
    biases: Option<[Tensor; 3]>,
    /// Per-head q and k norms.
    qk_norms: Option<[Tensor; 2]>,
    /// Norms of the attention and feed-forward outputs.
    post_norms: Option<[Tensor; 2]>,
    /// Positions seen (a sliding window), if not all.
    window: Option<usize>,
    /// Index of the rotary table (0 global, 1 windowed layers').
    rope: usize,
    /// Keys and values of the cached positions: `(1, n_kv_head, len, head_dim)`.
    cache: Option<(Tensor, Tensor)>,
}

/// A quantized model of any supported family loaded from GGUF, run with candle ops.
pub struct CandleDecoder {
    cfg: Architecture,
    embeddings: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    output: QMatMul,
    /// `(cos, sin)` of each rotary table, `positions × head_dim/2`.
    ropes: Vec<(Tensor, Tensor)>,
    cached: usize,
    vocab: usize,
    device: Device,
}

/// Positions the rotary tables cover.
const MAX_POSITIONS: usize = 8192;

impl CandleDecoder {
    /// Loads a GGUF file, keeping its quantization.
    pub fn from_gguf(path: &Path) -> Result<Self> {
        Self::load(path, None)
    }

    /// Loads a GGUF file and re-quantizes every matrix to `dtype` (e.g. Q8_0, which candle
    /// multiplies with SIMD kernels while Q4_1 has none), or keeps the file's types with `None`.
    pub fn load(
        path: &Path,
        requantize: Option<candle_core::quantized::GgmlDType>,
    ) -> Result<Self> {
        Self::load_on(path, requantize, &Device::Cpu)
    }

    /// [`CandleDecoder::load`] onto `device`.
    pub fn load_on(
        path: &Path,
        requantize: Option<candle_core::quantized::GgmlDType>,
        device: &Device,
    ) -> Result<Self> {
        let mut gguf = Gguf::open(path)?;
        let cfg = describe(&gguf)?;
        crate::neural::arch::check_blocks(&gguf, &cfg)?;
        let head_dim = cfg.heads.head_dim;
        let device = device.clone();
        let requant =
            |t: candle_core::quantized::QTensor| -> Result<candle_core::quantized::QTensor> {
                match requantize {
                    Some(dtype)
                        if t.dtype() != dtype
                            && t.shape()
                                .dims()
                                .last()
                                .is_some_and(|d| d % dtype.block_size() == 0) =>
                    {
                        Ok(candle_core::quantized::QTensor::quantize(
                            &t.dequantize(&Device::Cpu)?,
                            dtype,
                        )?)
                    }
                    _ => Ok(t),
                }
            };
        let offset = cfg.norm.weight_offset as f64;
        let vector = |gguf: &mut Gguf, name: &str| -> Result<Tensor> {
            Ok((gguf.tensor(name)?.dequantize(&device)? + offset)?)
        };
        let embd_q = gguf.tensor("token_embd.weight")?;
        let mut embeddings = embd_q.dequantize(&device)?;
        if let Some(scale) = cfg.embedding.scale {
            embeddings = (embeddings * scale as f64)?;
        }
        let vocab = embeddings.dim(0)?;
        let norm = vector(&mut gguf, "output_norm.weight")?;
        let output = match gguf.has("output.weight") {
            true => QMatMul::from_qtensor(requant(gguf.tensor("output.weight")?)?)?,
            false => QMatMul::from_qtensor(requant(embd_q)?)?,
        };
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let name = |n: &str| format!("blk.{i}.{n}.weight");
            let mut q = |n: &str| -> Result<QMatMul> {
                Ok(QMatMul::from_qtensor(requant(gguf.tensor(&name(n))?)?)?)
            };
            let (wq, wk, wv, wo) = (q("attn_q")?, q("attn_k")?, q("attn_v")?, q("attn_output")?);
            let (w_gate, w_up, w_down) = (q("ffn_gate")?, q("ffn_up")?, q("ffn_down")?);
            let g = &mut gguf;
            let attn_norm = vector(g, &name("attn_norm"))?;
            let ffn_norm = vector(g, &name("ffn_norm"))?;
            let qk_norms = match cfg.qk_norm {
                true => Some([
                    vector(g, &name("attn_q_norm"))?,
                    vector(g, &name("attn_k_norm"))?,
                ]),
                false => None,
            };
            let post_norms = match cfg.post_norms {
                true => Some([
                    vector(g, &name("post_attention_norm"))?,
                    vector(g, &name("post_ffw_norm"))?,
                ]),
                false => None,
            };
            let biases = match cfg.attention_bias {
                true => {
                    let mut bias = |n: &str| -> Result<Tensor> {
                        Ok(g.tensor(&format!("blk.{i}.{n}.bias"))?
                            .dequantize(&device)?)
                    };
                    Some([bias("attn_q")?, bias("attn_k")?, bias("attn_v")?])
                }
                false => None,
            };
            let windowed = cfg.sliding_window.filter(|w| w.windowed(i));
            layers.push(Layer {
                wq,
                wk,
                wv,
                wo,
                w_gate,
                w_up,
                w_down,
                attn_norm,
                ffn_norm,
                biases,
                qk_norms,
                post_norms,
                window: windowed.map(|w| w.size),
                rope: usize::from(windowed.is_some()),
                cache: None,
            });
        }
        let factors: Option<Vec<f32>> = match cfg.rope.scaling {
            RopeScaling::Frequencies => Some(
                gguf.tensor("rope_freqs.weight")?
                    .dequantize(&device)?
                    .to_vec1()?,
            ),
            _ => None,
        };
        let mut ropes = vec![rope_table(
            &cfg.rope.frequencies(head_dim, factors.as_deref()),
            &device,
        )?];
        if let Some(w) = cfg.sliding_window {
            let local = Rope {
                base: w.local_base,
                scaling: RopeScaling::None,
                ..cfg.rope
            };
            ropes.push(rope_table(&local.frequencies(head_dim, None), &device)?);
        }
        Ok(CandleDecoder {
            cfg,
            embeddings,
            layers,
            norm,
            output,
            ropes,
            cached: 0,
            vocab,
            device,
        })
    }

    /// RMS normalization with candle-nn's fused kernel. Its rounding matters: activations are
    /// quantized to 8 bits before each quantized matmul, so one-ulp differences here grow into
    /// visible logit differences after 30 layers.
    fn rms_norm(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(
            &x.contiguous()?,
            w,
            self.cfg.norm.eps,
        )?)
    }

    /// The rotary embedding of `x: (1, heads, t, head_dim)` for positions `pos..pos+t`, from
    /// table `table`, in the description's layout.
    fn rope(&self, x: &Tensor, pos: usize, table: usize) -> Result<Tensor> {
        let t = x.dim(2)?;
        let (cos, sin) = &self.ropes[table];
        let (cos, sin) = (cos.narrow(0, pos, t)?, sin.narrow(0, pos, t)?);
        let x = x.contiguous()?;
        Ok(match self.cfg.rope.style {
            RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&x, &cos, &sin)?,
            RopeStyle::Halves => candle_nn::rotary_emb::rope(&x, &cos, &sin)?,
        })
    }

    fn attention(&mut self, li: usize, x: &Tensor, pos: usize) -> Result<Tensor> {
        let (_, t, _) = x.dims3()?;
        let heads = self.cfg.heads;
        let (nh, nkv, hd) = (heads.n_head, heads.n_kv_head, heads.head_dim);
        let layer = &self.layers[li];
        let project = |w: &QMatMul, bias: Option<&Tensor>, n: usize| -> Result<Tensor> {
            let mut y = w.forward(x)?;
            if let Some(b) = bias {
                y = y.broadcast_add(b)?;
            }
            Ok(y.reshape((1, t, n, hd))?.transpose(1, 2)?.contiguous()?)
        };
        let bias = |i: usize| layer.biases.as_ref().map(|b| &b[i]);
        let mut q = project(&layer.wq, bias(0), nh)?;
        let mut k = project(&layer.wk, bias(1), nkv)?;
        let v = project(&layer.wv, bias(2), nkv)?;
        if let Some([nq, nk]) = &layer.qk_norms {
            q = self.rms_norm(&q, nq)?;
            k = self.rms_norm(&k, nk)?;
        }
        let (window, table) = (layer.window, layer.rope);
        let q = self.rope(&q, pos, table)?;
        let k = self.rope(&k, pos, table)?;
        let (k, v) = match &self.layers[li].cache {
            Some((ck, cv)) => (Tensor::cat(&[ck, &k], 2)?, Tensor::cat(&[cv, &v], 2)?),
            None => (k, v),
        };
        self.layers[li].cache = Some((k.clone(), v.clone()));
        let kv_len = k.dim(2)?;
        // Grouped-query attention: each key/value head serves n_head / n_kv_head query heads.
        let rep = nh / nkv;
        let k = k
            .unsqueeze(2)?
            .expand((1, nkv, rep, kv_len, hd))?
            .reshape((1, nh, kv_len, hd))?;
        let v = v
            .unsqueeze(2)?
            .expand((1, nkv, rep, kv_len, hd))?
            .reshape((1, nh, kv_len, hd))?;
        let att = (q.matmul(&k.t()?)? / (hd as f64).sqrt())?;
        let first = |i: usize| window.map_or(0, |w| (pos + i + 1).saturating_sub(w));
        let att = if t > 1 || first(0) > 0 {
            // Query i (absolute position pos + i) sees keys first(i)..=pos + i.
            let mask: Vec<f32> = (0..t)
                .flat_map(|i| {
                    (0..kv_len).map(move |j| {
                        if j > pos + i || j < first(i) {
                            f32::NEG_INFINITY
                        } else {
                            0.0
                        }
                    })
                })
                .collect();
            att.broadcast_add(&Tensor::from_vec(mask, (1, 1, t, kv_len), &self.device)?)?
        } else {
            att
        };
        let att = candle_nn::ops::softmax_last_dim(&att)?;
        let y = att
            .matmul(&v.contiguous()?)?
            .transpose(1, 2)?
            .reshape((1, t, nh * hd))?;
        Ok(self.layers[li].wo.forward(&y)?)
    }
}

/// The `(cos, sin)` tables of `freqs` for [`MAX_POSITIONS`] positions.
fn rope_table(freqs: &[f32], device: &Device) -> Result<(Tensor, Tensor)> {
    let angles: Vec<f32> = (0..MAX_POSITIONS)
        .flat_map(|p| freqs.iter().map(move |f| p as f32 * f))
        .collect();
    let angles = Tensor::from_vec(angles, (MAX_POSITIONS, freqs.len()), device)?;
    Ok((angles.cos()?, angles.sin()?))
}

impl LanguageModel for CandleDecoder {
    fn forward(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        crate::lm::check_vocab(tokens, self.vocab)?;
        let pos = self.cached;
        let ids = Tensor::new(tokens, &self.device)?;
        let mut x = self.embeddings.index_select(&ids, 0)?.unsqueeze(0)?;
        for li in 0..self.layers.len() {
            let h = self.rms_norm(&x, &self.layers[li].attn_norm)?;
            let mut attended = self.attention(li, &h, pos)?;
            let layer = &self.layers[li];
            if let Some([post_attention, _]) = &layer.post_norms {
                attended = self.rms_norm(&attended, post_attention)?;
            }
            x = (attended + x)?;
            let h = self.rms_norm(&x, &layer.ffn_norm)?;
            let gate = layer.w_gate.forward(&h)?;
            let gate = match self.cfg.activation {
                Activation::Silu => candle_nn::ops::silu(&gate)?,
                Activation::GeluTanh => gate.gelu()?,
            };
            let up = layer.w_up.forward(&h)?;
            let mut y = layer.w_down.forward(&(gate * up)?)?;
            if let Some([_, post_ffw]) = &layer.post_norms {
                y = self.rms_norm(&y, post_ffw)?;
            }
            x = (y + x)?;
        }
        let x = self.rms_norm(&x, &self.norm)?;
        let logits = self.output.forward(&x)?.squeeze(0)?.to_dtype(DType::F32)?;
        self.cached += tokens.len();
        Ok(logits.to_vec2()?)
    }

    fn cache_len(&self) -> usize {
        self.cached
    }

    fn truncate(&mut self, len: usize) {
        let len = len.min(self.cached);
        for layer in &mut self.layers {
            layer.cache = match (&layer.cache, len) {
                (_, 0) | (None, _) => None,
                (Some((k, v)), _) => Some((
                    k.narrow(2, 0, len).expect("len within cache"),
                    v.narrow(2, 0, len).expect("len within cache"),
                )),
            };
        }
        self.cached = len;
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn eos_tokens(&self) -> &[u32] {
        &self.cfg.eos
    }

    fn bos_token(&self) -> Option<u32> {
        self.cfg.bos
    }
}
