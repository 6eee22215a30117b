//! The `synthetic` record: the payload of the dissertation's benchmark device (`size` bytes
//! every `interval_ms`).
//!
//! The payload of frame `seq` is a pure function of `(seed, seq, size)` — [`payload`] — so a
//! `check` sink on the other side can verify every byte without any shared state. The bytes
//! are SplitMix64 output seeded with `seed ^ seq.wrapping_mul(0x9e3779b97f4a7c15)`, written
//! as little-endian u64 words and truncated to `size`.

/// Golden-ratio increment of SplitMix64 (also used to spread sequence numbers).
pub const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The SplitMix64 generator (Steele, Lea and Flood), as in `java.util.SplittableRandom`.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting at `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform float in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

fn generator(seed: u64, seq: u64) -> SplitMix64 {
    SplitMix64::new(seed ^ seq.wrapping_mul(GOLDEN))
}

/// The payload of frame `seq`: `size` bytes.
pub fn payload(seed: u64, seq: u64, size: usize) -> Vec<u8> {
    let mut out = vec![0; size];
    fill(seed, seq, &mut out);
    out
}

/// Writes the payload of frame `seq` into `out` (its length is the size), without allocating.
pub fn fill(seed: u64, seq: u64, out: &mut [u8]) {
    let mut g = generator(seed, seq);
    let mut words = out.chunks_exact_mut(8);
    for w in &mut words {
        w.copy_from_slice(&g.next().to_le_bytes());
    }
    let tail = words.into_remainder();
    let n = tail.len();
    tail.copy_from_slice(&g.next().to_le_bytes()[..n]);
}

/// True when `data` is exactly the payload of frame `seq` with `data.len()` bytes. Allocates
/// nothing.
pub fn verify(seed: u64, seq: u64, data: &[u8]) -> bool {
    let mut g = generator(seed, seq);
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        if w != g.next().to_le_bytes() {
            return false;
        }
    }
    let tail = words.remainder();
    tail == &g.next().to_le_bytes()[..tail.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_reference_vector() {
        // Reference values for seed 1234567 (from the published C implementation).
        let mut g = SplitMix64::new(1234567);
        assert_eq!(g.next(), 6457827717110365317);
        assert_eq!(g.next(), 3203168211198807973);
        assert_eq!(g.next(), 9817491932198370423);
    }

    #[test]
    fn payload_is_words_of_the_seeded_generator_truncated() {
        let p = payload(1, 5, 12);
        let mut g = SplitMix64::new(1 ^ 5u64.wrapping_mul(GOLDEN));
        let w0 = g.next().to_le_bytes();
        let w1 = g.next().to_le_bytes();
        assert_eq!(&p[..8], &w0);
        assert_eq!(&p[8..], &w1[..4]);
        assert_eq!(payload(1, 5, 3), p[..3].to_vec(), "shorter is a prefix");
        assert!(payload(1, 5, 0).is_empty());
    }

    #[test]
    fn payload_test_vector_from_the_docs() {
        assert_eq!(
            payload(1, 0, 8),
            [0xc1, 0x5c, 0x02, 0x89, 0xec, 0x2d, 0x0a, 0x91]
        );
    }

    #[test]
    fn payload_depends_on_seed_and_seq() {
        assert_ne!(payload(1, 0, 16), payload(1, 1, 16));
        assert_ne!(payload(1, 0, 16), payload(2, 0, 16));
        assert_eq!(payload(7, 99, 100), payload(7, 99, 100));
    }

    #[test]
    fn verify_accepts_the_payload_and_rejects_any_flip() {
        for size in [0, 1, 7, 8, 9, 100] {
            let mut p = payload(3, 42, size);
            assert!(verify(3, 42, &p));
            if size > 0 {
                p[size / 2] ^= 0x10;
                assert!(!verify(3, 42, &p));
                assert!(!verify(3, 43, &payload(3, 42, size)));
            }
        }
    }
}
