//! JSON text 64 bytes at a time, in the manner of simdjson's first stage: one bit mask per
//! byte class (bit i = byte i of the block), then which bytes are escaped and which lie inside
//! strings, from the masks alone. The skim (`skim.rs`) and the compactor (`compact.rs`) walk
//! blocks with this.
//!
//! The classifier is inlined into each walker, so the masks a walker does not read are never
//! computed.

pub const BLOCK: usize = 64;

/// The bit masks of one 64-byte block (bit i = byte i).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Masks {
    pub quote: u64,
    pub backslash: u64,
    /// `[` and `{`.
    pub open: u64,
    /// `]` and `}`.
    pub close: u64,
    /// Bytes up to 0x20: in valid JSON, outside strings, exactly the white space (space,
    /// tab, line feed, carriage return); inside strings only the space is raw.
    pub space: u64,
}

/// The masks of `block`'s first 64 bytes; past its end, as if spaces.
#[inline(always)]
pub fn classify(block: &[u8]) -> Masks {
    match block.get(..BLOCK) {
        Some(full) => classify_block(full),
        None => {
            let mut padded = [b' '; BLOCK];
            for (p, b) in padded.iter_mut().zip(block) {
                *p = *b;
            }
            classify_block(&padded)
        }
    }
}

/// What carries from one block to the next: inside a string or not, and a pending escape.
#[derive(Debug, Default)]
pub struct Strings {
    /// All ones when the previous block ended inside a string.
    in_string: u64,
    /// The previous block ended with an unescaped backslash.
    escape_next: bool,
}

impl Strings {
    /// Whether the text so far ends inside a string.
    pub fn in_string(&self) -> bool {
        self.in_string != 0
    }

    /// The escaped bytes of this block, and the bytes inside strings (from an opening quote
    /// up to, not including, its closing quote).
    #[inline(always)]
    pub fn step(&mut self, m: &Masks) -> (u64, u64) {
        self.step_with(m, prefix_xor)
    }

    /// [`Strings::step`] with another computation of [`prefix_xor`] (a carry-less multiply).
    #[inline(always)]
    pub fn step_with(&mut self, m: &Masks, prefix_xor: impl Fn(u64) -> u64) -> (u64, u64) {
        let escaped = escaped(m.backslash, &mut self.escape_next);
        let inside = prefix_xor(m.quote & !escaped) ^ self.in_string;
        self.in_string = ((inside as i64) >> 63) as u64;
        (escaped, inside)
    }
}

/// Bits after which every bit is flipped at each set bit.
#[inline(always)]
pub fn prefix_xor(mut x: u64) -> u64 {
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    x ^= x << 32;
    x
}

/// The bytes escaped by a backslash (the byte right after an escaping backslash; a backslash
/// that is itself escaped escapes nothing). Branch-free, as in simdjson: a run of backslashes
/// escapes the byte after it when its length is odd, told by where the run starts (odd or
/// even position) and an addition that carries through the run.
#[inline(always)]
fn escaped(backslash: u64, escape_next: &mut bool) -> u64 {
    const EVEN: u64 = 0x5555_5555_5555_5555;
    let carried = u64::from(*escape_next);
    let backslash = backslash & !carried;
    let follows_escape = (backslash << 1) | carried;
    let odd_starts = backslash & !EVEN & !follows_escape;
    let (even_runs, overflow) = odd_starts.overflowing_add(backslash);
    *escape_next = overflow;
    let invert = even_runs << 1;
    (EVEN ^ invert) & follows_escape
}

#[cfg(not(any(
    all(target_family = "wasm", target_feature = "simd128"),
    target_arch = "x86_64"
)))]
#[inline(always)]
fn classify_block(block: &[u8]) -> Masks {
    classify_scalar(block)
}

/// The byte loop: the fallback, and the reference the vector classifiers are tested against.
#[cfg_attr(
    any(
        all(target_family = "wasm", target_feature = "simd128"),
        target_arch = "x86_64"
    ),
    allow(dead_code)
)]
fn classify_scalar(block: &[u8]) -> Masks {
    let mut m = Masks::default();
    for (i, &b) in block.iter().take(BLOCK).enumerate() {
        let bit = 1u64 << i;
        match b {
            b'"' => m.quote |= bit,
            b'\\' => m.backslash |= bit,
            b'[' | b'{' => m.open |= bit,
            b']' | b'}' => m.close |= bit,
            0..=b' ' => m.space |= bit,
            _ => {}
        }
    }
    m
}

