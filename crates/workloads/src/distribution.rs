//! Choosing keys.
//!
//! Zipfian: rank `i` (0-based) is drawn with probability proportional to
//! `1 / (i+1)^θ`, exactly, by `rand_distr::Zipf` (rejection-inversion,
//! constant time). YCSB's own generator (Gray et al., SIGMOD 1994)
//! approximates the ranks past the second and, measured here, gives rank
//! 2 about 15 % too many draws at θ = 0.75, so it is not used. YCSB's
//! "zipfian" scrambles ranks over the keyspace so the hot keys are not
//! neighbours; so does this one, with a permutation (YCSB's hash modulo
//! the key count is not one: over as many ranks as keys it reaches about
//! 63 % of the keys, and a key two ranks hash to is hotter than either).
//! Each key is one rank, of one rank's probability, and
//! [`Zipfian::hottest`] names the hottest, which is what a cache of the
//! top N keys (Clover's resolver) needs to know.

use rand::Rng;

/// The most keys a chooser spans: [`Zipfian::probability`] normalises with
/// an `O(n)` sum at construction.
pub const MAX_KEYS: u64 = 1 << 32;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DistributionError {
    #[error("a keyspace needs 1 to {MAX_KEYS} keys, not {0}")]
    KeyCount(u64),
    #[error("the zipfian constant must be a finite number from 0 to 10, not {0}")]
    Theta(f64),
}

/// FNV-1a over a value's bytes (YCSB's hash for scrambling).
fn fnv1a(value: u64) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in value.to_le_bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// Rounds of the scrambling network: four make a balanced Feistel
/// network a pseudo-random permutation when the round function is a
/// pseudo-random one (Luby and Rackoff).
const FEISTEL_ROUNDS: u64 = 4;

/// One pass of a balanced Feistel network over `2 * half_bits` bits, the
/// top bits of an FNV-1a hash of the round and the right half as its
/// round function: a permutation of `0..2^(2 * half_bits)`. (The top
/// bits: an FNV-1a hash's low bits depend on its input's low bits alone.)
fn feistel(value: u64, half_bits: u32) -> u64 {
    let mask = (1u64 << half_bits) - 1;
    let (mut left, mut right) = (value >> half_bits, value & mask);
    for round in 0..FEISTEL_ROUNDS {
        let mixed = left ^ (fnv1a(right ^ (round << 48)) >> (u64::BITS - half_bits));
        left = right;
        right = mixed;
    }
    (left << half_bits) | right
}

/// Rank → key for scrambled distributions: a permutation of
/// `0..key_count` (a Feistel network over the smallest even-bit range
/// that holds the keys, walked on while it lands past them), so every
/// key has exactly one rank.
pub fn scramble(rank: u64, key_count: u64) -> u64 {
    assert!(rank < key_count, "rank {rank} of {key_count} keys");
    assert!(key_count <= MAX_KEYS, "{key_count} keys, past {MAX_KEYS}");
    let bits = (u64::BITS - (key_count - 1).leading_zeros()).max(2);
    let half_bits = bits.div_ceil(2);
    // Bounded: the walk follows one cycle of a permutation of the range,
    // which comes back to `rank`, a key, within the range's size (and
    // lands on a key within four steps on average: the range is under
    // four times the keys).
    let mut value = rank;
    for _ in 0..1u64 << (2 * half_bits) {
        value = feistel(value, half_bits);
        if value < key_count {
            return value;
        }
    }
    unreachable!("a permutation's cycle returns to its start")
}

fn check_key_count(key_count: u64) -> Result<(), DistributionError> {
    if key_count == 0 || key_count > MAX_KEYS {
        return Err(DistributionError::KeyCount(key_count));
    }
    Ok(())
}

/// Draws a zipfian chooser makes for a key that exists before it takes
/// one modulo the keys that do.
const MAX_DRAWS: usize = 64;

