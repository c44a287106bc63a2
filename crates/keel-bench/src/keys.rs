//! Key choosers: uniform and YCSB-style scrambled Zipfian over `[0, n)`.
//!
//! Zipfian ranks come from `rand_distr::Zipf` (rank 1 is the most popular). YCSB scrambles
//! ranks with `fnv(rank) % n`, which is not a bijection: some keys take two ranks, others none.
//! Here ranks are scrambled with a keyed Feistel permutation of `[0, n)` instead, so the
//! distribution over keys is exactly Zipf's, only spread over the key space (hot keys are not
//! neighbours). Every chooser is deterministic given its seed and the random source.

use anyhow::Context as _;
use rand::Rng;
use rand_distr::{Distribution as _, Zipf};

/// A keyed bijection of `[0, n)`: a 4-round Feistel network over the smallest even number of
/// bits that covers `n`, with cycle-walking to stay inside the domain.
#[derive(Debug, Clone)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    round_keys: [u64; 4],
}

fn mix(mut x: u64) -> u64 {
    // SplitMix64's finalizer: a cheap, well-spread 64-bit mixer.
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Permutation {
    /// A permutation of `[0, n)` chosen by `seed`. `n` must be at least 1.
    pub fn new(n: u64, seed: u64) -> Permutation {
        assert!(n >= 1, "a permutation needs a non-empty domain");
        let bits = 64 - (n - 1).max(1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        let mut round_keys = [0; 4];
        for (i, k) in round_keys.iter_mut().enumerate() {
            *k = mix(seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        }
        Permutation {
            n,
            half_bits,
            round_keys,
        }
    }

    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        for k in self.round_keys {
            let next = left ^ (mix(right ^ k) & mask);
            left = right;
            right = next;
        }
        (left << self.half_bits) | right
    }

    /// The image of `x`, which must be below `n`.
    pub fn apply(&self, x: u64) -> u64 {
        debug_assert!(x < self.n);
        // Cycle-walking: the Feistel domain holds at most 4n values, and following a
        // permutation's cycle from a point inside `[0, n)` always returns inside it.
        let mut y = self.feistel(x);
        while y >= self.n {
            y = self.feistel(y);
        }
        y
    }
}

/// Chooses keys in `[0, n)`.
#[derive(Debug, Clone)]
pub enum KeyChooser {
    /// Every key equally likely.
    Uniform {
        /// Keys in `[0, n)`.
        n: u64,
    },
    /// Zipfian ranks with exponent θ, scrambled over the key space.
    Zipf {
        /// The rank distribution (ranks `1..=n`).
        zipf: Zipf<f64>,
        /// Rank (0-based) to key.
        scramble: Permutation,
    },
}

impl KeyChooser {
    /// Zipfian with exponent `theta` over `n` keys, or uniform when `theta` is 0.
    pub fn zipf(n: u64, theta: f64, seed: u64) -> anyhow::Result<KeyChooser> {
        anyhow::ensure!(n >= 1, "a key chooser needs at least one key");
        if theta == 0.0 {
            return Ok(KeyChooser::Uniform { n });
        }
        let zipf = Zipf::new(n as f64, theta)
            .with_context(|| format!("Zipf distribution over {n} keys with theta {theta}"))?;
        Ok(KeyChooser::Zipf {
            zipf,
            scramble: Permutation::new(n, seed),
        })
    }

    /// The 0-based popularity rank of the next draw (0 is the hottest). Uniform draws are
    /// their own rank.
    pub fn rank(&self, rng: &mut impl Rng) -> u64 {
        match self {
            KeyChooser::Uniform { n } => rng.random_range(0..*n),
            KeyChooser::Zipf { zipf, scramble } => {
                let rank = zipf.sample(rng) as u64;
                rank.clamp(1, scramble.n) - 1
            }
        }
    }

    /// The next key.
    pub fn key(&self, rng: &mut impl Rng) -> u64 {
        match self {
            KeyChooser::Uniform { .. } => self.rank(rng),
            KeyChooser::Zipf { scramble, .. } => scramble.apply(self.rank(rng)),
        }
    }
}

/// The exact share of draws that fall on the `top` most popular of `n` keys under Zipf with
/// exponent `theta`: `H(top, θ) / H(n, θ)` with `H(m, θ) = Σ_{i=1..m} i^-θ`.
pub fn zipf_top_share(n: u64, theta: f64, top: u64) -> f64 {
    let h = |m: u64| (1..=m).map(|i| (i as f64).powf(-theta)).sum::<f64>();
    h(top) / h(n)
}

#[cfg(test)]
mod tests;
