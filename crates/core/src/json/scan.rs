//! Top-level JSON object scanner: validates the whole body and returns the byte ranges of
//! each top-level member, without building a DOM of the values (they are skipped as raw text).
//!
//! It accepts exactly what `serde_json` accepts (the differential tests below and the
//! `body_rewrite` fuzz target hold it to that): RFC 8259 grammar, any nesting depth inside a
//! value (skipped iteratively), strings without raw control characters, valid escapes, valid
//! UTF-8. It is hand-written because it is the hot path: string contents — nearly all of a
//! prompt — are skipped 8 bytes at a time (16 with wasm `simd128`), which is several times
//! faster than serde_json's byte-by-byte `RawValue` scan.

use crate::json::guess::{self, Guesses};
use crate::json::skim::container_end;
use std::ops::Range;

/// One top-level member `"key": value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The decoded key (escapes resolved, as vLLM's JSON parser sees it).
    pub key: String,
    /// From the opening quote of the key.
    pub key_start: usize,
    /// The raw value text.
    pub value: Range<usize>,
}

/// Why a body is not a JSON object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanError {
    /// Not valid JSON (or not UTF-8, or empty).
    NotJson,
    /// Valid JSON, but not an object.
    NotObject,
}

/// Any syntax error: the position is not reported (nothing logs it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Invalid;

type Parse<T> = Result<T, Invalid>;

pub fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

pub fn skip_ws(body: &[u8], mut i: usize) -> usize {
    while body.get(i).is_some_and(|b| is_ws(*b)) {
        i += 1;
    }
    i
}

/// Scans a body that must be a JSON object. Duplicate keys are all returned, in order.
pub fn scan(body: &[u8]) -> Result<Vec<Member>, ScanError> {
    scan_skimming(body, |_| false).map(|(members, _)| members)
}

/// As `scan`, except that array and object values of the members `skim` picks are only
/// skimmed (`skim::container_end`), not validated. Also returns the indices of those members:
/// the body is valid JSON only if each of their values passes `is_value_at`.
pub fn scan_skimming(
    body: &[u8],
    skim: impl Fn(&str) -> bool,
) -> Result<(Vec<Member>, Vec<usize>), ScanError> {
    scan_guessing(body, skim, None)
}

/// As `scan_skimming`; with `guessed`, a long skimmed value's end is guessed where it can be
/// ([`Guesses`]), and the members whose end was are pushed to it, whether the scan then
/// succeeds or not: the members are right only if those guesses are proved (see `guess`).
pub fn scan_guessing(
    body: &[u8],
    skim: impl Fn(&str) -> bool,
    guessed: Option<&mut Guesses>,
) -> Result<(Vec<Member>, Vec<usize>), ScanError> {
    let start = skip_ws(body, 0);
    match body.get(start) {
        Some(b'{') => members(body, start, &skim, guessed).map_err(|_| ScanError::NotJson),
        Some(_) => match skip_value(body, start) {
            Ok(end) if skip_ws(body, end) == body.len() => Err(ScanError::NotObject),
            _ => Err(ScanError::NotJson),
        },
        None => Err(ScanError::NotJson),
    }
}

/// Whether `text` is exactly one JSON value (surrounding white space allowed). The filter
/// only needs `is_value_at`; the tests use this.
#[cfg(test)]
pub fn is_json(text: &[u8]) -> bool {
    let start = skip_ws(text, 0);
    matches!(skip_value(text, start), Ok(end) if skip_ws(text, end) == text.len())
}

