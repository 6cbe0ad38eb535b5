//! Chains of n-gram occurrences over a growing sequence, a few bytes a token: what prompt
//! lookup ([`super::drafters::PromptLookup`]) walks to find the longest suffix of a context
//! seen before in it.
//!
//! For each key length `k` of [`KEY_LENGTHS`] (those up to the longest n-gram looked up), a
//! position `p` that follows a `k`-gram (`seq[p - k..p]`) links to the previous position that
//! followed the same `k`-gram: each `k`-gram's followers are a chain, latest first. A table
//! keyed by the `k`-gram's tokens holds each chain's latest follower. The occurrences of an
//! `n`-gram are found on the chain of the longest key length `k ≤ n`, each checked on its
//! other `n - k` tokens: exact, whatever the hash does.
//!
//! **Why not a chain per n?** The index it replaces linked every position once per n up to 8,
//! with a hash-map entry per distinct n-gram: about 220 bytes a token, 850 KB for a
//! 4,000-token drafting session. Here a token costs its own 4 bytes, 4 bytes of link per key
//! length and a share of each table (open addressing over positions, at most 70% full): about
//! 20 bytes. A lookup of a 2- or 3-gram walks the occurrences of its last token; with a third
//! key length (2) those walks are shorter, but a token costs 12 bytes more, and on text
//! (`bench_drafter_rules`) neither drafts faster.

/// Key lengths of the chains. An n-gram is looked up on the chain of the longest one `≤ n`
/// (4 is prompt lookup's resync length: a copy restarts on the chain of its last 4 tokens).
pub const KEY_LENGTHS: [usize; 2] = [1, 4];

/// The tables grow past this share of their slots in use (tenths).
const MAX_LOAD_TENTHS: usize = 7;

/// The chains of one key length.
#[derive(Clone, Debug)]
struct Chains {
    /// The key length.
    k: usize,
    /// `links[p]`: the previous follower of the `k`-gram that `p` follows (0: none; position
    /// 0 follows nothing, so 0 is never a follower).
    links: Vec<u32>,
    /// Open-addressed by the `k`-gram's hash: the latest follower of each `k`-gram seen (0:
    /// an empty slot); a slot's `k`-gram is read back from the sequence.
    heads: Vec<u32>,
    /// Slots in use.
    used: usize,
}

/// The indexed sequence and its chains.
#[derive(Clone, Debug)]
pub struct GramChains {
    seq: Vec<u32>,
    chains: Vec<Chains>,
}

/// The hash of a `k`-gram (its tokens, last first).
fn hash(gram: &[u32]) -> u64 {
    let mut h = 0x9e37_79b9_7f4a_7c15u64;
    for &t in gram.iter().rev() {
        h = (h ^ t as u64).wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 29;
    }
    h
}

impl Chains {
    fn new(k: usize) -> Self {
        Chains {
            k,
            links: Vec::new(),
            heads: vec![0; 16],
            used: 0,
        }
    }

    /// The slot of `gram` (`seq` holds the sequence the heads point into): where its latest
    /// follower is, or the empty slot it would take.
    fn slot(&self, seq: &[u32], gram: &[u32]) -> usize {
        let k = self.k;
        let mask = self.heads.len() - 1;
        let mut i = hash(gram) as usize & mask;
        loop {
            let q = self.heads[i] as usize;
            if q == 0 || seq[q - k..q] == *gram {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    /// Links follower `p` of `seq` (`p ≥ k`) into its `k`-gram's chain.
    fn push(&mut self, seq: &[u32], p: usize) {
        self.links.resize(p + 1, 0);
        if (self.used + 1) * 10 > self.heads.len() * MAX_LOAD_TENTHS {
            self.grow(seq);
        }
        let i = self.slot(seq, &seq[p - self.k..p]);
        self.links[p] = self.heads[i];
        if self.heads[i] == 0 {
            self.used += 1;
        }
        self.heads[i] = p as u32;
    }

    /// Doubles the table, placing each chain's head anew.
    fn grow(&mut self, seq: &[u32]) {
        let size = 2 * self.heads.len();
        let old = std::mem::replace(&mut self.heads, vec![0; size]);
        for q in old.into_iter().filter(|&q| q != 0) {
            let q = q as usize;
            let i = self.slot(seq, &seq[q - self.k..q]);
            self.heads[i] = q as u32;
        }
    }

    /// The latest follower of `gram` (0: none).
    fn head(&self, seq: &[u32], gram: &[u32]) -> usize {
        self.heads[self.slot(seq, gram)] as usize
    }

    fn bytes(&self) -> usize {
        4 * (self.links.capacity() + self.heads.capacity())
    }
}

/// The followers on one chain, latest first.
#[derive(Clone)]
pub struct Chain<'a> {
    links: &'a [u32],
    next: usize,
}

impl Iterator for Chain<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let p = self.next;
        if p == 0 {
            return None;
        }
        self.next = self.links[p] as usize;
        Some(p)
    }
}

