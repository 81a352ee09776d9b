//! Hashing the long parts of a request (a prompt's `messages`, its tools, one long message)
//! in one call, on the widest vectors the CPU has.
//!
//! The function is XXH3-128 over this crate's own 192-byte secret. The xxhash crate computes
//! it on the vectors it was compiled for: SSE2 in the native module, which must load on any
//! x86_64 CPU. On x86_64 CPUs with AVX2 (chosen at run time, once per process) this module
//! computes the same function 32 bytes at a time, about twice as fast; elsewhere, and for
//! short inputs, it calls the crate. The tests hold the two to the same digests.
//!
//! A key made of many parts takes a long part as its length and digest ([`update_framed`]),
//! a short one as its length and bytes.

use xxhash_rust::xxh3::{xxh3_128_with_secret, Xxh3};

/// Parts longer than this are hashed as their digest.
pub const LONG: usize = 1024;

const SECRET_LEN: usize = 192;

/// The secret: SplitMix64's output from a fixed seed, as XXH3 wants one (random-looking, no
/// repeated runs).
const SECRET: [u8; SECRET_LEN] = secret();

// Evaluated by the compiler: an index out of range fails the build.
#[allow(clippy::indexing_slicing)]
const fn secret() -> [u8; SECRET_LEN] {
    let mut out = [0u8; SECRET_LEN];
    let mut x: u64 = 0x696e_636f_6e74_6578;
    let mut i = 0;
    while i < SECRET_LEN / 8 {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let bytes = z.to_le_bytes();
        let mut j = 0;
        while j < 8 {
            out[i * 8 + j] = bytes[j];
            j += 1;
        }
        i += 1;
    }
    out
}

/// XXH3-128 of `bytes` over [`SECRET`].
pub fn digest(bytes: &[u8]) -> u128 {
    #[cfg(target_arch = "x86_64")]
    if bytes.len() > wide::MIN && wide::available() {
        // SAFETY: the CPU has AVX2, and `bytes` is longer than `wide::MIN`.
        return unsafe { wide::long(&[bytes], bytes.len()) };
    }
    xxh3_128_with_secret(bytes, &SECRET)
}

/// Adds `bytes` to `h` after their length: as they are when short, as their [`digest`] when
/// longer than [`LONG`].
pub fn update_framed(h: &mut Xxh3, bytes: &[u8]) {
    update_framed_with(h, bytes, digest);
}

/// [`update_framed`], a long part's digest taken from `digest_of` (a digest made before,
/// over the same bytes).
pub fn update_framed_with(h: &mut Xxh3, bytes: &[u8], digest_of: impl FnOnce(&[u8]) -> u128) {
    h.update(&(bytes.len() as u64).to_le_bytes());
    if bytes.len() > LONG {
        h.update(&digest_of(bytes).to_le_bytes());
    } else {
        h.update(bytes);
    }
}

/// [`digest`] of the bytes of `parts`, in order, as one run: a part of a body read from the
/// host's own slices, without copying it.
pub fn digest_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> u128 {
    let parts: Vec<&[u8]> = parts.into_iter().collect();
    #[cfg(target_arch = "x86_64")]
    {
        let len = parts.iter().map(|p| p.len()).sum();
        if len > wide::MIN && wide::available() {
            // SAFETY: the CPU has AVX2, and the parts are longer than `wide::MIN` together.
            return unsafe { wide::long(&parts, len) };
        }
    }
    let mut h = Xxh3::with_secret(SECRET);
    for part in parts {
        h.update(part);
    }
    h.digest128()
}

/// XXH3's long-input hash (inputs over 240 bytes), the accumulators in two AVX2 registers.
#[cfg(target_arch = "x86_64")]
mod wide {
    use super::{SECRET, SECRET_LEN};
    use std::arch::x86_64::*;

    /// Inputs up to this long take XXH3's short-input paths, which this does not compute.
    pub const MIN: usize = 240;