/// The items of `text`, which must be exactly one JSON array (surrounding white space
/// allowed), as ranges into it; `None` when it is not. Validates as `scan` does.
pub fn array_items(text: &[u8]) -> Option<Vec<std::ops::Range<usize>>> {
    let mut items = Vec::new();
    let open = skip_ws(text, 0);
    if text.get(open) != Some(&b'[') {
        return None;
    }
    let mut i = skip_ws(text, open + 1);
    let end = if text.get(i) == Some(&b']') {
        i + 1
    } else {
        loop {
            let item_end = skip_value(text, i).ok()?;
            items.push(i..item_end);
            i = skip_ws(text, item_end);
            match text.get(i) {
                Some(b',') => i = skip_ws(text, i + 1),
                Some(b']') => break i + 1,
                _ => return None,
            }
        }
    };
    (skip_ws(text, end) == text.len()).then_some(items)
}

/// Whether `body[range]` is exactly one JSON value.
pub fn is_value_at(body: &[u8], range: std::ops::Range<usize>) -> bool {
    skip_value(body, range.start) == Ok(range.end)
}

type Members = (Vec<Member>, Vec<usize>);

/// The members of the object that opens at `open`. With `guessed`, long skimmed values are
/// guessed where they can be, and the indices of those members are pushed to it.
fn members(
    body: &[u8],
    open: usize,
    skim: &impl Fn(&str) -> bool,
    mut guessed: Option<&mut Guesses>,
) -> Parse<Members> {
    let mut out = Vec::new();
    let mut skimmed = Vec::new();
    let mut i = skip_ws(body, open + 1);
    if body.get(i) == Some(&b'}') {
        return finish(body, i + 1, (out, skimmed));
    }
    loop {
        if body.get(i) != Some(&b'"') {
            return Err(Invalid);
        }
        let key_start = i;
        let (key_end, escaped) = skip_string(body, i + 1)?;
        let key = decode_key(body.get(key_start..key_end).ok_or(Invalid)?, escaped)?;
        i = skip_ws(body, key_end);
        if body.get(i) != Some(&b':') {
            return Err(Invalid);
        }
        let value_start = skip_ws(body, i + 1);
        let value_end = if matches!(body.get(value_start), Some(b'[' | b'{')) && skim(&key) {
            skimmed.push(out.len());
            let guessed_end = guessed.as_deref_mut().and_then(|g| {
                let end = g.end(body, value_start);
                if end.is_some() {
                    g.found.push(out.len());
                }
                end
            });
            match guessed_end {
                Some(end) => end,
                None => {
                    let end = container_end(body, value_start).ok_or(Invalid)?;
                    guess::learn(body, value_start, end);
                    end
                }
            }
        } else {
            skip_value(body, value_start)?
        };
        out.push(Member {
            key,
            key_start,
            value: value_start..value_end,
        });
        i = skip_ws(body, value_end);
        match body.get(i) {
            Some(b',') => i = skip_ws(body, i + 1),
            Some(b'}') => return finish(body, i + 1, (out, skimmed)),
            _ => return Err(Invalid),
        }
    }
}

fn finish(body: &[u8], end: usize, members: Members) -> Parse<Members> {
    if skip_ws(body, end) == body.len() {
        Ok(members)
    } else {
        Err(Invalid)
    }
}

/// A key's text as vLLM sees it: borrowed when plain, decoded by serde_json when escaped
/// (a lone surrogate escape fails there, as it does in serde_json's own object parse).
fn decode_key(quoted: &[u8], escaped: bool) -> Parse<String> {
    if escaped {
        let text = std::str::from_utf8(quoted).map_err(|_| Invalid)?;
        serde_json::from_str::<String>(text).map_err(|_| Invalid)
    } else {
        let inner = quoted
            .get(1..quoted.len().saturating_sub(1))
            .ok_or(Invalid)?;
        std::str::from_utf8(inner)
            .map(str::to_owned)
            .map_err(|_| Invalid)
    }
}

