//! Whether a byte string occurs in a text, 16 positions at a time with wasm `simd128`: a
//! position is a candidate when both the needle's first and last byte match there (as in
//! Wojciech Muła's "SIMD-friendly algorithms for substring searching"), and candidates are
//! compared in full. `str::contains` has no vector path in wasm and ran at about 1 GB/s.

/// Whether `needle` occurs in `hay`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    if needle.is_empty() {
        return true;
    }
    let vector_end = vector_prefix(hay, needle);
    if let Some(found) = vector_end.found {
        return found;
    }
    // The positions the vector loop did not reach.
    hay.get(vector_end.next..)
        .is_some_and(|rest| rest.windows(needle.len()).any(|w| w == needle))
}

/// How far the vector loop got: `found` when it decided, else the first position it did not
/// examine.
struct Vectored {
    found: Option<bool>,
    next: usize,
}

#[cfg(all(target_family = "wasm", target_feature = "simd128"))]
fn vector_prefix(hay: &[u8], needle: &[u8]) -> Vectored {
    use core::arch::wasm32::*;
    let last = needle.len() - 1;
    let (first_byte, last_byte) = (u8x16_splat(needle[0]), u8x16_splat(needle[last]));
    let mut i = 0;
    // Both 16-byte loads (at i and at i + last) stay inside `hay`.
    while i + last + 16 <= hay.len() {
        // SAFETY: `i + 16 <= hay.len()` and `i + last + 16 <= hay.len()`; wasm loads need no
        // alignment.
        let (a, b) = unsafe {
            let p = hay.as_ptr();
            (
                v128_load(p.add(i).cast::<v128>()),
                v128_load(p.add(i + last).cast::<v128>()),
            )
        };
        let mut candidates =
            u8x16_bitmask(v128_and(u8x16_eq(a, first_byte), u8x16_eq(b, last_byte)));
        while candidates != 0 {
            let at = i + candidates.trailing_zeros() as usize;
            if hay.get(at..at + needle.len()) == Some(needle) {
                return Vectored {
                    found: Some(true),
                    next: at,
                };
            }
            candidates &= candidates - 1;
        }
        i += 16;
    }
    Vectored {
        found: None,
        next: i,
    }
}

#[cfg(not(all(target_family = "wasm", target_feature = "simd128")))]
fn vector_prefix(_hay: &[u8], _needle: &[u8]) -> Vectored {
    Vectored {
        found: None,
        next: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn finds_and_misses() {
        let text = b"x".repeat(100);
        assert!(!contains(&text, b"reasoning_content"));
        for at in [0, 1, 15, 16, 17, 40, 83] {
            let mut t = text.clone();
            t[at..at + 17].copy_from_slice(b"reasoning_content");
            assert!(contains(&t, b"reasoning_content"), "at {at}");
        }
        assert!(contains(b"", b""));
        assert!(!contains(b"abc", b"abcd"));
        assert!(contains(b"abcd", b"d"));
    }

    proptest! {
        #[test]
        fn agrees_with_windows(
            hay in prop::collection::vec(prop::sample::select(b"ab".to_vec()), 0..200),
            needle in prop::collection::vec(prop::sample::select(b"ab".to_vec()), 1..6),
        ) {
            prop_assert_eq!(contains(&hay, &needle), hay.windows(needle.len()).any(|w| w == needle.as_slice()));
        }
    }
}