    const STRIPE: usize = 64;
    const STRIPES_PER_BLOCK: usize = (SECRET_LEN - STRIPE) / 8;
    const LAST_STRIPE_SECRET: usize = SECRET_LEN - STRIPE - 7;
    const MERGE_SECRET: usize = 11;

    const PRIME32_1: u64 = 0x9E37_79B1;
    const PRIME32_2: u64 = 0x85EB_CA77;
    const PRIME32_3: u64 = 0xC2B2_AE3D;
    const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
    const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
    const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
    const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
    const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;

    pub fn available() -> bool {
        std::is_x86_feature_detected!("avx2")
    }

    /// XXH3-128 of the bytes of `parts`, in order, `len` in all (its long-input path): each
    /// stripe read where it lies, or gathered when it spans two parts.
    ///
    /// # Safety
    /// The CPU must have AVX2, and `len`, the parts' total length, must be over [`MIN`].
    pub unsafe fn long(parts: &[&[u8]], len: usize) -> u128 {
        // SAFETY: the caller's contract.
        let words = unsafe { long_avx2(parts, len) };
        let len = len as u64;
        let low = merge(&words, MERGE_SECRET, len.wrapping_mul(PRIME64_1));
        let high = merge(
            &words,
            SECRET_LEN - STRIPE - MERGE_SECRET,
            !len.wrapping_mul(PRIME64_2),
        );
        u128::from(high) << 64 | u128::from(low)
    }

    const INIT: [u64; 8] = [
        PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1,
    ];

    /// XXH3's long-input loop over `parts` from accumulators `acc`.
    ///
    /// # Safety
    /// As [`long`]; inlined into a function compiled for AVX2.
    #[inline(always)]
    unsafe fn drive(mut acc: Avx2, parts: &[&[u8]], len: usize) -> Avx2 {
        let secret = SECRET.as_ptr();
        // The stripes before the last one, block by block: a block's stripe s takes the
        // secret from 8s, and the accumulators are scrambled after each whole block.
        let stripes = (len - 1) / STRIPE;
        // SAFETY: each stripe read is 64 bytes of a part or of `gathered`; a stripe's secret
        // starts at 8s <= 8*15 and reads 64 bytes (at most 184 <= 192), the scramble's and
        // the last stripe's end at 192 and 185.
        unsafe {
            let stripe = |acc: &mut Avx2, data: *const u8, k: usize| {
                let s = k % STRIPES_PER_BLOCK;
                acc.accumulate(data, secret.add(s * 8));
                if s == STRIPES_PER_BLOCK - 1 {
                    acc.scramble(secret.add(SECRET_LEN - STRIPE));
                }
            };
            let mut gathered = [0u8; STRIPE];
            let mut held = 0;
            let mut k = 0;
            for part in parts {
                let mut rest: &[u8] = part;
                while k < stripes && !rest.is_empty() {
                    if held > 0 || rest.len() < STRIPE {
                        let n = (STRIPE - held).min(rest.len());
                        let (take, after) = rest.split_at(n);
                        if let Some(to) = gathered.get_mut(held..held + n) {
                            to.copy_from_slice(take);
                        }
                        held += n;
                        rest = after;
                        if held == STRIPE {
                            stripe(&mut acc, gathered.as_ptr(), k);
                            k += 1;
                            held = 0;
                        }
                    } else {
                        let whole = (rest.len() / STRIPE).min(stripes - k);
                        for j in 0..whole {
                            stripe(&mut acc, rest.as_ptr().add(j * STRIPE), k);
                            k += 1;
                        }
                        rest = rest.get(whole * STRIPE..).unwrap_or_default();
                    }
                }
            }
            // The last stripe: the last 64 bytes.
            let mut last = [0u8; STRIPE];
            let mut need = STRIPE;
            for part in parts.iter().rev() {
                let n = need.min(part.len());
                if let (Some(to), Some(from)) =
                    (last.get_mut(need - n..need), part.get(part.len() - n..))
                {
                    to.copy_from_slice(from);
                }
                need -= n;
                if need == 0 {
                    break;
                }
            }
            acc.accumulate(last.as_ptr(), secret.add(LAST_STRIPE_SECRET));
        }
        acc
    }