/// wasm `simd128`: four 16-byte loads, each compared and reduced to 16 mask bits. Written out
/// (not a loop over chunks) so that the size-optimised build keeps it unrolled and inlined:
/// the loop form ran at half the speed in V8.
#[cfg(all(target_family = "wasm", target_feature = "simd128"))]
#[inline(always)]
fn classify_block(block: &[u8]) -> Masks {
    use core::arch::wasm32::*;
    #[inline(always)]
    fn bits(v: &[v128; 4], f: impl Fn(v128) -> v128) -> u64 {
        u64::from(u8x16_bitmask(f(v[0])))
            | u64::from(u8x16_bitmask(f(v[1]))) << 16
            | u64::from(u8x16_bitmask(f(v[2]))) << 32
            | u64::from(u8x16_bitmask(f(v[3]))) << 48
    }
    let Some(block) = block.get(..BLOCK) else {
        return classify_scalar(block);
    };
    let p = block.as_ptr().cast::<v128>();
    // SAFETY: `block` is 64 readable bytes, four v128; wasm loads need no alignment.
    let v = unsafe {
        [
            v128_load(p),
            v128_load(p.add(1)),
            v128_load(p.add(2)),
            v128_load(p.add(3)),
        ]
    };
    let eq = |x, b| u8x16_eq(x, u8x16_splat(b));
    let case = u8x16_splat(0x20); // '[' | 0x20 == '{', ']' | 0x20 == '}'
    Masks {
        quote: bits(&v, |x| eq(x, b'"')),
        backslash: bits(&v, |x| eq(x, b'\\')),
        open: bits(&v, |x| eq(v128_or(x, case), b'{')),
        close: bits(&v, |x| eq(v128_or(x, case), b'}')),
        space: bits(&v, |x| u8x16_le(x, u8x16_splat(b' '))),
    }
}

/// Native builds on x86_64 (tests, fuzzing, the criterion bench): SSE2, which every x86_64
/// CPU has.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn classify_block(block: &[u8]) -> Masks {
    use std::arch::x86_64::*;
    #[inline(always)]
    fn bits(v: &[__m128i; 4], f: impl Fn(__m128i) -> __m128i) -> u64 {
        // SAFETY: SSE2 is part of the x86_64 baseline.
        let mask = |x| u64::from(unsafe { _mm_movemask_epi8(f(x)) } as u16);
        mask(v[0]) | mask(v[1]) << 16 | mask(v[2]) << 32 | mask(v[3]) << 48
    }
    let Some(block) = block.get(..BLOCK) else {
        return classify_scalar(block);
    };
    // SAFETY: SSE2 is part of the x86_64 baseline; `block` is 64 readable bytes and
    // `_mm_loadu_si128` needs no alignment.
    unsafe {
        let p = block.as_ptr().cast::<__m128i>();
        let v = [
            _mm_loadu_si128(p),
            _mm_loadu_si128(p.add(1)),
            _mm_loadu_si128(p.add(2)),
            _mm_loadu_si128(p.add(3)),
        ];
        let eq = |x, b: u8| _mm_cmpeq_epi8(x, _mm_set1_epi8(b as i8));
        let case = _mm_set1_epi8(0x20);
        Masks {
            quote: bits(&v, |x| eq(x, b'"')),
            backslash: bits(&v, |x| eq(x, b'\\')),
            open: bits(&v, |x| eq(_mm_or_si128(x, case), b'{')),
            close: bits(&v, |x| eq(_mm_or_si128(x, case), b'}')),
            // x <= 0x20 as min(x, 0x20) == x.
            space: bits(&v, |x| {
                _mm_cmpeq_epi8(_mm_min_epu8(x, _mm_set1_epi8(0x20)), x)
            }),
        }
    }
}

/// [`prefix_xor`] as one carry-less multiply by all ones.
///
/// # Safety
/// The CPU must have PCLMULQDQ.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "pclmulqdq")]
#[inline]
pub unsafe fn prefix_xor_clmul(x: u64) -> u64 {
    use std::arch::x86_64::*;
    // PCLMULQDQ is enabled here (the caller's contract); SSE2 is baseline.
    let product = _mm_clmulepi64_si128(_mm_set_epi64x(0, x as i64), _mm_set1_epi8(-1), 0);
    _mm_cvtsi128_si64(product) as u64
}

