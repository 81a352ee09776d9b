//! Finding where a JSON array or object ends without validating it ("skimming").
//!
//! A cache hit does not need `messages` and `tools` validated: its key is a hash of their exact
//! bytes, which were validated when the entry was stored (see `request::Request::validate`).
//! It only needs to know where they end. This finds that end 64 bytes at a time from four
//! bit masks (quotes, backslashes, opening and closing brackets), in the manner of simdjson's
//! first stage: escaped quotes are dropped, a prefix XOR of the quotes marks the bytes inside
//! strings, and brackets outside strings are counted until the depth returns to zero. Blocks
//! that cannot close the container are counted with two popcounts, not walked.
//!
//! For valid JSON the end is exact (the tests hold it to the validating scanner). For invalid
//! JSON it is some position or `None`; callers validate whatever they did not get from the
//! cache.

const BLOCK: usize = 64;

/// The bit masks of one 64-byte block (bit i = byte i).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Masks {
    quote: u64,
    backslash: u64,
    open: u64,
    close: u64,
}

/// The end (exclusive) of the array or object that opens at `start`, or `None` when
/// `body[start]` opens none or it never closes.
pub fn container_end(body: &[u8], start: usize) -> Option<usize> {
    if !matches!(body.get(start), Some(b'[' | b'{')) {
        return None;
    }
    let rest = body.get(start..)?;
    let mut walk = Walk::default();
    let mut blocks = rest.chunks_exact(BLOCK);
    for (k, block) in blocks.by_ref().enumerate() {
        if let Some(end) = walk.step(classify_block(block)) {
            return Some(start + k * BLOCK + end);
        }
    }
    let tail = blocks.remainder();
    if tail.is_empty() {
        return None;
    }
    // The last, short block, padded with spaces.
    let mut block = [b' '; BLOCK];
    block[..tail.len()].copy_from_slice(tail);
    let end = walk.step(classify_block(&block))?;
    Some(start + (rest.len() - tail.len()) + end)
}

/// What carries from one block to the next.
#[derive(Default)]
struct Walk {
    depth: u64,
    /// All ones when the previous block ended inside a string.
    in_string: u64,
    /// The previous block ended with an unescaped backslash.
    escape_next: bool,
}

impl Walk {
    /// One block: the offset just past the closing bracket when the container ends in it.
    #[inline(always)]
    fn step(&mut self, m: Masks) -> Option<usize> {
        let escaped = escaped(m.backslash, &mut self.escape_next);
        let inside = prefix_xor(m.quote & !escaped) ^ self.in_string;
        self.in_string = ((inside as i64) >> 63) as u64;
        let open = m.open & !inside & !escaped;
        let close = m.close & !inside & !escaped;
        let closes = u64::from(close.count_ones());
        if closes < self.depth {
            // Cannot reach depth zero here: count, do not walk.
            self.depth = self.depth + u64::from(open.count_ones()) - closes;
            return None;
        }
        let mut brackets = open | close;
        while brackets != 0 {
            let bit = brackets & brackets.wrapping_neg();
            if open & bit != 0 {
                self.depth += 1;
            } else {
                // The container's own bracket opened first, so depth is at least 1 here.
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    return Some(bit.trailing_zeros() as usize + 1);
                }
            }
            brackets &= brackets - 1;
        }
        None
    }
}

/// Bits after which every bit is flipped at each set bit: 1 from an opening quote up to (not
/// including) its closing quote.
#[inline(always)]
fn prefix_xor(mut x: u64) -> u64 {
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
    let case = u8x16_splat(0x20); // '[' | 0x20 == '{', ']' | 0x20 == '}'
    Masks {
        quote: bits(&v, |x| u8x16_eq(x, u8x16_splat(b'"'))),
        backslash: bits(&v, |x| u8x16_eq(x, u8x16_splat(b'\\'))),
        open: bits(&v, |x| u8x16_eq(v128_or(x, case), u8x16_splat(b'{'))),
        close: bits(&v, |x| u8x16_eq(v128_or(x, case), u8x16_splat(b'}'))),
    }
}

