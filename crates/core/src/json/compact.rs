//! JSON values in compact form, as the `/tokenize` payload needs them (docs/spec.md §5): no white
//! space outside strings, and strings as Python's `json.dumps(ensure_ascii=False)` writes them.
//!
//! Most text has no `\u` or `\/` escape. It is compacted 64 bytes at a time from the block
//! masks (`blocks.rs`): white space outside strings is dropped, every other byte copied in
//! runs. Around a block that holds such an escape the byte loop takes over, decoding and
//! rewriting the strings that hold one, and hands back to the blocks after it.

use crate::json::blocks::{classify, Strings, BLOCK};

/// Appends `raw` (valid JSON) in compact form: no white space outside strings. Strings are
/// copied as they are unless they hold a `\u` or `\/` escape: those are decoded and written
/// again (non-ASCII as raw UTF-8), as Python's `json.dumps(ensure_ascii=False)` would; the
/// other escapes (`\n`, `\"`, `\\` …) are written the same way by both. `None` when a string
/// never ends or holds a lone surrogate.
///
/// Block by block; a block that holds such an escape is done again by the byte loop, from
/// the last point before it that lies outside a string, up to the first point after it that
/// does, and the blocks go on from there.
pub fn compact(raw: &str, out: &mut Vec<u8>) -> Option<()> {
    let bytes = raw.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        match compact_blocks(bytes.get(at..)?, out) {
            Blocks::Done { in_string } => return (!in_string).then_some(()),
            Blocks::Normalise {
                from,
                written,
                block_end,
            } => {
                out.truncate(written);
                at = normalise_until(raw, at + from, at + block_end, out)?;
            }
        }
    }
    Some(())
}

/// How [`compact_blocks`] stopped.
enum Blocks {
    /// All of it is written; whether it ended inside a string (then it is not valid JSON).
    Done { in_string: bool },
    /// A block up to `block_end` holds an escape to normalise. `from` (before it, outside any
    /// string) is where to go on from, and `written` the length of `out` that stays.
    Normalise {
        from: usize,
        written: usize,
        block_end: usize,
    },
}

/// Appends `raw` without white space outside strings, 64 bytes at a time, until a block
/// holds a `\u` or `\/` escape.
fn compact_blocks(raw: &[u8], out: &mut Vec<u8>) -> Blocks {
    // Never longer than `raw`; the slack lets every run be copied as one fixed 64-byte move.
    out.reserve(raw.len() + BLOCK);
    let base = out.len();
    let mut written = 0;
    let mut strings = Strings::default();
    // The last point outside a string, and `written` there: where the byte loop can start.
    let mut outside = (0, 0);
    for (k, block) in raw.chunks(BLOCK).enumerate() {
        if !strings.in_string() {
            outside = (k * BLOCK, written);
        }
        let m = classify(block);
        let (escaped, inside) = strings.step(&m);
        if escaped != 0 && writes_differently(block, escaped) {
            // SAFETY: the first `written` spare bytes were written below, in order.
            unsafe { out.set_len(base + written) };
            return Blocks::Normalise {
                from: outside.0,
                written: base + outside.1,
                block_end: k * BLOCK + block.len(),
            };
        }
        let valid = u64::MAX >> (BLOCK - block.len());
        let mut keep = !(m.space & !inside) & valid;
        if strings.in_string() {
            // The string open at the end of this block: its opening quote, if in this block,
            // is the last point before it outside a string.
            let opening = m.quote & !escaped & inside;
            if opening != 0 {
                let bit = 63 - opening.leading_zeros();
                let before = keep & ((1u64 << bit) - 1);
                outside = (
                    k * BLOCK + bit as usize,
                    written + before.count_ones() as usize,
                );
            }
        }
        while keep != 0 {
            let start = keep.trailing_zeros();
            let run = (!(keep >> start)).trailing_zeros().min(64 - start);
            let from = k * BLOCK + start as usize;
            let len = run as usize;
            debug_assert!(written + BLOCK <= out.capacity() - base && from + len <= raw.len());
            // SAFETY: `out` has room for `raw.len() + BLOCK` bytes after `base` and `written`
            // never exceeds `raw.len()`, so 64 bytes fit at `base + written`. The source is
            // inside `raw`: 64 bytes when they fit, else exactly the run. A fixed 64-byte move
            // compiles to a few vector loads and stores; the bytes past the run are
            // overwritten by the next run or lie past the final length.
            unsafe {
                let src = raw.as_ptr().add(from);
                let dst = out.as_mut_ptr().add(base + written);
                if from + BLOCK <= raw.len() {
                    copy_block(src, dst);
                } else {
                    std::ptr::copy_nonoverlapping(src, dst, len);
                }
            }
            written += len;
            keep &= !((u64::MAX >> (64 - run)) << start);
        }
    }
    // SAFETY: the first `written` spare bytes were written just above, in order.
    unsafe { out.set_len(base + written) };
    Blocks::Done {
        in_string: strings.in_string(),
    }
}

