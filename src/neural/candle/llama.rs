//! The llama architecture (SmolLM2 and kin) from a GGUF file, written with candle ops: the
//! reference the native forward pass ([`crate::neural::arch::llama::Llama`]) is checked against.
//!
//! Unlike candle-transformers' `quantized_llama`, this forward pass returns the logits of every
//! fed position and keeps a KV cache that can be truncated to any length. Weights stay in their
//! GGUF quantization and are multiplied with candle's `QMatMul`; embeddings are dequantized
//! once. RoPE is the interleaved ("normal") variant that llama-architecture GGUF files expect.

use crate::error::Result;
use crate::lm::LanguageModel;
use crate::neural::arch::{describe, Architecture};
use crate::neural::cpu::attention::Heads;
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
    /// Keys and values of the cached positions: `(1, n_kv_head, len, head_dim)`.
    cache: Option<(Tensor, Tensor)>,
}

/// A quantized llama model loaded from GGUF.
pub struct CandleLlama {
    embeddings: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    output: QMatMul,
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
    eps: f64,
    cos: Tensor,
    sin: Tensor,
    cached: usize,
    vocab: usize,
    eos: Vec<u32>,
    device: Device,
}

impl CandleLlama {
    /// Loads a llama-architecture GGUF file, keeping its quantization.
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

    /// [`CandleLlama::load`] onto `device`.
    pub fn load_on(
        path: &Path,
        requantize: Option<candle_core::quantized::GgmlDType>,
        device: &Device,
    ) -> Result<Self> {
        let mut gguf = Gguf::open(path)?;
        let arch = describe(&gguf)?;
        arch.check_runnable(&gguf)?;
        let Architecture {
            n_layer,
            heads:
                Heads {
                    n_head,
                    n_kv_head,
                    head_dim,
                },
            eos,
            ..
        } = arch;
        let (eps, base) = (arch.norm.eps as f64, arch.rope.base);
        let device = device.clone();
        let mut tensor = |name: &str| gguf.tensor(name);
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
        let embd_q = tensor("token_embd.weight")?;
        let embeddings = embd_q.dequantize(&device)?;
        let vocab = embeddings.dim(0)?;
        let norm = tensor("output_norm.weight")?.dequantize(&device)?;
        // SmolLM2 ties the output projection to the embeddings.
        let output = match tensor("output.weight") {
            Ok(t) => QMatMul::from_qtensor(requant(t)?)?,
            Err(_) => QMatMul::from_qtensor(requant(embd_q)?)?,
        };
        let mut layers = Vec::with_capacity(n_layer);
        for i in 0..n_layer {
            let mut q = |n: &str| -> Result<QMatMul> {
                let t = tensor(&format!("blk.{i}.{n}.weight"))?;
                Ok(QMatMul::from_qtensor(requant(t)?)?)
            };
            let (wq, wk, wv, wo) = (q("attn_q")?, q("attn_k")?, q("attn_v")?, q("attn_output")?);
            let (w_gate, w_up, w_down) = (q("ffn_gate")?, q("ffn_up")?, q("ffn_down")?);
            let attn_norm = tensor(&format!("blk.{i}.attn_norm.weight"))?.dequantize(&device)?;
            let ffn_norm = tensor(&format!("blk.{i}.ffn_norm.weight"))?.dequantize(&device)?;
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
                cache: None,
            });
        }
        // RoPE tables for 8k positions: angle(p, i) = p / base^(2i / head_dim).
        let max_pos = 8192usize;
        let inv: Vec<f32> = (0..head_dim / 2)
            .map(|i| 1.0 / base.powf(2.0 * i as f32 / head_dim as f32))
            .collect();
        let angles: Vec<f32> = (0..max_pos)
            .flat_map(|p| inv.iter().map(move |f| p as f32 * f))
            .collect();
        let angles = Tensor::from_vec(angles, (max_pos, head_dim / 2), &device)?;
        Ok(CandleLlama {
            cos: angles.cos()?,
            sin: angles.sin()?,
            embeddings,
            layers,
            norm,
            output,
            n_head,
            n_kv_head,
            head_dim,
            eps,
            cached: 0,
            vocab,
            eos,
            device,
        })
    }

    /// RMS normalization with candle-nn's fused kernel. Its rounding matters: activations are
    /// quantized to 8 bits before each quantized matmul, so one-ulp differences here grow into
    /// visible logit differences after 30 layers.
    fn rms_norm(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(x, w, self.eps as f32)?)
    }

    /// Interleaved rotary embedding of `x: (1, heads, t, head_dim)` for positions `pos..pos+t`.
    fn rope(&self, x: &Tensor, pos: usize) -> Result<Tensor> {
        let t = x.dim(2)?;
        let cos = self.cos.narrow(0, pos, t)?;
        let sin = self.sin.narrow(0, pos, t)?;
        Ok(candle_nn::rotary_emb::rope_i(&x.contiguous()?, &cos, &sin)?)
    }

    fn attention(&mut self, li: usize, x: &Tensor, pos: usize) -> Result<Tensor> {
        let (_, t, dim) = x.dims3()?;
        let (nh, nkv, hd) = (self.n_head, self.n_kv_head, self.head_dim);
        let layer = &self.layers[li];
        let q = layer
            .wq
            .forward(x)?
            .reshape((1, t, nh, hd))?
            .transpose(1, 2)?
            .contiguous()?;
        let k = layer
            .wk
            .forward(x)?
            .reshape((1, t, nkv, hd))?
            .transpose(1, 2)?
            .contiguous()?;
        let v = layer
            .wv
            .forward(x)?
            .reshape((1, t, nkv, hd))?
            .transpose(1, 2)?
            .contiguous()?;
        let q = self.rope(&q, pos)?;
        let k = self.rope(&k, pos)?;
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
        let att = if t > 1 {
            // Query i (absolute position pos + i) sees keys 0..=pos + i.
            let mask: Vec<f32> = (0..t)
                .flat_map(|i| {
                    (0..kv_len).map(move |j| if j > pos + i { f32::NEG_INFINITY } else { 0.0 })
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
            .reshape((1, t, dim))?;
        Ok(self.layers[li].wo.forward(&y)?)
    }
}

impl LanguageModel for CandleLlama {
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
            x = (self.attention(li, &h, pos)? + x)?;
            let layer = &self.layers[li];
            let h = self.rms_norm(&x, &layer.ffn_norm)?;
            let gate = candle_nn::ops::silu(&layer.w_gate.forward(&h)?)?;
            let up = layer.w_up.forward(&h)?;
            x = (layer.w_down.forward(&(gate * up)?)? + x)?;
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
        &self.eos
    }
}
