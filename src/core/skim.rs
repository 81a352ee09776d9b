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
    let mut depth: u64 = 0;
    let mut in_string: u64 = 0; // all ones when the previous block ended inside a string
    let mut escape_next = false; // the previous block ended with an unescaped backslash
    let mut pos = start;
    while pos < body.len() {
        let m = classify(&body[pos..]);
        let escaped = escaped(m.backslash, &mut escape_next);
        let inside = prefix_xor(m.quote & !escaped) ^ in_string;
        in_string = ((inside as i64) >> 63) as u64;
        let open = m.open & !inside & !escaped;
        let close = m.close & !inside & !escaped;
        if u64::from(close.count_ones()) < depth {
            depth = depth + u64::from(open.count_ones()) - u64::from(close.count_ones());
        } else {
            let mut brackets = open | close;
            while brackets != 0 {
                let bit = brackets & brackets.wrapping_neg();
                if open & bit != 0 {
                    depth += 1;
                } else {
                    depth = depth.checked_sub(1)?;
                    if depth == 0 {
                        return Some(pos + bit.trailing_zeros() as usize + 1);
                    }
                }
                brackets &= brackets - 1;
            }
        }
        pos += BLOCK;
    }
    None
}

/// Bits after which every bit is flipped at each set bit: 1 from an opening quote up to (not
/// including) its closing quote.
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
/// that is itself escaped escapes nothing). Walks the backslashes only.
fn escaped(backslash: u64, escape_next: &mut bool) -> u64 {
    let mut out = 0u64;
    let mut starts = backslash;
    if std::mem::take(escape_next) {
        out |= 1;
        starts &= !1;
    }
    while starts != 0 {
        let i = starts.trailing_zeros();
        if i == 63 {
            *escape_next = true;
            break;
        }
        let next = 1u64 << (i + 1);
        out |= next;
        starts &= !(1u64 << i) & !next;
    }
    out
}

/// The masks of the first 64 bytes of `bytes` (past its end: as if spaces).
fn classify(bytes: &[u8]) -> Masks {
    match bytes.get(..BLOCK) {
        Some(block) => classify_block(block),
        None => {
            let mut block = [b' '; BLOCK];
            block[..bytes.len()].copy_from_slice(bytes);
            classify_block(&block)
        }
    }
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

#[cfg(all(target_family = "wasm", target_feature = "simd128"))]
fn classify_block(block: &[u8]) -> Masks {
    use core::arch::wasm32::*;
    let quote = u8x16_splat(b'"');
    let backslash = u8x16_splat(b'\\');
    let case = u8x16_splat(0x20); // '[' | 0x20 == '{', ']' | 0x20 == '}'
    let open = u8x16_splat(b'{');
    let close = u8x16_splat(b'}');
    let mut m = Masks::default();
    for (k, chunk) in block.chunks_exact(16).take(4).enumerate() {
        // SAFETY: `chunk` is 16 readable bytes; wasm loads need no alignment.
        let v = unsafe { v128_load(chunk.as_ptr().cast::<v128>()) };
        let folded = v128_or(v, case);
        let shift = 16 * k;
        m.quote |= u64::from(u8x16_bitmask(u8x16_eq(v, quote))) << shift;
        m.backslash |= u64::from(u8x16_bitmask(u8x16_eq(v, backslash))) << shift;
        m.open |= u64::from(u8x16_bitmask(u8x16_eq(folded, open))) << shift;
        m.close |= u64::from(u8x16_bitmask(u8x16_eq(folded, close))) << shift;
    }
    m
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