/// Copies 64 bytes. In wasm as four vector loads and stores: a `memory.copy` (what a fixed
/// `copy_nonoverlapping` compiles to there) is a call out of the module in V8.
///
/// # Safety
/// `src` must be readable and `dst` writable for 64 bytes, not overlapping.
#[inline(always)]
unsafe fn copy_block(src: *const u8, dst: *mut u8) {
    #[cfg(all(target_family = "wasm", target_feature = "simd128"))]
    {
        use core::arch::wasm32::*;
        let (s, d) = (src.cast::<v128>(), dst.cast::<v128>());
        for k in 0..4 {
            v128_store(d.add(k), v128_load(s.add(k)));
        }
    }
    #[cfg(not(all(target_family = "wasm", target_feature = "simd128")))]
    std::ptr::copy_nonoverlapping(src, dst, BLOCK);
}

/// Whether an escaped byte of `block` is `u` or `/` (an escape Python writes differently).
fn writes_differently(block: &[u8], mut escaped: u64) -> bool {
    while escaped != 0 {
        let i = escaped.trailing_zeros() as usize;
        if matches!(block.get(i), Some(b'u' | b'/')) {
            return true;
        }
        escaped &= escaped - 1;
    }
    false
}

/// The byte loop of [`compact`]: from `from` (outside any string) to the first point at or
/// after `min_end` that lies outside a string (or the end), which it returns.
fn normalise_until(raw: &str, from: usize, min_end: usize, out: &mut Vec<u8>) -> Option<usize> {
    let bytes = raw.as_bytes();
    let mut i = from;
    let mut run = from; // start of the bytes not yet copied
                        // At the top of the loop `i` is never inside a string.
    while i < min_end {
        let Some(&b) = bytes.get(i) else {
            break;
        };
        match b {
            b' ' | b'\t' | b'\n' | b'\r' => {
                out.extend_from_slice(bytes.get(run..i)?);
                i += 1;
                run = i;
            }
            b'"' => {
                let (end, normalise) = string_end(bytes, i)?;
                if normalise {
                    out.extend_from_slice(bytes.get(run..i)?);
                    write_string(raw.get(i..end)?, out)?;
                    run = end;
                }
                i = end;
            }
            _ => i += 1,
        }
    }
    out.extend_from_slice(bytes.get(run..i)?);
    Some(i)
}

/// The index just past the closing quote of the string starting at `start`, and whether
/// the string holds an escape that Python would write differently (`\u`, `\/`).
fn string_end(bytes: &[u8], start: usize) -> Option<(usize, bool)> {
    let mut normalise = false;
    let mut i = start + 1;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'\\' => {
                normalise |= matches!(bytes.get(i + 1), Some(b'u' | b'/'));
                i += 2;
            }
            b'"' => return Some((i + 1, normalise)),
            _ => i += 1,
        }
    }
    None
}

/// Writes one JSON string token (with its quotes, valid JSON) as serde_json writes the string
/// it decodes to, which is how Python's `json.dumps(ensure_ascii=False)` writes it: `\u` escapes
/// become the character itself (a surrogate pair one character), except `"`, `\` and control
/// characters, which stay escaped in their short form or as `\u00xx`; `\/` becomes `/`; the
/// other escapes are already in that form. `None` for a lone surrogate (serde_json refuses it).
pub fn write_string(token: &str, out: &mut Vec<u8>) -> Option<()> {
    let bytes = token.as_bytes();
    let inner = bytes.get(1..bytes.len().checked_sub(1)?)?;
    out.push(b'"');
    let mut run = 0; // start of the bytes not yet copied
    let mut i = 0;
    while let Some(at) = inner.get(i..)?.iter().position(|&b| b == b'\\') {
        i += at;
        out.extend_from_slice(inner.get(run..i)?);
        match inner.get(i + 1)? {
            b'u' => {
                let (c, used) = unicode_escape(inner, i)?;
                write_char(c, out);
                i += used;
            }
            b'/' => {
                out.push(b'/');
                i += 2;
            }
            c @ (b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't') => {
                out.extend_from_slice(&[b'\\', *c]);
                i += 2;
            }
            _ => return None,
        }
        run = i;
    }
    out.extend_from_slice(inner.get(run..)?);
    out.push(b'"');
    Some(())
}

/// The character of the `\uXXXX` escape at `i` (with its low surrogate when it is a high
/// one), and the bytes it took.
fn unicode_escape(text: &[u8], i: usize) -> Option<(char, usize)> {
    let unit = |at: usize| -> Option<u32> {
        let hex = std::str::from_utf8(text.get(at..at + 4)?).ok()?;
        u32::from_str_radix(hex, 16).ok()
    };
    let first = unit(i + 2)?;
    match first {
        0xD800..=0xDBFF => {
            if text.get(i + 6..i + 8) != Some(b"\\u") {
                return None;
            }
            let low = unit(i + 8)?;
            if !(0xDC00..=0xDFFF).contains(&low) {
                return None;
            }
            let c = 0x10000 + ((first - 0xD800) << 10) + (low - 0xDC00);
            Some((char::from_u32(c)?, 12))
        }
        _ => Some((char::from_u32(first)?, 6)),
    }
}