/// x86_64 with AVX2: two 32-byte loads per block. The caller must have checked that the CPU
/// has AVX2 (`skim`'s dispatch); blocks shorter than 64 bytes take the byte loop.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub unsafe fn classify_avx2(block: &[u8]) -> Masks {
    use std::arch::x86_64::*;
    #[inline(always)]
    fn bits(v: &[__m256i; 2], f: impl Fn(__m256i) -> __m256i) -> u64 {
        // SAFETY: the enclosing function runs only where AVX2 is available.
        let mask = |x| u64::from(unsafe { _mm256_movemask_epi8(f(x)) } as u32);
        mask(v[0]) | mask(v[1]) << 32
    }
    let Some(block) = block.get(..BLOCK) else {
        return classify_scalar(block);
    };
    // SAFETY: AVX2 is available (the caller's contract); `block` is 64 readable bytes and
    // `_mm256_loadu_si256` needs no alignment.
    unsafe {
        let p = block.as_ptr().cast::<__m256i>();
        let v = [_mm256_loadu_si256(p), _mm256_loadu_si256(p.add(1))];
        let eq = |x, b: u8| _mm256_cmpeq_epi8(x, _mm256_set1_epi8(b as i8));
        let case = _mm256_set1_epi8(0x20);
        Masks {
            quote: bits(&v, |x| eq(x, b'"')),
            backslash: bits(&v, |x| eq(x, b'\\')),
            open: bits(&v, |x| eq(_mm256_or_si256(x, case), b'{')),
            close: bits(&v, |x| eq(_mm256_or_si256(x, case), b'}')),
            space: bits(&v, |x| {
                _mm256_cmpeq_epi8(_mm256_min_epu8(x, _mm256_set1_epi8(0x20)), x)
            }),
        }
    }
}

/// x86_64 with AVX-512BW: one 64-byte load per block, each class compared straight into a
/// 64-bit mask register. The caller must have checked that the CPU has AVX-512BW (`skim`'s
/// dispatch); blocks shorter than 64 bytes take the byte loop.
///
/// # Safety
/// The CPU must have AVX-512F and AVX-512BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
pub unsafe fn classify_avx512(block: &[u8]) -> Masks {
    use std::arch::x86_64::*;
    let Some(block) = block.get(..BLOCK) else {
        return classify_scalar(block);
    };
    // SAFETY: AVX-512F/BW are available (the caller's contract); `block` is 64 readable bytes
    // and `_mm512_loadu_si512` needs no alignment.
    unsafe {
        let v = _mm512_loadu_si512(block.as_ptr().cast());
        let eq = |x, b: u8| _mm512_cmpeq_epi8_mask(x, _mm512_set1_epi8(b as i8));
        let folded = _mm512_or_si512(v, _mm512_set1_epi8(0x20));
        Masks {
            quote: eq(v, b'"'),
            backslash: eq(v, b'\\'),
            open: eq(folded, b'{'),
            close: eq(folded, b'}'),
            space: _mm512_cmple_epu8_mask(v, _mm512_set1_epi8(0x20)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Byte by byte: escaped bytes and bytes inside strings.
    fn reference(text: &[u8]) -> (Vec<bool>, Vec<bool>) {
        let (mut escaped, mut inside) = (vec![false; text.len()], vec![false; text.len()]);
        let (mut in_string, mut escape) = (false, false);
        for (i, &b) in text.iter().enumerate() {
            inside[i] = in_string;
            if escape {
                escaped[i] = true;
                escape = false;
            } else if b == b'\\' {
                escape = true;
            } else if b == b'"' {
                in_string = !in_string;
                inside[i] = in_string;
            }
        }
        (escaped, inside)
    }

    proptest! {
        /// The vector classifier (SSE2 natively, simd128 in wasm) equals the byte loop.
        #[test]
        fn classifiers_agree(block in prop::collection::vec(any::<u8>(), 64)) {
            prop_assert_eq!(classify_block(&block), classify_scalar(&block));
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2.
                prop_assert_eq!(unsafe { classify_avx2(&block) }, classify_scalar(&block));
            }
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx512bw") {
                // SAFETY: the CPU has AVX-512BW (and so AVX-512F).
                prop_assert_eq!(unsafe { classify_avx512(&block) }, classify_scalar(&block));
            }
        }

        /// The carry-less multiply computes the same prefix XOR as the shifts.
        #[cfg(target_arch = "x86_64")]
        #[test]
        fn prefix_xors_agree(x in any::<u64>()) {
            if std::is_x86_feature_detected!("pclmulqdq") {
                // SAFETY: the CPU has PCLMULQDQ.
                prop_assert_eq!(unsafe { prefix_xor_clmul(x) }, prefix_xor(x));
            }
        }

        /// Escapes and strings across blocks agree with the byte walk.
        #[test]
        fn strings_agree_with_the_byte_walk(
            text in prop::collection::vec(prop::sample::select(b"\"\\ax".to_vec()), 0..300),
        ) {
            let (escaped, inside) = reference(&text);
            let mut strings = Strings::default();
            for (k, chunk) in text.chunks(BLOCK).enumerate() {
                let (e, s) = strings.step(&classify(chunk));
                for i in 0..chunk.len() {
                    let at = k * BLOCK + i;
                    prop_assert_eq!(e >> i & 1 == 1, escaped[at], "escaped at {}", at);
                    prop_assert_eq!(s >> i & 1 == 1, inside[at], "inside at {}", at);
                }
            }
        }
    }
}