/// Native builds on x86_64 (tests, fuzzing, the criterion bench): SSE2, which every x86_64
/// CPU has.
#[cfg(target_arch = "x86_64")]
fn classify_block(block: &[u8]) -> Masks {
    use std::arch::x86_64::*;
    let mut m = Masks::default();
    // SAFETY: SSE2 is part of the x86_64 baseline; each `chunk` is 16 readable bytes and
    // `_mm_loadu_si128` needs no alignment.
    unsafe {
        let quote = _mm_set1_epi8(b'"' as i8);
        let backslash = _mm_set1_epi8(b'\\' as i8);
        let case = _mm_set1_epi8(0x20);
        let open = _mm_set1_epi8(b'{' as i8);
        let close = _mm_set1_epi8(b'}' as i8);
        for (k, chunk) in block.chunks_exact(16).take(4).enumerate() {
            let v = _mm_loadu_si128(chunk.as_ptr().cast::<__m128i>());
            let folded = _mm_or_si128(v, case);
            let bits = |x: __m128i| u64::from(_mm_movemask_epi8(x) as u16) << (16 * k);
            m.quote |= bits(_mm_cmpeq_epi8(v, quote));
            m.backslash |= bits(_mm_cmpeq_epi8(v, backslash));
            m.open |= bits(_mm_cmpeq_epi8(folded, open));
            m.close |= bits(_mm_cmpeq_epi8(folded, close));
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::scan::is_json;
    use proptest::prelude::*;

    /// The byte-by-byte meaning of the masks: escapes, strings, depth.
    fn reference_end(body: &[u8], start: usize) -> Option<usize> {
        if !matches!(body.get(start), Some(b'[' | b'{')) {
            return None;
        }
        let (mut depth, mut in_string, mut escape) = (0u64, false, false);
        for (i, &b) in body.iter().enumerate().skip(start) {
            if escape {
                escape = false;
            } else if in_string {
                match b {
                    b'\\' => escape = true,
                    b'"' => in_string = false,
                    _ => {}
                }
            } else {
                match b {
                    b'"' => in_string = true,
                    b'\\' => escape = true,
                    b'[' | b'{' => depth += 1,
                    b']' | b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
            }
        }
        None
    }

    proptest! {
        /// The vector classifier (SSE2 natively, simd128 in wasm) equals the byte loop.
        #[test]
        fn classifiers_agree(block in prop::collection::vec(any::<u8>(), 64)) {
            prop_assert_eq!(classify_block(&block), classify_scalar(&block));
        }
    }

    #[test]
    fn ends() {
        let body = br#"{"a":[1,"]",{"b":"\"}"}],"c":"\\"} tail"#;
        assert_eq!(container_end(body, 0), Some(body.len() - 5));
        assert_eq!(container_end(body, 5), Some(24));
        assert_eq!(container_end(b"[[]", 0), None);
        assert_eq!(container_end(b"x[]", 0), None);
        assert_eq!(container_end(b"[]", 0), Some(2));
    }

    #[test]
    fn escape_runs_across_blocks() {
        // Runs of backslashes ending at every position around the 64-byte edges.
        for pad in 0..140 {
            for run in 0..6 {
                let mut body = b"[\"".to_vec();
                body.extend(std::iter::repeat_n(b'x', pad));
                body.extend(std::iter::repeat_n(b'\\', run));
                body.extend(b"\"]\"]");
                assert_eq!(
                    container_end(&body, 0),
                    reference_end(&body, 0),
                    "pad {pad} run {run}"
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any bytes made of the characters that matter: the same end as byte by byte.
        #[test]
        fn agrees_with_the_byte_walk(
            body in prop::collection::vec(
                prop::sample::select(b"[]{}\"\\ax ".to_vec()), 1..400),
        ) {
            let mut body = body;
            body[0] = b'[';
            prop_assert_eq!(container_end(&body, 0), reference_end(&body, 0));
        }

        /// Valid JSON: exactly where the validating scanner says the value ends.
        #[test]
        fn exact_on_valid_json(
            items in prop::collection::vec(
                prop::sample::select(vec![
                    r#""plain""#, r#""with \"quotes\" and ] } [ {""#, r#""\\\\""#, r#""\\""#,
                    r#"{"k": ["v", 1, {"x": "}"}]}"#, "[]", "{}", "null", "-1.5e3",
                    r#""é漢😀 \u00e9""#, r#""a long string that crosses one 64-byte block boundary at least once, surely""#,
                ]),
                0..30,
            ),
            tail in prop::sample::select(vec!["", " ", ", \"x\": 1}", "]]]"]),
        ) {
            let value = format!("[{}]", items.join(", "));
            prop_assert!(is_json(value.as_bytes()));
            let body = format!("{value}{tail}");
            prop_assert_eq!(container_end(body.as_bytes(), 0), Some(value.len()));
        }
    }
}