/// One decoded character as serde_json writes it inside a string.
fn write_char(c: char, out: &mut Vec<u8>) {
    match c {
        '"' => out.extend_from_slice(b"\\\""),
        '\\' => out.extend_from_slice(b"\\\\"),
        '\u{8}' => out.extend_from_slice(b"\\b"),
        '\u{c}' => out.extend_from_slice(b"\\f"),
        '\n' => out.extend_from_slice(b"\\n"),
        '\r' => out.extend_from_slice(b"\\r"),
        '\t' => out.extend_from_slice(b"\\t"),
        c if (c as u32) < 0x20 => {
            let hex = |d: u8| if d < 10 { b'0' + d } else { b'a' + d - 10 };
            let b = c as u8;
            out.extend_from_slice(&[b'\\', b'u', b'0', b'0', hex(b >> 4), hex(b & 15)]);
        }
        c => {
            let mut utf8 = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn compacted(raw: &str) -> String {
        let mut out = Vec::new();
        compact(raw, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn compact_form() {
        assert_eq!(
            compacted(" { \"a\" : [ 1 , 2.50 , true ] ,\n \"b\" : \" x  y \" } "),
            r#"{"a":[1,2.50,true],"b":" x  y "}"#
        );
        assert_eq!(
            compacted(r#""caf\u00e9 \ud83d\ude00 \/ \" \\ \n \u0001""#),
            "\"café 😀 / \\\" \\\\ \\n \\u0001\""
        );
        assert_eq!(compacted(r#""\"""#), r#""\"""#);
        assert_eq!(compacted(r#"{"k\u0041":"v"}"#), r#"{"kA":"v"}"#);
    }

    /// What `write_string` replaced: decode with serde_json, write with serde_json.
    fn serde_string(token: &str) -> Option<Vec<u8>> {
        let decoded: String = serde_json::from_str(token).ok()?;
        serde_json::to_vec(&decoded).ok()
    }

    #[test]
    fn strings_as_serde_json_writes_them() {
        for token in [
            r#""""#,
            r#""plain""#,
            r#""caf\u00e9 \ud83d\ude00 \/ \" \\ \n \u0001 \u001f""#,
            r#""\u0022\u005c\u002f\u0008\u000c\u000a\u000d\u0009\u007f\u2028""#,
            r#""\ud800""#,
            r#""\udc00""#,
            r#""\ud800\u0041""#,
            r#""\ud800x""#,
            r#""\uD83D\uDE00""#,
            r#""é漢 \b\f\r\t""#,
        ] {
            let mut out = Vec::new();
            let ours = write_string(token, &mut out).map(|()| out);
            assert_eq!(ours, serde_string(token), "{token}");
        }
    }

    /// The byte loop alone, over all of `raw`.
    fn normalised(raw: &str) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        let end = normalise_until(raw, 0, raw.len(), &mut out)?;
        assert_eq!(end, raw.len());
        Some(out)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any string of escapes and characters: written as serde_json writes it, or refused
        /// exactly when serde_json refuses it.
        #[test]
        fn strings_agree_with_serde_json(
            pieces in prop::collection::vec(
                prop::sample::select(vec![
                    "a", " ", "é", "漢", "😀", r"\n", r"\t", r"\b", r"\f", r"\r", r#"\""#, r"\\",
                    r"\/", r"\u0000", r"\u001F", r"\u0022", r"\u005C", r"\u007f", r"\u00e9",
                    r"\u6f22", r"\uffff", r"\ud83d", r"\ude00", r"\uD800", r"\uDBFF", r"\uDFFF",
                ]),
                0..12,
            ),
        ) {
            let token = format!("\"{}\"", pieces.concat());
            let mut out = Vec::new();
            let ours = write_string(&token, &mut out).map(|()| out);
            prop_assert_eq!(ours, serde_string(&token), "{}", token);
        }

        /// Block by block (with the byte loop taking over around escapes to normalise) is
        /// the byte loop alone, across block edges; a string that never ends is refused.
        #[test]
        fn blocks_agree_with_the_byte_loop(
            items in prop::collection::vec(
                prop::sample::select(vec![
                    "\"plain\"", "\"two  spaces\"", " ", "\n", "\t ", "\r\n", ",", ":", "[", "]",
                    "{", "}", "\"esc \\\" \\\\ \\n\"", "\"\\u00e9\"", "\"a\\/b\"", "\"\\\\u\"", "12.5",
                    "true", "\"é漢😀\"", "\"a long string that crosses one 64-byte block edge surely\"",
                    "\"a long string with \\u00e9 and \\/ and \\ud83d\\ude00 that crosses an edge\"",
                    "\"\\ud800 lone\"", "\"spaced  \\u0041  \\\\u0041\"",
                ]),
                0..40,
            ),
        ) {
            let raw = items.concat();
            let mut blocks = Vec::new();
            let ours = compact(&raw, &mut blocks).map(|()| blocks);
            prop_assert_eq!(ours, normalised(&raw), "{:?}", raw);
            let open = format!("{raw} \"never ends");
            prop_assert_eq!(compact(&open, &mut Vec::new()), None);
        }
    }
}