impl GramChains {
    /// Chains for n-grams of up to `max_n` tokens (the key lengths up to it).
    pub fn new(max_n: usize) -> Self {
        GramChains {
            seq: Vec::new(),
            chains: KEY_LENGTHS
                .iter()
                .filter(|&&k| k <= max_n.max(1))
                .map(|&k| Chains::new(k))
                .collect(),
        }
    }

    /// The sequence indexed so far.
    pub fn seq(&self) -> &[u32] {
        &self.seq
    }

    /// Forgets the sequence (the tables keep their size).
    pub fn clear(&mut self) {
        self.seq.clear();
        for c in &mut self.chains {
            c.links.clear();
            c.heads.fill(0);
            c.used = 0;
        }
    }

    /// Room for `more` tokens, reserved at once (a prompt indexed in one go grows its
    /// vectors once, not by doubling: fewer copies, and freed blocks of fewer sizes).
    pub fn reserve(&mut self, more: usize) {
        self.seq.reserve(more);
        for c in &mut self.chains {
            c.links.reserve(self.seq.len() + more - c.links.len());
        }
    }

    /// Appends `token` at position `p = seq().len()`: `p` follows the `k`-grams that end
    /// before it.
    ///
    /// # Panics
    /// Past `u32::MAX` tokens (16 GiB of sequence).
    pub fn push(&mut self, token: u32) {
        let p = self.seq.len();
        assert!(
            p < u32::MAX as usize,
            "a prompt-lookup sequence of 2^32 tokens"
        );
        self.seq.push(token);
        for c in &mut self.chains {
            if p >= c.k {
                c.push(&self.seq, p);
            }
        }
    }

    /// The key length whose chain finds the occurrences of an `n`-gram: the longest `≤ n`.
    pub fn key_length(&self, n: usize) -> usize {
        self.chains
            .iter()
            .rev()
            .find(|c| c.k <= n)
            .map_or(1, |c| c.k)
    }

    /// The positions that followed an occurrence of the `k`-gram `seq[end - k..end]`, latest
    /// first, `k` a key length ([`GramChains::key_length`]) and `seq` any sequence (a context
    /// and a draft after it: only positions indexed here come back).
    pub fn chain(&self, seq: &[u32], end: usize, k: usize) -> Chain<'_> {
        let c = self
            .chains
            .iter()
            .find(|c| c.k == k)
            .expect("a key length of these chains");
        let next = match end >= k {
            true => c.head(&self.seq, &seq[end - k..end]),
            false => 0,
        };
        Chain {
            links: &c.links,
            next,
        }
    }

    /// The positions that followed an occurrence of `seq[end - n..end]` in the indexed
    /// sequence, latest first (on the chain of [`GramChains::key_length`]`(n)`, each checked
    /// on its other tokens).
    pub fn followers<'a>(
        &'a self,
        seq: &'a [u32],
        end: usize,
        n: usize,
    ) -> impl Iterator<Item = usize> + Clone + 'a {
        let k = self.key_length(n);
        self.chain(seq, end, k)
            .filter(move |&p| p >= n && seq[p - n..p - k] == seq[end - n..end - k])
    }

    /// Bytes held (the sequence, the links and the tables, as allocated).
    pub fn bytes(&self) -> usize {
        4 * self.seq.capacity() + self.chains.iter().map(Chains::bytes).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brute force: the followers of `seq[end - n..end]` among the first `known` positions.
    fn oracle(seq: &[u32], known: usize, end: usize, n: usize) -> Vec<usize> {
        (n..known)
            .rev()
            .filter(|&p| seq[p - n..p] == seq[end - n..end])
            .collect()
    }

    #[test]
    fn followers_equal_brute_force_for_every_n_and_end() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for alphabet in [1u32, 2, 3, 7, 50] {
            let mut chains = GramChains::new(8);
            let mut seq = Vec::new();
            for _ in 0..400 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let t = (x % alphabet as u64) as u32;
                seq.push(t);
                chains.push(t);
                // A draft of two more tokens after the indexed sequence.
                let mut ext = seq.clone();
                ext.extend([t, (t + 1) % alphabet]);
                for end in [seq.len(), ext.len()] {
                    for n in 1..=end.min(8) {
                        let got: Vec<usize> = chains.followers(&ext, end, n).collect();
                        assert_eq!(got, oracle(&ext, seq.len(), end, n), "n {n} end {end}");
                    }
                }
            }
            assert_eq!(chains.seq(), &seq[..]);
        }
    }

    #[test]
    fn a_token_costs_a_few_bytes() {
        let mut chains = GramChains::new(8);
        let mut x = 7u64;
        for _ in 0..100_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            chains.push((x >> 40) as u32 % 30_000);
        }
        let per_token = chains.bytes() as f64 / 100_000.0;
        assert!(per_token < 36.0, "{per_token} bytes a token");
    }
}
