//! Sampling from a distribution: greedy, temperature, top-k, top-p, with a seeded RNG.
//! One sampler for every generator.

use crate::lm::Logits;
use rand::{Rng, SeedableRng};

/// Sampling settings.
#[derive(Clone, Debug)]
pub struct SamplerConfig {
    /// Temperature; 0 means greedy (argmax). Applied as `p^(1/T)`.
    pub temperature: f64,
    /// Keep the smallest set of most likely tokens whose mass reaches `top_p` (1 = all).
    pub top_p: f64,
    /// Keep the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
}

/// Sampling temperature when none is given (`service::request::defaults` names this one).
pub const DEFAULT_TEMPERATURE: f64 = 0.8;

impl Default for SamplerConfig {
    /// Temperature [`DEFAULT_TEMPERATURE`], every token kept (top-p 1, top-k 0).
    fn default() -> Self {
        SamplerConfig {
            temperature: DEFAULT_TEMPERATURE,
            top_p: 1.0,
            top_k: 0,
        }
    }
}

/// A sampler with its RNG.
pub struct Sampler {
    cfg: SamplerConfig,
    rng: rand::rngs::StdRng,
    /// Scratch space of `sample`, kept to avoid an allocation per token.
    weights: Vec<(u32, f64)>,
}

impl Sampler {
    /// A sampler; the same seed gives the same choices.
    pub fn new(cfg: SamplerConfig, seed: Option<u64>) -> Self {
        let rng = match seed {
            Some(s) => rand::rngs::StdRng::seed_from_u64(s),
            None => rand::rngs::StdRng::from_os_rng(),
        };
        Sampler {
            cfg,
            rng,
            weights: Vec::new(),
        }
    }

    /// The greedy sampler (temperature 0; it draws no random numbers).
    pub fn greedy() -> Self {
        Sampler::new(
            SamplerConfig {
                temperature: 0.0,
                ..SamplerConfig::default()
            },
            Some(0),
        )
    }

    /// The settings.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Draws a token from `(token, probability)` pairs (probabilities need not be normalized).
    /// Ties in greedy mode go to the smallest token id. Returns `None` for an empty input.
    pub fn sample(&mut self, dist: &[(u32, f64)]) -> Option<u32> {
        if dist.is_empty() {
            return None;
        }
        if self.is_greedy() {
            return dist
                .iter()
                .fold(None, |best: Option<(u32, f64)>, &(t, p)| match best {
                    Some((_, bp)) if bp >= p => best,
                    _ => Some((t, p)),
                })
                .map(|(t, _)| t);
        }
        let mut w = std::mem::take(&mut self.weights);
        self.target_weights(dist, &mut w);
        let choice = self.draw_weighted(&w);
        self.weights = w;
        choice
    }

    /// Whether this sampler takes the argmax: at temperature 0, and at a temperature so small
    /// that `1 / T` overflows (the tempered distribution's limit is the argmax).
    pub fn is_greedy(&self) -> bool {
        let t = self.cfg.temperature;
        t <= 0.0 || !(1.0 / t).is_finite()
    }

    /// The weights `sample` draws from when not greedy (tempered, then top-k / top-p
    /// filtered; not normalized), into `w`. Speculative verification tests drafts against them.
    pub fn target_weights(&self, dist: &[(u32, f64)], w: &mut Vec<(u32, f64)>) {
        let inv_t = 1.0 / self.cfg.temperature;
        w.clear();
        w.extend(
            dist.iter()
                .filter(|&&(_, p)| p > 0.0)
                .map(|&(t, p)| (t, if inv_t == 1.0 { p } else { p.powf(inv_t) })),
        );
        self.filter(w);
    }

    /// [`Sampler::target_weights`] of the softmax of `logits`, in one pass: the tempered
    /// softmax up to its normalizing constant (which the draw divides out), one `exp` per
    /// token.
    pub fn target_weights_of(&self, logits: &Logits, w: &mut Vec<(u32, f64)>) {
        logits.tempered_weights_into(self.cfg.temperature, w);
        self.filter(w);
    }

    /// Top-k, then top-p, on tempered weights.
    fn filter(&self, w: &mut Vec<(u32, f64)>) {
        if self.cfg.top_k > 0 || self.cfg.top_p < 1.0 {
            w.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            if self.cfg.top_k > 0 {
                w.truncate(self.cfg.top_k);
            }
            if self.cfg.top_p < 1.0 {
                let total: f64 = w.iter().map(|x| x.1).sum();
                let (mut acc, mut keep) = (0.0, 0);
                for x in w.iter() {
                    acc += x.1;
                    keep += 1;
                    if acc >= self.cfg.top_p * total {
                        break;
                    }
                }
                w.truncate(keep.max(1));
            }
        }
    }

    /// A uniform draw from [0, 1).
    pub fn uniform(&mut self) -> f64 {
        self.rng.random::<f64>()
    }

    /// Draws a token with probability proportional to its weight.
    pub fn draw_weighted(&mut self, w: &[(u32, f64)]) -> Option<u32> {
        if w.is_empty() {
            return None;
        }
        let total: f64 = w.iter().map(|x| x.1).sum();
        let mut u = self.rng.random::<f64>() * total;
        for &(t, p) in w.iter() {
            if u < p {
                return Some(t);
            }
            u -= p;
        }
        w.last().map(|x| x.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temperature whose inverse overflows is greedy: 1e-320 draws the
    /// argmax as 0 does, instead of finding no token.
    #[test]
    fn a_temperature_that_underflows_is_greedy() {
        let dist = [(3u32, 0.2), (5, 0.5), (7, 0.3)];
        for t in [0.0, 1e-320, f64::MIN_POSITIVE / 4.0] {
            let mut s = Sampler::new(
                SamplerConfig {
                    temperature: t,
                    ..SamplerConfig::default()
                },
                Some(1),
            );
            assert!(s.is_greedy(), "{t}");
            assert_eq!(s.sample(&dist), Some(5), "{t}");
        }
        let s = Sampler::new(
            SamplerConfig {
                temperature: 1e-300,
                ..SamplerConfig::default()
            },
            Some(1),
        );
        assert!(!s.is_greedy());
    }
}
