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

use crate::json::blocks::{classify, prefix_xor, Masks, Strings, BLOCK};

/// The end (exclusive) of the array or object that opens at `start`, or `None` when
/// `body[start]` opens none or it never closes.
pub fn container_end(body: &[u8], start: usize) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    match wide::level() {
        // SAFETY: the CPU has the features each function is compiled for.
        wide::Level::Avx512 => return unsafe { wide::container_end_avx512(body, start) },
        wide::Level::Avx2 => return unsafe { wide::container_end(body, start) },
        wide::Level::None => {}
    }
    walk(body, start, classify, prefix_xor)
}

/// The skim over blocks classified by `classify`: inlined into each entry point, so that the
/// x86_64 one compiled for AVX2 gets those instructions throughout.
#[inline(always)]
fn walk(
    body: &[u8],
    start: usize,
    classify: impl Fn(&[u8]) -> Masks,
    prefix_xor: impl Fn(u64) -> u64 + Copy,
) -> Option<usize> {
    if !matches!(body.get(start), Some(b'[' | b'{')) {
        return None;
    }
    let rest = body.get(start..)?;
    let mut walk = Walk::default();
    for (k, block) in rest.chunks(BLOCK).enumerate() {
        if let Some(end) = walk.step(&classify(block), prefix_xor) {
            return Some(start + k * BLOCK + end);
        }
    }
    None
}

/// The skim on x86_64 CPUs with AVX2, POPCNT and PCLMULQDQ (nearly all since 2013; the
/// native module runs it, the wasm build never): 32-byte compares, the bracket counts and the
/// strings' prefix XOR in one instruction each instead of the baseline's bit arithmetic. Where
/// the CPU also has AVX-512BW, each block is classified by 64-byte compares straight into
/// masks. `is_x86_feature_detected!` reads the CPU once per process.
#[cfg(target_arch = "x86_64")]
mod wide {
    use super::{walk, Masks};
    use crate::json::blocks::{classify_avx2, classify_avx512, prefix_xor_clmul};

    /// The widest skim this CPU runs.
    pub enum Level {
        Avx512,
        Avx2,
        None,
    }

    pub fn level() -> Level {
        use std::is_x86_feature_detected as has;
        if !(has!("avx2") && has!("popcnt") && has!("pclmulqdq")) {
            Level::None
        } else if has!("avx512f") && has!("avx512bw") {
            Level::Avx512
        } else {
            Level::Avx2
        }
    }

    /// # Safety
    /// The CPU must have AVX2, POPCNT and PCLMULQDQ ([`level`]).
    #[target_feature(enable = "avx2,popcnt,pclmulqdq")]
    pub unsafe fn container_end(body: &[u8], start: usize) -> Option<usize> {
        walk(
            body,
            start,
            |block| -> Masks {
                // SAFETY: this function runs only where AVX2 is available.
                unsafe { classify_avx2(block) }
            },
            |x| {
                // SAFETY: this function runs only where PCLMULQDQ is available.
                unsafe { prefix_xor_clmul(x) }
            },
        )
    }

    /// # Safety
    /// The CPU must have AVX-512F, AVX-512BW, AVX2, POPCNT and PCLMULQDQ ([`level`]).
    #[target_feature(enable = "avx512f,avx512bw,avx2,popcnt,pclmulqdq")]
    pub unsafe fn container_end_avx512(body: &[u8], start: usize) -> Option<usize> {
        walk(
            body,
            start,
            |block| -> Masks {
                // SAFETY: this function runs only where AVX-512BW is available.
                unsafe { classify_avx512(block) }
            },
            |x| {
                // SAFETY: this function runs only where PCLMULQDQ is available.
                unsafe { prefix_xor_clmul(x) }
            },
        )
    }
}

/// What carries from one block to the next.
#[derive(Default)]
struct Walk {
    depth: u64,
    strings: Strings,
}

impl Walk {
    /// One block: the offset just past the closing bracket when the container ends in it.
    #[inline(always)]
    fn step(&mut self, m: &Masks, prefix_xor: impl Fn(u64) -> u64) -> Option<usize> {
        let (escaped, inside) = self.strings.step_with(m, prefix_xor);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::scan::is_json;
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

    /// The end by every skim this CPU runs: the baseline, then AVX2 and AVX-512 where the
    /// CPU has them (the dispatch picks only the widest).
    fn every_level(body: &[u8], start: usize) -> Vec<Option<usize>> {
        #[allow(unused_mut)]
        let mut ends = vec![walk(body, start, classify, prefix_xor)];
        #[cfg(target_arch = "x86_64")]
        {
            use std::is_x86_feature_detected as has;
            if has!("avx2") && has!("popcnt") && has!("pclmulqdq") {
                // SAFETY: the CPU has the features.
                ends.push(unsafe { wide::container_end(body, start) });
                if has!("avx512f") && has!("avx512bw") {
                    // SAFETY: the CPU has the features.
                    ends.push(unsafe { wide::container_end_avx512(body, start) });
                }
            }
        }
        ends
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
                for end in every_level(&body, 0) {
                    assert_eq!(end, reference_end(&body, 0), "pad {pad} run {run}");
                }
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
            // Every level too, wherever a wider one runs.
            for end in every_level(&body, 0) {
                prop_assert_eq!(end, reference_end(&body, 0));
            }
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
            for end in every_level(body.as_bytes(), 0) {
                prop_assert_eq!(end, Some(value.len()));
            }
        }
    }
}