/// Zipfian over ranks `0..key_count`, rank 0 the most popular.
#[derive(Debug, Clone)]
pub struct Zipfian {
    key_count: u64,
    theta: f64,
    /// The normaliser: the sum of `1 / rank^θ` over every rank, worked out
    /// when first asked (only `probability` needs it, and it costs a
    /// power per rank: minutes for billions of keys, paid on every
    /// construction).
    zeta_n: std::sync::OnceLock<f64>,
    sampler: rand_distr::Zipf<f64>,
    scrambled: bool,
}

fn zeta(count: u64, theta: f64) -> f64 {
    (1..=count)
        .map(|rank| 1.0 / (rank as f64).powf(theta))
        .sum()
}

/// A 0-based rank from a sampler over `count` ranks, which yields ranks
/// 1..=count as floats.
fn rank_of(sampler: &rand_distr::Zipf<f64>, count: u64, rng: &mut impl Rng) -> u64 {
    let rank = rand_distr::Distribution::sample(sampler, rng) as u64;
    rank.clamp(1, count) - 1
}

impl Zipfian {
    /// `theta` 0 is uniform; YCSB's default is 0.99, Clover's paper 0.75.
    pub fn new(key_count: u64, theta: f64, scrambled: bool) -> Result<Zipfian, DistributionError> {
        check_key_count(key_count)?;
        if !(0.0..=10.0).contains(&theta) {
            return Err(DistributionError::Theta(theta));
        }
        // rand_distr's sampler has a branch for exactly 1; within about
        // 1e-12 of it (and not it), its float steps draw rank n + 1, and
        // the tail's mass drifts (0.104 for 0.0925 above rank 500 of 1000).
        let theta = match (theta - 1.0).abs() < 1e-9 {
            true => 1.0,
            false => theta,
        };
        let sampler =
            rand_distr::Zipf::new(key_count, theta).map_err(|_| DistributionError::Theta(theta))?;
        Ok(Zipfian {
            key_count,
            theta,
            zeta_n: std::sync::OnceLock::new(),
            sampler,
            scrambled,
        })
    }

    pub fn key_count(&self) -> u64 {
        self.key_count
    }

    pub fn theta(&self) -> f64 {
        self.theta
    }

    /// A rank, 0 the most popular.
    pub fn next_rank(&self, rng: &mut impl Rng) -> u64 {
        rank_of(&self.sampler, self.key_count, rng)
    }

    pub fn next_key(&self, rng: &mut impl Rng) -> u64 {
        let rank = self.next_rank(rng);
        self.key_of(rank)
    }

    /// A rank of a zipfian of this constant over `count` ranks instead
    /// (a sampler made for them, in constant time, when they differ).
    pub fn next_rank_among(&self, count: u64, rng: &mut impl Rng) -> u64 {
        if count == self.key_count {
            return self.next_rank(rng);
        }
        let count = count.max(1);
        let sampler = rand_distr::Zipf::new(count, self.theta)
            .expect("a constant this chooser was made with, over at least one rank");
        rank_of(&sampler, count, rng)
    }

    fn key_of(&self, rank: u64) -> u64 {
        self.key_among(rank, self.key_count)
    }

    /// The key of `rank` among `count` keys, scrambled over them if this
    /// chooser scrambles (and the permutation spans that many).
    fn key_among(&self, rank: u64, count: u64) -> u64 {
        if self.scrambled && count <= MAX_KEYS {
            scramble(rank, count)
        } else {
            rank
        }
    }

    /// The probability of rank `rank`.
    pub fn probability(&self, rank: u64) -> f64 {
        let zeta_n = *self.zeta_n.get_or_init(|| zeta(self.key_count, self.theta));
        1.0 / ((rank + 1) as f64).powf(self.theta) / zeta_n
    }

    /// The keys of the `count` most popular ranks (all of them if fewer),
    /// most popular first. Each rank is its own key.
    pub fn hottest(&self, count: usize) -> Vec<u64> {
        let count = (count as u64).min(self.key_count);
        (0..count).map(|rank| self.key_of(rank)).collect()
    }
}