    /// The accumulators, in two AVX2 registers.
    #[derive(Clone, Copy)]
    struct Avx2([__m256i; 2]);

    impl Avx2 {
        /// One 64-byte stripe into the accumulators.
        ///
        /// # Safety
        /// AVX2; `data` and `key` have 64 readable bytes.
        #[inline(always)]
        unsafe fn accumulate(&mut self, data: *const u8, key: *const u8) {
            for (i, a) in self.0.iter_mut().enumerate() {
                // SAFETY: the caller's contract.
                unsafe {
                    let d = _mm256_loadu_si256(data.add(32 * i).cast());
                    let k = _mm256_loadu_si256(key.add(32 * i).cast());
                    let dk = _mm256_xor_si256(d, k);
                    // Each lane's low 32 bits times its high 32 bits.
                    let product = _mm256_mul_epu32(dk, _mm256_shuffle_epi32(dk, 0x31));
                    // The data added to the neighbouring lane.
                    let swapped = _mm256_shuffle_epi32(d, 0x4E);
                    *a = _mm256_add_epi64(product, _mm256_add_epi64(*a, swapped));
                }
            }
        }

        /// The accumulators scrambled after each block.
        ///
        /// # Safety
        /// AVX2; `key` has 64 readable bytes.
        #[inline(always)]
        unsafe fn scramble(&mut self, key: *const u8) {
            // SAFETY: the caller's contract.
            unsafe {
                let prime = _mm256_set1_epi32(PRIME32_1 as i32);
                for (i, a) in self.0.iter_mut().enumerate() {
                    let k = _mm256_loadu_si256(key.add(32 * i).cast());
                    let x = _mm256_xor_si256(_mm256_xor_si256(*a, _mm256_srli_epi64(*a, 47)), k);
                    // x * PRIME32_1 in 64-bit lanes, from two 32x32 products.
                    let low = _mm256_mul_epu32(x, prime);
                    let high = _mm256_mul_epu32(_mm256_shuffle_epi32(x, 0x31), prime);
                    *a = _mm256_add_epi64(low, _mm256_slli_epi64(high, 32));
                }
            }
        }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn long_avx2(parts: &[&[u8]], len: usize) -> [u64; 8] {
        let mut words = [0u64; 8];
        // SAFETY: the caller's contract; the stores write `words`' 64 bytes.
        unsafe {
            let init = Avx2([
                _mm256_loadu_si256(INIT.as_ptr().cast()),
                _mm256_loadu_si256(INIT.as_ptr().add(4).cast()),
            ]);
            let Avx2([a, b]) = drive(init, parts, len);
            _mm256_storeu_si256(words.as_mut_ptr().cast(), a);
            _mm256_storeu_si256(words.as_mut_ptr().add(4).cast(), b);
        }
        words
    }

    fn secret_word(at: usize) -> u64 {
        SECRET
            .get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    }