/// Skips one value starting at `i` (no leading white space) and returns where it ends.
/// Iterative: nesting depth costs one byte of heap per level, never stack.
fn skip_value(body: &[u8], mut i: usize) -> Parse<usize> {
    // The open containers: true for an object, false for an array.
    let mut stack: Vec<bool> = Vec::new();
    loop {
        // A value starts at i.
        i = match body.get(i) {
            Some(b'"') => skip_string(body, i + 1)?.0,
            Some(b'{') => {
                let j = skip_ws(body, i + 1);
                if body.get(j) == Some(&b'}') {
                    j + 1
                } else {
                    stack.push(true);
                    i = object_key(body, j)?;
                    continue;
                }
            }
            Some(b'[') => {
                let j = skip_ws(body, i + 1);
                if body.get(j) == Some(&b']') {
                    j + 1
                } else {
                    stack.push(false);
                    i = j;
                    continue;
                }
            }
            Some(b't') => literal(body, i, b"true")?,
            Some(b'f') => literal(body, i, b"false")?,
            Some(b'n') => literal(body, i, b"null")?,
            Some(b'-' | b'0'..=b'9') => number(body, i)?,
            _ => return Err(Invalid),
        };
        // The value ended at i: close containers until one continues with a comma.
        loop {
            let Some(&object) = stack.last() else {
                return Ok(i);
            };
            let j = skip_ws(body, i);
            match (body.get(j), object) {
                (Some(b','), true) => {
                    i = object_key(body, skip_ws(body, j + 1))?;
                    break;
                }
                (Some(b','), false) => {
                    i = skip_ws(body, j + 1);
                    break;
                }
                (Some(b'}'), true) | (Some(b']'), false) => {
                    stack.pop();
                    i = j + 1;
                }
                _ => return Err(Invalid),
            }
        }
    }
}

/// `"key"` `:` at `i`; returns where the member's value starts.
fn object_key(body: &[u8], i: usize) -> Parse<usize> {
    if body.get(i) != Some(&b'"') {
        return Err(Invalid);
    }
    let (end, _) = skip_string(body, i + 1)?;
    let j = skip_ws(body, end);
    if body.get(j) != Some(&b':') {
        return Err(Invalid);
    }
    Ok(skip_ws(body, j + 1))
}

fn literal(body: &[u8], i: usize, word: &[u8]) -> Parse<usize> {
    if body.get(i..i + word.len()) == Some(word) {
        Ok(i + word.len())
    } else {
        Err(Invalid)
    }
}

fn digits(body: &[u8], mut i: usize) -> usize {
    while body.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    i
}

/// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
fn number(body: &[u8], mut i: usize) -> Parse<usize> {
    if body.get(i) == Some(&b'-') {
        i += 1;
    }
    i = match body.get(i) {
        Some(b'0') => i + 1,
        Some(b'1'..=b'9') => digits(body, i + 1),
        _ => return Err(Invalid),
    };
    if body.get(i) == Some(&b'.') {
        let j = digits(body, i + 1);
        if j == i + 1 {
            return Err(Invalid);
        }
        i = j;
    }
    if matches!(body.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(body.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let j = digits(body, i);
        if j == i {
            return Err(Invalid);
        }
        i = j;
    }
    Ok(i)
}

/// Skips a string whose opening quote is just before `start`. Returns the index after the
/// closing quote and whether the string has escapes. Raw control characters, bad escapes
/// and invalid UTF-8 are errors.
fn skip_string(body: &[u8], start: usize) -> Parse<(usize, bool)> {
    let mut i = start;
    let mut escaped = false;
    let mut high = false;
    loop {
        let (next, saw_high) = plain_run(body, i);
        high |= saw_high;
        i = next;
        match body.get(i) {
            Some(b'"') => break,
            Some(b'\\') => {
                escaped = true;
                i = escape(body, i + 1)?;
            }
            Some(_) | None => return Err(Invalid), // a control character, or the end
        }
    }
    // `start..i` lies in `body` (`i` only moved forward from `start`, over bytes of `body`).
    if high && std::str::from_utf8(body.get(start..i).unwrap_or_default()).is_err() {
        return Err(Invalid);
    }
    Ok((i + 1, escaped))
}

/// After a backslash at `i - 1`: one valid escape; returns the index after it.
fn escape(body: &[u8], i: usize) -> Parse<usize> {
    match body.get(i) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(i + 1),
        Some(b'u') => match body.get(i + 1..i + 5) {
            Some(hex) if hex.iter().all(u8::is_ascii_hexdigit) => Ok(i + 5),
            _ => Err(Invalid),
        },
        _ => Err(Invalid),
    }
}