/// How a workload picks the key of each operation.
#[derive(Debug, Clone)]
pub enum KeyChooser {
    Uniform {
        key_count: u64,
    },
    Zipfian(Zipfian),
    /// Skewed towards the most recently inserted keys (YCSB's "latest"):
    /// the newest key is rank 0 of a zipfian over every key so far.
    Latest(Zipfian),
}

impl KeyChooser {
    pub fn uniform(key_count: u64) -> Result<KeyChooser, DistributionError> {
        check_key_count(key_count)?;
        Ok(KeyChooser::Uniform { key_count })
    }

    /// A key below `inserted` (the keys that exist now). Most draws land
    /// there at once: the chooser spans at most the loaded keys and twice
    /// the inserts expected.
    pub fn next_key(&self, inserted: u64, rng: &mut impl Rng) -> u64 {
        assert!(inserted > 0, "choosing among no keys");
        match self {
            KeyChooser::Uniform { .. } => rng.gen_range(0..inserted),
            KeyChooser::Zipfian(zipfian) => {
                // The chooser spans the keys inserts will add too, as
                // YCSB's does; a key not inserted yet is drawn again.
                // (Over the loaded keys only, `% inserted` never chose an
                // inserted one.)
                for _ in 0..MAX_DRAWS {
                    let key = zipfian.next_key(rng);
                    if key < inserted {
                        return key;
                    }
                }
                // Rarely reached (few keys inserted of a wide span): a
                // zipfian over the inserted keys themselves. A key of the
                // wide span modulo the inserted keys, as this was, kept
                // only the wide span's much flatter skew.
                zipfian.key_among(zipfian.next_rank_among(inserted, rng), inserted)
            }
            KeyChooser::Latest(zipfian) => {
                // Over every key inserted so far, as YCSB's skewed-latest
                // does: a zipfian over the loaded keys, its rank taken
                // modulo the keys, never reached those older than the
                // newest `record_count`.
                let back = zipfian.next_rank_among(inserted, rng);
                inserted - 1 - back
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FNV-1a modulo the key count, as YCSB scrambles, is no permutation:
    /// over 1000 ranks it reached about 630 of 1000 keys, and Clover's
    /// "1024 keys" were about 650. Every key is reached now, once.
    #[test]
    fn scrambling_reaches_every_key_once() {
        for key_count in [1, 2, 3, 1000, 1024, 4097] {
            let mut keys: Vec<u64> = (0..key_count)
                .map(|rank| scramble(rank, key_count))
                .collect();
            keys.sort_unstable();
            assert_eq!(keys, (0..key_count).collect::<Vec<_>>(), "{key_count} keys");
        }
    }

    /// A chooser over a million keys with a hundred inserted draws again
    /// until its key exists; past its draws it took a key of the million
    /// modulo the hundred, whose hottest got 8% of the draws where a
    /// zipfian of 0.99 over a hundred keys gives its first rank 19%.
    #[test]
    fn the_fallback_of_a_zipfian_chooser_is_still_skewed() {
        use rand::SeedableRng;
        let chooser = KeyChooser::Zipfian(Zipfian::new(1_000_000, 0.99, true).unwrap());
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let inserted = 100;
        let mut counts = vec![0u32; inserted as usize];
        let draws = 20_000;
        for _ in 0..draws {
            counts[chooser.next_key(inserted, &mut rng) as usize] += 1;
        }
        let hottest = f64::from(*counts.iter().max().unwrap()) / f64::from(draws);
        assert!(
            hottest > 0.15,
            "the hottest key got {hottest:.3} of the draws"
        );
    }

    /// With ranks colliding, `hottest` of nearly every key never filled
    /// up and compared each rank's key against every key found: a
    /// quadratic walk (minutes for Clover's default of caching every key).
    #[test]
    fn the_hottest_of_every_key_are_every_key() {
        let zipfian = Zipfian::new(200_000, 0.75, true).unwrap();
        let mut hottest = zipfian.hottest(300_000);
        assert_eq!(hottest.len(), 200_000);
        hottest.sort_unstable();
        hottest.dedup();
        assert_eq!(hottest.len(), 200_000);
    }
}
