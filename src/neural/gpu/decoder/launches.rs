//! The launches of one pass: a method per kernel entry point of `kernels.cu`, each reading the
//! pass's shared launch context ([`PassLaunches`]). The order of a pass is [`PassLaunches::run`]:
//! the embedding, then per layer q/k/v with the rotation and cache write, attention, the output
//! product, the feed-forward block, and last the output head.

use super::{attention_blocks, gpu_err, input_bytes, GpuDecoder, Layer, Mat, Mats, Products};
use super::{THREADS, WARPS};
use crate::error::Result;
use crate::neural::arch::{Activation, RopeStyle};
use crate::neural::gpu::{ATT_WARPS, MAX_ROWS};
use candle_core::cuda_backend::cudarc::driver::{self, CudaFunction, LaunchConfig, PushKernelArg};

/// What every launch of a pass of `t` rows reads.
pub(super) struct PassLaunches<'a> {
    d: &'a GpuDecoder,
    t: usize,
    /// The smallest block of rows of the matrix kernels that holds the pass (`block_rows` past
    /// it).
    pr: &'a Products,
    /// Blocks of `pr.rows` rows that cover the pass (the matrix kernels' grid's y dimension).
    token_blocks: u32,
}

/// A launch's result as the crate's.
fn launched<T>(r: std::result::Result<T, driver::DriverError>) -> Result<()> {
    r.map(|_| ()).map_err(|e| gpu_err("a kernel launch", e))
}