    /// The accumulators folded into 64 bits, with the secret from `at`.
    fn merge(words: &[u64; 8], at: usize, start: u64) -> u64 {
        let mut h = start;
        for (i, pair) in words.chunks_exact(2).enumerate() {
            if let [a, b] = pair {
                let a = a ^ secret_word(at + 16 * i);
                let b = b ^ secret_word(at + 16 * i + 8);
                let product = u128::from(a) * u128::from(b);
                h = h.wrapping_add(product as u64 ^ (product >> 64) as u64);
            }
        }
        h ^= h >> 37;
        h = h.wrapping_mul(0x1656_6791_9E37_79F9);
        h ^ (h >> 32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Deterministic bytes of every value.
    fn bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed;
        (0..len)
            .map(|_| {
                x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (x >> 56) as u8
            })
            .collect()
    }

    #[test]
    fn the_secret_is_not_degenerate() {
        let distinct: std::collections::BTreeSet<u8> = SECRET.iter().copied().collect();
        assert!(distinct.len() > 100, "{} distinct bytes", distinct.len());
    }

    /// Lengths on every edge of the long path: one stripe past the short paths, a block, a
    /// block and a stripe, multiples of a stripe, and a 400 KB prompt.
    #[test]
    fn the_digest_is_the_crates_at_every_edge() {
        let lengths = [
            0, 1, 240, 241, 255, 256, 257, 1023, 1024, 1025, 1087, 1088, 1089, 2048, 2049, 4096,
            16_384, 16_448, 409_600, 409_601,
        ];
        for (seed, len) in lengths.into_iter().enumerate() {
            let input = bytes(len, seed as u64);
            let want = xxh3_128_with_secret(&input, &SECRET);
            assert_eq!(digest(&input), want, "length {len}");
            #[cfg(target_arch = "x86_64")]
            if len > wide::MIN && wide::available() {
                // SAFETY: the CPU has AVX2; the input is long enough.
                assert_eq!(unsafe { wide::long(&[&input], len) }, want, "length {len}");
            }
        }
    }

    #[test]
    fn framing_keeps_parts_apart() {
        let long = bytes(LONG + 1, 7);
        let framed = |parts: &[&[u8]]| {
            let mut h = Xxh3::new();
            for p in parts {
                update_framed(&mut h, p);
            }
            h.digest128()
        };
        assert_ne!(framed(&[b"ab", b"c"]), framed(&[b"a", b"bc"]));
        assert_ne!(framed(&[&long]), framed(&[&long[..LONG]]));
        let mut flipped = long.clone();
        if let Some(b) = flipped.last_mut() {
            *b ^= 1;
        }
        assert_ne!(framed(&[&long]), framed(&[&flipped]));
        assert_eq!(framed(&[&long, b"x"]), framed(&[&long.clone(), b"x"]));
    }

    /// A 400 KB run cut into slices of every size Envoy might hand out (one byte, a stripe, a
    /// block, 16 KB, odd sizes), and into one and into none.
    #[test]
    fn a_run_in_slices_digests_as_one() {
        let input = bytes(409_600, 3);
        let want = digest(&input);
        for size in [1, 63, 64, 65, 1024, 1087, 4096, 16_384, 16_385, 409_600] {
            let parts = input.chunks(size);
            assert_eq!(digest_parts(parts), want, "slices of {size}");
        }
        #[cfg(target_arch = "x86_64")]
        if wide::available() {
            for len in [
                241, 255, 256, 1023, 1024, 1025, 1087, 1088, 1089, 16_448, 409_600,
            ] {
                let input = bytes(len, len as u64);
                let want = xxh3_128_with_secret(&input, &SECRET);
                for size in [1, 7, 63, 64, 65, 200, 1024, 1025, len] {
                    let parts: Vec<&[u8]> = input.chunks(size).collect();
                    // SAFETY: the CPU has AVX2; the input is long enough.
                    let got = unsafe { wide::long(&parts, len) };
                    assert_eq!(got, want, "length {len}, slices of {size}");
                }
            }
        }
        let empty: [&[u8]; 3] = [b"", &input, b""];
        assert_eq!(digest_parts(empty), want);
        assert_eq!(digest_parts(std::iter::empty()), digest(b""));
    }

    proptest! {
        #[test]
        fn the_digest_is_the_crates(input in prop::collection::vec(any::<u8>(), 0..5000)) {
            prop_assert_eq!(digest(&input), xxh3_128_with_secret(&input, &SECRET));
        }

        #[test]
        fn a_run_cut_anywhere_digests_as_one(
            input in prop::collection::vec(any::<u8>(), 0..5000),
            cuts in prop::collection::vec(any::<usize>(), 0..6),
        ) {
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
            cuts.sort_unstable();
            let mut at = 0;
            let mut parts = Vec::new();
            for c in cuts.into_iter().chain([input.len()]) {
                parts.push(&input[at..c]);
                at = c;
            }
            prop_assert_eq!(digest_parts(parts), digest(&input));
        }
    }
}