/// From `i`, the first byte that is `"`, `\` or a control character (or the end), and
/// whether a byte >= 0x80 came before it.
fn plain_run(body: &[u8], i: usize) -> (usize, bool) {
    #[cfg(all(target_family = "wasm", target_feature = "simd128"))]
    {
        simd::plain_run(body, i)
    }
    #[cfg(not(all(target_family = "wasm", target_feature = "simd128")))]
    {
        swar_plain_run(body, i)
    }
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `x` that is `"`, `\` or below 0x20. Exact for the lowest
/// flagged byte (a borrow only runs upward from a byte that is itself flagged).
fn special_bytes(x: u64) -> u64 {
    let quote = x ^ (ONES * u64::from(b'"'));
    let backslash = x ^ (ONES * u64::from(b'\\'));
    let zero_quote = quote.wrapping_sub(ONES) & !quote;
    let zero_backslash = backslash.wrapping_sub(ONES) & !backslash;
    let control = x.wrapping_sub(ONES * 0x20) & !x;
    (zero_quote | zero_backslash | control) & HIGHS
}

fn is_special(b: u8) -> bool {
    b == b'"' || b == b'\\' || b < 0x20
}

/// 8 bytes at a time (SWAR), then byte by byte.
#[cfg_attr(
    all(target_family = "wasm", target_feature = "simd128"),
    allow(dead_code)
)]
fn swar_plain_run(body: &[u8], mut i: usize) -> (usize, bool) {
    let mut seen: u64 = 0;
    while let Some(chunk) = body.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word);
        let special = special_bytes(x);
        if special != 0 {
            let n = (special.trailing_zeros() / 8) as usize;
            let before = if n == 0 {
                0
            } else {
                x & (u64::MAX >> (64 - 8 * n))
            };
            return (i + n, (seen | before) & HIGHS != 0);
        }
        seen |= x;
        i += 8;
    }
    let mut high = seen & HIGHS != 0;
    while let Some(&b) = body.get(i) {
        if is_special(b) {
            break;
        }
        high |= b >= 0x80;
        i += 1;
    }
    (i, high)
}

#[cfg(all(target_family = "wasm", target_feature = "simd128"))]
mod simd {
    use core::arch::wasm32::*;

    /// 16 bytes at a time with wasm SIMD, then the SWAR loop for the tail.
    pub fn plain_run(body: &[u8], mut i: usize) -> (usize, bool) {
        let quote = u8x16_splat(b'"');
        let backslash = u8x16_splat(b'\\');
        let space = u8x16_splat(0x20);
        let mut seen = u8x16_splat(0);
        while let Some(chunk) = body.get(i..i + 16) {
            // SAFETY: `chunk` is 16 readable bytes; wasm loads need no alignment.
            let v = unsafe { v128_load(chunk.as_ptr().cast::<v128>()) };
            let special = v128_or(
                v128_or(u8x16_eq(v, quote), u8x16_eq(v, backslash)),
                u8x16_lt(v, space),
            );
            let mask = u8x16_bitmask(special);
            if mask != 0 {
                let n = mask.trailing_zeros() as usize;
                let before = u8x16_bitmask(seen) != 0 || chunk.iter().take(n).any(|&b| b >= 0x80);
                return (i + n, before);
            }
            seen = v128_or(seen, v);
            i += 16;
        }
        let (end, high) = super::swar_plain_run(body, i);
        (end, high || u8x16_bitmask(seen) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The scanner this one replaced, built on serde_json's `RawValue`: the oracle.
    mod reference {
        use super::super::{skip_ws, Member, ScanError};
        use serde::de::{Deserializer, MapAccess, Visitor};
        use serde_json::value::RawValue;
        use std::borrow::Cow;
        use std::fmt;

        struct Entries<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

        impl<'de> serde::Deserialize<'de> for Entries<'de> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl<'de> Visitor<'de> for V {
                    type Value = Entries<'de>;
                    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                        f.write_str("a JSON object")
                    }
                    fn visit_map<A: MapAccess<'de>>(
                        self,
                        mut map: A,
                    ) -> Result<Self::Value, A::Error> {
                        let mut out = Vec::new();
                        while let Some(key) = map.next_key::<CowStr<'de>>()? {
                            let value: &'de RawValue = map.next_value()?;
                            out.push((key.0, value));
                        }
                        Ok(Entries(out))
                    }
                }
                d.deserialize_map(V)
            }
        }

        /// A key: borrowed from the text when it has no escapes.
        #[derive(serde::Deserialize)]
        struct CowStr<'a>(#[serde(borrow)] Cow<'a, str>);

        pub fn scan(body: &[u8]) -> Result<Vec<Member>, ScanError> {
            let start = skip_ws(body, 0);
            if body.get(start) != Some(&b'{') {
                return Err(if serde_json::from_slice::<&RawValue>(body).is_ok() {
                    ScanError::NotObject
                } else {
                    ScanError::NotJson
                });
            }
            let entries: Entries = serde_json::from_slice(body).map_err(|_| ScanError::NotJson)?;
            let base = body.as_ptr() as usize;
            let mut members = Vec::new();
            let mut cursor = start + 1;
            for (key, raw) in entries.0 {
                let text = raw.get();
                let value_start = text.as_ptr() as usize - base;
                let value_end = value_start + text.len();
                let mut key_start = skip_ws(body, cursor);
                if body.get(key_start) == Some(&b',') {
                    key_start = skip_ws(body, key_start + 1);
                }
                members.push(Member {
                    key: key.into_owned(),
                    key_start,
                    value: value_start..value_end,
                });
                cursor = value_end;
            }
            Ok(members)
        }
    }

    /// JSON text with the spellings that matter to a scanner: escapes of every kind, non-ASCII,
    /// numbers in every form, nesting, white space between every token.
    fn json_text() -> impl Strategy<Value = String> {
        let ws = prop::sample::select(vec!["", "", " ", "\n", "\t ", "\r\n  "]);
        let string = prop::collection::vec(
            prop::sample::select(vec![
                "a",
                "plain text of some length, more than sixteen bytes",
                "\\\"",
                "\\\\",
                "\\/",
                "\\n",
                "\\u00e9",
                "\\uD83D\\uDE00",
                "\\ud800",
                "é",
                "漢字",
                "😀",
                "'",
                "max_tokens",
                " ",
            ]),
            0..8,
        )
        .prop_map(|parts| format!("\"{}\"", parts.concat()));
        let number = prop::sample::select(vec![
            "0",
            "-0",
            "12",
            "-7",
            "1.5",
            "1e9",
            "2E-3",
            "-0.0e+1",
            "123456789012345678901234567890",
        ])
        .prop_map(str::to_owned);
        let leaf = prop_oneof![
            string.clone(),
            number,
            Just("true".to_owned()),
            Just("false".to_owned()),
            Just("null".to_owned()),
        ];
        let value = leaf.prop_recursive(5, 48, 6, move |inner| {
            let ws = prop::sample::select(vec!["", " ", "\n  "]);
            let key = prop::sample::select(vec!["\"a\"", "\"messages\"", "\"k\\u0065y\"", "\"é\""]);
            prop_oneof![
                (prop::collection::vec((inner.clone(), ws.clone()), 0..5)).prop_map(|items| {
                    let body: Vec<String> = items
                        .into_iter()
                        .map(|(v, w)| format!("{w}{v}{w}"))
                        .collect();
                    format!("[{}]", body.join(","))
                }),
                (prop::collection::vec((key, inner, ws), 0..5)).prop_map(|items| {
                    let body: Vec<String> = items
                        .into_iter()
                        .map(|(k, v, w)| format!("{w}{k}{w}:{w}{v}"))
                        .collect();
                    format!("{{{}}}", body.join(","))
                }),
            ]
        });
        (ws.clone(), value, ws).prop_map(|(a, v, b)| format!("{a}{v}{b}"))
    }

    /// Byte edits that break JSON in the ways a scanner can get wrong.
    fn mutate(text: String, edits: Vec<(usize, u8, u8)>) -> Vec<u8> {
        const BYTES: &[u8] = b"\"\\{}[],: \x00\x1f\x7fu0e-.+\xc3\xa9\xff\xed\xa0\x80tnf";
        let mut out = text.into_bytes();
        for (at, op, b) in edits {
            let b = BYTES[b as usize % BYTES.len()];
            let at = if out.is_empty() {
                0
            } else {
                at % (out.len() + 1)
            };
            match op % 3 {
                0 => out.insert(at, b),
                1 if at < out.len() => {
                    out.remove(at);
                }
                _ if at < out.len() => out[at] = b,
                _ => out.push(b),
            }
        }
        out
    }

    /// Skimming `messages` and `a`, then validating what was skimmed, must be `scan`.
    fn skim_then_validate(body: &[u8]) -> Result<Vec<Member>, ScanError> {
        let (members, skimmed) = scan_skimming(body, |k| k == "messages" || k == "a")?;
        if skimmed
            .iter()
            .all(|&i| is_value_at(body, members[i].value.clone()))
        {
            Ok(members)
        } else {
            Err(ScanError::NotJson)
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        /// Valid JSON (objects and every other kind of value): same members, same errors.
        #[test]
        fn agrees_with_serde_json_on_valid_text(text in json_text()) {
            prop_assert_eq!(scan(text.as_bytes()), reference::scan(text.as_bytes()));
            prop_assert_eq!(skim_then_validate(text.as_bytes()), scan(text.as_bytes()));
            prop_assert!(is_json(text.as_bytes()));
        }

        /// Broken JSON: every edit of a valid text is judged as serde_json judges it.
        #[test]
        fn agrees_with_serde_json_on_edited_text(
            text in json_text(),
            edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..4),
        ) {
            let body = mutate(text, edits);
            prop_assert_eq!(scan(&body), reference::scan(&body), "{:?}", String::from_utf8_lossy(&body));
            prop_assert_eq!(skim_then_validate(&body), scan(&body), "{:?}", String::from_utf8_lossy(&body));
            prop_assert_eq!(
                is_json(&body),
                serde_json::from_slice::<&serde_json::value::RawValue>(&body).is_ok(),
                "{:?}", String::from_utf8_lossy(&body)
            );
        }

        /// Arbitrary bytes (mostly not JSON at all).
        #[test]
        fn agrees_with_serde_json_on_any_bytes(body in prop::collection::vec(any::<u8>(), 0..64)) {
            prop_assert_eq!(scan(&body), reference::scan(&body));
            prop_assert_eq!(skim_then_validate(&body), scan(&body));
        }
    }

    #[test]
    fn string_runs_across_block_edges() {
        // Every special byte at every offset of the 8- and 16-byte blocks.
        for len in 0..40 {
            for special in ["\\\"", "\\n", "é", "\u{1}", "\""] {
                let content = format!("{}{}{}", "x".repeat(len), special, "y".repeat(len % 7));
                let body = format!("{{\"a\":\"{content}\"}}");
                assert_eq!(
                    scan(body.as_bytes()),
                    reference::scan(body.as_bytes()),
                    "{body:?}"
                );
            }
        }
        let bad = [0xffu8, 0xc3, 0xed];
        for len in 0..40 {
            for b in bad {
                let mut body = b"{\"a\":\"".to_vec();
                body.extend(std::iter::repeat_n(b'x', len));
                body.push(b);
                body.extend(b"z\"}");
                assert_eq!(scan(&body), Err(ScanError::NotJson), "{body:?}");
            }
        }
    }

    fn slices<'a>(body: &'a str, m: &[Member]) -> Vec<(&'a str, &'a str)> {
        m.iter()
            .map(|m| {
                (
                    &body[m.key_start..m.key_start + 1 + m.key.len() + 1],
                    &body[m.value.clone()],
                )
            })
            .collect()
    }

    proptest! {
        /// Array items: the same as serde_json's split into raw values, and `None` exactly
        /// where serde_json refuses the text as an array.
        #[test]
        fn array_items_agree_with_serde_json(
            text in json_text(),
            edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..3),
        ) {
            let array = format!("[{text}, {text}]");
            for body in [array.clone().into_bytes(), mutate(array, edits)] {
                let ours = array_items(&body).map(|items| {
                    items.into_iter().map(|r| body[r].to_vec()).collect::<Vec<_>>()
                });
                let theirs = std::str::from_utf8(&body).ok().and_then(|t| {
                    serde_json::from_str::<Vec<&serde_json::value::RawValue>>(t).ok()
                }).map(|items| items.iter().map(|r| r.get().as_bytes().to_vec()).collect::<Vec<_>>());
                prop_assert_eq!(ours, theirs);
            }
        }
    }

    #[test]
    fn members_and_ranges() {
        let body = " { \"a\" : 1 ,\n\"b\":[1, {\"x\":2}] , \"c\" :\"s\\\"\"} ";
        let m = scan(body.as_bytes()).unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(
            slices(body, &m),
            vec![
                ("\"a\"", "1"),
                ("\"b\"", "[1, {\"x\":2}]"),
                ("\"c\"", "\"s\\\"\"")
            ]
        );
    }

    #[test]
    fn escaped_keys_are_decoded() {
        let body = r#"{"max\u005ftokens":5}"#;
        let m = scan(body.as_bytes()).unwrap();
        assert_eq!(m[0].key, "max_tokens");
        assert_eq!(m[0].key_start, 1);
        assert_eq!(&body[m[0].value.clone()], "5");
    }

    #[test]
    fn duplicates_kept_in_order() {
        let m = scan(br#"{"a":1,"a":2}"#).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[1].value, 11..12);
    }

    #[test]
    fn errors() {
        assert_eq!(scan(b""), Err(ScanError::NotJson));
        assert_eq!(scan(b"   "), Err(ScanError::NotJson));
        assert_eq!(scan(b"{"), Err(ScanError::NotJson));
        assert_eq!(scan(b"{\"a\":1,}"), Err(ScanError::NotJson));
        assert_eq!(scan(b"{\"a\":1} x"), Err(ScanError::NotJson));
        assert_eq!(scan(b"{\"a\":\"\xff\"}"), Err(ScanError::NotJson));
        assert_eq!(scan(b"[1,2]"), Err(ScanError::NotObject));
        assert_eq!(scan(b" \"x\" "), Err(ScanError::NotObject));
        assert_eq!(scan(b"null"), Err(ScanError::NotObject));
        assert_eq!(scan(b"{} "), Ok(vec![]));
    }

    #[test]
    fn deep_nesting_is_skipped_without_recursion() {
        // Values are skipped iteratively: deep nesting neither crashes nor recurses.
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(10_000), "]".repeat(10_000));
        let m = scan(deep.as_bytes()).unwrap();
        assert_eq!(m[0].value, 5..20_005);
        let broken = format!("{{\"a\":{}{}}}", "[".repeat(10_000), "]".repeat(9_999));
        assert_eq!(scan(broken.as_bytes()), Err(ScanError::NotJson));
    }
}