impl<'a> PassLaunches<'a> {
    pub(super) fn new(d: &'a GpuDecoder, t: usize) -> PassLaunches<'a> {
        let k = &d.kernels;
        let pr = k
            .products
            .iter()
            .find(|p| p.rows >= t.min(d.block_rows))
            .unwrap_or(&k.products[3]);
        let token_blocks = t.div_ceil(pr.rows) as u32;
        PassLaunches {
            d,
            t,
            pr,
            token_blocks,
        }
    }

    /// Launches every kernel of the pass, reading the parameters already on the device.
    pub(super) fn run(&self) -> Result<()> {
        self.embed()?;
        for layer in &self.d.layers {
            self.layer(layer)?;
        }
        self.output()
    }

    /// A warp per row (per `per_warp` rows), the grid (both its dimensions) capped at the
    /// blocks of `f` the GPU holds at once (the warps then step through the rows): the
    /// driver's occupancy for its registers and shared memory, so that no block waits for a
    /// second wave and a kernel of few registers keeps more rows' loads in flight.
    fn grid(&self, f: &CudaFunction, rows: usize, cols: usize) -> LaunchConfig {
        let smem = input_bytes(self.pr.rows, cols);
        let per_sm = f
            .occupancy_max_active_blocks_per_multiprocessor(THREADS, smem as usize, None)
            .map_or(2, |b| b.max(1) as usize);
        LaunchConfig {
            grid_dim: (
                rows.div_ceil(WARPS * self.pr.per_warp)
                    .min(per_sm * self.d.sms / self.token_blocks as usize)
                    .max(1) as u32,
                self.token_blocks,
                1,
            ),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: smem,
        }
    }

    /// A block of `threads` per row of the pass.
    fn per_row(&self, threads: u32) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.t as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// `x[row]` = the embedding of the row's token (· the architecture's scale).
    fn embed(&self) -> Result<()> {
        let (d, a) = (self.d, &self.d.acts);
        let scale = d.cfg.embedding.scale.unwrap_or(0.0);
        // SAFETY (every launch of this type): the arguments match the kernels' signatures in
        // kernels/*.cu, and every address is a live allocation of the decoder sized for
        // MAX_ROWS rows (the caller keeps t ≤ MAX_ROWS and each row within its room of the cache).
        unsafe {
            launched(
                d.stream
                    .launch_builder(&d.kernels.embed)
                    .arg(&d.embeddings)
                    .arg(&a.params_ptr)
                    .arg(&scale)
                    .arg(&a.x)
                    .launch(self.per_row(128)),
            )
        }
    }

    /// `matvec` over `mats` (`rows` in all) reading `cols`-wide rows of `x`, normed first by
    /// `norm` (0: not), added into the output where `residual` is 1.
    fn matvec(
        &self,
        mats: &Mats,
        x: u64,
        cols: usize,
        norm: u64,
        residual: i32,
        rows: usize,
    ) -> Result<()> {
        let (width, ti, eps) = (cols as i32, self.t as i32, self.d.cfg.norm.eps);
        // SAFETY: as for `embed`.
        unsafe {
            launched(
                self.d
                    .stream
                    .launch_builder(&self.pr.matvec)
                    .arg(mats)
                    .arg(&x)
                    .arg(&width)
                    .arg(&ti)
                    .arg(&norm)
                    .arg(&eps)
                    .arg(&residual)
                    .launch(self.grid(&self.pr.matvec, rows, cols)),
            )
        }
    }

    /// `x += norm(proj)` by `weight` (a norm after a block: Gemma's).
    fn norm_add(&self, weight: u64) -> Result<()> {
        let (d, a) = (self.d, &self.d.acts);
        let (dim, eps) = (d.cfg.dim as i32, d.cfg.norm.eps);
        // SAFETY: as for `embed`.
        unsafe {
            launched(
                d.stream
                    .launch_builder(&d.kernels.norm_add)
                    .arg(&a.x)
                    .arg(&a.proj)
                    .arg(&weight)
                    .arg(&dim)
                    .arg(&eps)
                    .launch(self.per_row(32)),
            )
        }
    }

    /// One layer: q, k, v (the rotation and cache writes fused into the product when no
    /// per-head norms come between, `qkv_rope`; else `matvec` then `rope_cache`), attention,
    /// the output product, the feed-forward block; with Gemma's norms after the blocks.
    fn layer(&self, layer: &Layer) -> Result<()> {
        let (a, w) = (&self.d.acts, &layer.w);
        let biases = w.biases.as_ref().map_or([0; 3], |b| *b);
        let qkv = Mats {
            m: [w.wq, w.wk, w.wv],
            out: [a.q, a.k, a.v],
            bias: biases,
            n: 3,
            _pad: 0,
        };
        let rows = (w.wq.rows + w.wk.rows + w.wv.rows) as usize;
        let post = w.post_norms;
        // Without norms after the blocks, the products add into x directly.
        let (into, residual) = match post {
            Some(_) => (a.proj, 0i32),
            None => (a.x, 1i32),
        };
        let one = |m: Mat| Mats {
            m: [m, Mat::default(), Mat::default()],
            out: [into, 0, 0],
            bias: [0; 3],
            n: 1,
            _pad: 0,
        };
        let norms = w.qk_norms.unwrap_or([0, 0]);
        if norms[0] == 0 {
            // No per-head norms: the rotation and the cache write ride on the product.
            self.qkv_rope(layer, &qkv)?;
        } else {
            self.matvec(&qkv, a.x, self.d.cfg.dim, w.attn_norm, 0, rows)?;
            self.rope_cache(layer, norms)?;
        }
        self.attention(layer)?;
        let (wo, null) = (one(w.wo), 0u64);
        let (cols, rows) = (w.wo.cols as usize, w.wo.rows as usize);
        self.matvec(&wo, a.att, cols, null, residual, rows)?;
        if let Some([post_attention, _]) = post {
            self.norm_add(post_attention)?;
        }
        self.gated(layer)?;
        let down = one(w.w_down);
        let (cols, rows) = (w.w_down.cols as usize, w.w_down.rows as usize);
        self.matvec(&down, a.act, cols, null, residual, rows)?;
        if let Some([_, post_ffw]) = post {
            self.norm_add(post_ffw)?;
        }
        Ok(())
    }

    /// q, k, v in one kernel, the norm before it, the rotation and the cache write of k and v
    /// after it.
    fn qkv_rope(&self, layer: &Layer, qkv: &Mats) -> Result<()> {
        let (d, a, w) = (self.d, &self.d.acts, &layer.w);
        let heads = d.cfg.heads;
        let (dim, ti, eps) = (d.cfg.dim as i32, self.t as i32, d.cfg.norm.eps);
        let (big_t, capacity) = (MAX_ROWS as i32, d.capacity() as i32);
        let (nh, nkv, hd) = self.head_counts();
        let (cos, sin) = d.ropes[w.rope];
        let interleaved = self.interleaved();
        let units = (heads.n_head + heads.n_kv_head) * heads.head_dim / 2 + heads.kv_width();
        // SAFETY: as for `embed`.
        unsafe {
            launched(
                d.stream
                    .launch_builder(&self.pr.qkv_rope)
                    .arg(qkv)
                    .arg(&a.x)
                    .arg(&dim)
                    .arg(&ti)
                    .arg(&w.attn_norm)
                    .arg(&eps)
                    .arg(&a.params_ptr)
                    .arg(&big_t)
                    .arg(&nh)
                    .arg(&nkv)
                    .arg(&hd)
                    .arg(&cos)
                    .arg(&sin)
                    .arg(&interleaved)
                    .arg(&a.q)
                    .arg(&layer.kcache)
                    .arg(&layer.vcache)
                    .arg(&capacity)
                    .launch(self.grid(&self.pr.qkv_rope, units, d.cfg.dim)),
            )
        }
    }

    /// q and k normed per head by `[qn, kn]`, rotated; k and v written to the cache.
    fn rope_cache(&self, layer: &Layer, [qn, kn]: [u64; 2]) -> Result<()> {
        let (d, a, w) = (self.d, &self.d.acts, &layer.w);
        let (big_t, capacity, eps) = (MAX_ROWS as i32, d.capacity() as i32, d.cfg.norm.eps);
        let (nh, nkv, hd) = self.head_counts();
        let (cos, sin) = d.ropes[w.rope];
        let interleaved = self.interleaved();
        // SAFETY: as for `embed`.
        unsafe {
            launched(
                d.stream
                    .launch_builder(&d.kernels.rope_cache)
                    .arg(&a.q)
                    .arg(&a.k)
                    .arg(&a.v)
                    .arg(&a.params_ptr)
                    .arg(&big_t)
                    .arg(&nh)
                    .arg(&nkv)
                    .arg(&hd)
                    .arg(&qn)
                    .arg(&kn)
                    .arg(&eps)
                    .arg(&cos)
                    .arg(&sin)
                    .arg(&interleaved)
                    .arg(&layer.kcache)
                    .arg(&layer.vcache)
                    .arg(&capacity)
                    .launch(self.per_row(THREADS)),
            )
        }
    }

    /// Attention of every (head, row) over the layer's cache, in chunks spread over blocks.
    fn attention(&self, layer: &Layer) -> Result<()> {
        let (d, a) = (self.d, &self.d.acts);
        let heads = d.cfg.heads;
        let (big_t, capacity) = (MAX_ROWS as i32, d.capacity() as i32);
        let (nh, nkv, _) = self.head_counts();
        let window = layer.w.window.map_or(0, |w| w as i32);
        let attn_scale = 1.0 / (heads.head_dim as f32).sqrt();
        // SAFETY: as for `embed`.
        unsafe {
            launched(
                d.stream
                    .launch_builder(&d.kernels.attention)
                    .arg(&a.q)
                    .arg(&layer.kcache)
                    .arg(&layer.vcache)
                    .arg(&a.params_ptr)
                    .arg(&big_t)
                    .arg(&nh)
                    .arg(&nkv)
                    .arg(&capacity)
                    .arg(&window)
                    .arg(&attn_scale)
                    .arg(&a.att)
                    .arg(&a.att_part)
                    .arg(&a.att_count)
                    .launch(LaunchConfig {
                        grid_dim: (heads.n_head as u32, self.t as u32, attention_blocks(self.t)),
                        block_dim: ((ATT_WARPS * 32) as u32, 1, 1),
                        shared_mem_bytes: 0,
                    }),
            )
        }
    }

    /// `act = act(gate · norm(x)) · (up · norm(x))`.
    fn gated(&self, layer: &Layer) -> Result<()> {
        let (d, a, w) = (self.d, &self.d.acts, &layer.w);
        let (dim, ti, eps) = (d.cfg.dim as i32, self.t as i32, d.cfg.norm.eps);
        let act = match d.cfg.activation {
            Activation::Silu => 0i32,
            Activation::GeluTanh => 1,
        };
        // SAFETY: as for `embed`.
        unsafe {
            launched(
                d.stream
                    .launch_builder(&self.pr.gated)
                    .arg(&w.w_gate)
                    .arg(&w.w_up)
                    .arg(&a.x)
                    .arg(&dim)
                    .arg(&ti)
                    .arg(&w.ffn_norm)
                    .arg(&eps)
                    .arg(&act)
                    .arg(&a.act)
                    .launch(self.grid(&self.pr.gated, w.w_gate.rows as usize, d.cfg.dim)),
            )
        }
    }

    /// The logits of every row: the output head over the final-normed rows.
    fn output(&self) -> Result<()> {
        let d = self.d;
        let out = Mats {
            m: [d.output, Mat::default(), Mat::default()],
            out: [d.acts.logits, 0, 0],
            bias: [0; 3],
            n: 1,
            _pad: 0,
        };
        self.matvec(&out, d.acts.x, d.cfg.dim, d.norm, 0, d.vocab)
    }

    /// Query heads, key/value heads and the head width, as the kernels take them.
    fn head_counts(&self) -> (i32, i32, i32) {
        let heads = self.d.cfg.heads;
        (
            heads.n_head as i32,
            heads.n_kv_head as i32,
            heads.head_dim as i32,
        )
    }

    /// 1 where pairs rotate as (2i, 2i + 1), 0 where as (i, i + d/2).
    fn interleaved(&self) -> i32 {
        i32::from(self.d.cfg.rope.style == RopeStyle::Interleaved)
    }
}
