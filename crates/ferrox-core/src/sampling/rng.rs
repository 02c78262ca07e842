//! The sampler's random stream: xoshiro256** seeded through splitmix64.
//!
//! Ours rather than `rand`'s because "same seed, same tokens" is a promise to
//! users that must outlive dependency upgrades: `rand`'s `SmallRng` is
//! documented as free to change algorithm between versions and platforms.
//! Both algorithms are Vigna's public-domain reference (prng.di.unimi.it);
//! the tests pin their first outputs against values computed independently.

use std::hash::{BuildHasher, Hasher};

/// splitmix64: expands one `u64` seed into well-mixed state words.
pub(crate) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// xoshiro256**: 256 bits of state, period 2^256 - 1.
#[derive(Clone, Debug)]
pub(crate) struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    /// Four splitmix64 outputs never make the all-zero state xoshiro must avoid.
    pub(crate) fn from_seed(seed: u64) -> Self {
        let mut sm = seed;
        Xoshiro256 {
            s: [
                splitmix64(&mut sm),
                splitmix64(&mut sm),
                splitmix64(&mut sm),
                splitmix64(&mut sm),
            ],
        }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform on [0, 1) with 53 random bits.
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A seed nobody chose: std's `RandomState` keys come from the OS's random
/// source; the clock separates samplers made on one thread.
pub(crate) fn os_seed() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(nanos);
    h.finish()
}
