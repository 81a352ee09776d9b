//! Reference models and helpers shared by the fuzz targets. They are written from docs/spec.md,
//! independently of the code under test in src/.
#![allow(dead_code)]

use serde_json::Value;

/// The three top-level cap fields, in tie-break order (docs/spec.md §2).
pub const CAP_FIELDS: [&str; 3] = ["max_tokens", "max_completion_tokens", "max_output_tokens"];

pub fn is_cap_field(key: &str) -> bool {
    CAP_FIELDS.contains(&key)
}

/// Trims JSON white space (space, tab, LF, CR) from both ends.
pub fn json_trim(s: &str) -> &str {
    s.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'))
}

/// Decimal digits to u64, saturating at u64::MAX (docs/spec.md §3: huge values saturate).
pub fn saturating_decimal(digits: &str) -> u64 {
    let mut v: u128 = 0;
    for b in digits.bytes() {
        debug_assert!(b.is_ascii_digit());
        v = v * 10 + u128::from(b - b'0');
        if v > u128::from(u64::MAX) {
            return u64::MAX;
        }
    }
    v as u64
}

/// RFC 8259 number grammar: `-? (0 | [1-9][0-9]*) (\.[0-9]+)? ([eE][+-]?[0-9]+)?`.
pub fn is_json_number(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i > start
    };
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => {
            digits(&mut i);
        }
        _ => return false,
    }
    if b.get(i) == Some(&b'.') {
        i += 1;
        if !digits(&mut i) {
            return false;
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !digits(&mut i) {
            return false;
        }
    }
    i == b.len()
}

/// docs/spec.md §3 string form, as a small automaton: `[+-]?[0-9]+(_[0-9]+)*(\.0+)?`, then > 0.
pub fn ref_lax_string(s: &str) -> Option<u64> {
    #[derive(Clone, Copy, PartialEq)]
    enum St {
        Start,
        Sign,
        Digit,
        Underscore,
        Dot,
        Zero,
    }
    let mut st = St::Start;
    let mut negative = false;
    let mut digits = String::new();
    for c in s.chars() {
        st = match (st, c) {
            (St::Start, '+') => St::Sign,
            (St::Start, '-') => {
                negative = true;
                St::Sign
            }
            (St::Start | St::Sign | St::Digit | St::Underscore, '0'..='9') => {
                digits.push(c);
                St::Digit
            }
            (St::Digit, '_') => St::Underscore,
            (St::Digit, '.') => St::Dot,
            (St::Dot | St::Zero, '0') => St::Zero,
            _ => return None,
        };
    }
    if st != St::Digit && st != St::Zero {
        return None;
    }
    let v = saturating_decimal(&digits);
    if negative || v == 0 {
        return None;
    }
    Some(v)
}

/// The reference for a caller cap given the raw JSON text of a value (docs/spec.md §3).
/// Only meaningful for text that is one valid JSON value.
pub fn ref_cap(raw: &str) -> Option<u64> {
    let t = json_trim(raw);
    if t == "true" {
        return Some(1);
    }
    if t.starts_with('"') {
        let s: String = serde_json::from_str(t).ok()?;
        return ref_lax_string(s.trim());
    }
    if !is_json_number(t) {
        return None; // false, null, arrays, objects
    }
    let (negative, magnitude) = match t.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, t),
    };
    if magnitude.bytes().all(|b| b.is_ascii_digit()) {
        // An integer literal: exact, saturating; 0 and negatives are invalid.
        let v = saturating_decimal(magnitude);
        return (!negative && v > 0).then_some(v);
    }
    // A float: valid when finite, integral and > 0 (as Python's float would see it).
    let f: f64 = t.parse().ok()?;
    if !f.is_finite() || f <= 0.0 || f.fract() != 0.0 {
        return None;
    }
    Some(if f >= 18_446_744_073_709_551_616.0 {
        u64::MAX
    } else {
        f as u64
    })
}

/// Parses JSON into a `Value`. `Ok(None)` when the text is valid JSON (by the independent
/// validator below) that serde_json's `Value` cannot hold: nesting beyond its recursion limit
/// of 128, lone surrogate escapes, numbers beyond f64. `Err` when the text is not JSON.
pub fn json_value(bytes: &[u8]) -> Result<Option<Value>, String> {
    let valid = is_valid_json(bytes);
    match serde_json::from_slice::<Value>(bytes) {
        Ok(v) => {
            assert!(
                valid,
                "validator disagrees with serde_json: {}",
                show(bytes)
            );
            Ok(Some(v))
        }
        Err(_) if valid => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// Hex-escapes bytes for a panic message.
pub fn show(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(2000)])
        .escape_debug()
        .to_string()
}

/// An independent RFC 8259 validator (grammar and UTF-8 only; iterative, so any depth).
/// Lone surrogate escapes are valid grammar, as in Python's `json` that vLLM uses.
pub fn is_valid_json(b: &[u8]) -> bool {
    if std::str::from_utf8(b).is_err() {
        return false;
    }
    let ws = |i: &mut usize| {
        while *i < b.len() && matches!(b[*i], b' ' | b'\t' | b'\n' | b'\r') {
            *i += 1;
        }
    };
    // `"key" :` at i (no white space before it), and the white space after the colon.
    let key = |i: &mut usize| {
        if !string(b, i) {
            return false;
        }
        ws(i);
        if b.get(*i) != Some(&b':') {
            return false;
        }
        *i += 1;
        ws(i);
        true
    };
    // Stack of open containers: true = object, false = array.
    let mut stack: Vec<bool> = Vec::new();
    let mut i = 0;
    ws(&mut i);
    'value: loop {
        // Parse one value at i.
        match b.get(i) {
            Some(b'{') => {
                i += 1;
                ws(&mut i);
                if b.get(i) == Some(&b'}') {
                    i += 1;
                } else {
                    stack.push(true);
                    if !key(&mut i) {
                        return false;
                    }
                    continue 'value;
                }
            }
            Some(b'[') => {
                i += 1;
                ws(&mut i);
                if b.get(i) == Some(&b']') {
                    i += 1;
                } else {
                    stack.push(false);
                    continue 'value;
                }
            }
            Some(b'"') => {
                if !string(b, &mut i) {
                    return false;
                }
            }
            Some(_) => {
                let start = i;
                while i < b.len()
                    && !matches!(
                        b[i],
                        b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r' | b':'
                    )
                {
                    i += 1;
                }
                let lit = &b[start..i];
                let text = std::str::from_utf8(lit).unwrap_or("");
                if !(lit == b"true" || lit == b"false" || lit == b"null" || is_json_number(text)) {
                    return false;
                }
            }
            None => return false,
        }
        // After a value: close containers or continue with the next element.
        loop {
            ws(&mut i);
            let Some(&top) = stack.last() else {
                return i == b.len();
            };
            match (b.get(i), top) {
                (Some(b','), true) => {
                    i += 1;
                    ws(&mut i);
                    if !key(&mut i) {
                        return false;
                    }
                    continue 'value;
                }
                (Some(b','), false) => {
                    i += 1;
                    ws(&mut i);
                    continue 'value;
                }
                (Some(b'}'), true) | (Some(b']'), false) => {
                    i += 1;
                    stack.pop();
                }
                _ => return false,
            }
        }
    }
}

/// A JSON string at `*i` (which must be the opening quote); advances past the closing quote.
fn string(b: &[u8], i: &mut usize) -> bool {
    if b.get(*i) != Some(&b'"') {
        return false;
    }
    *i += 1;
    loop {
        match b.get(*i) {
            None => return false,
            Some(b'"') => {
                *i += 1;
                return true;
            }
            Some(b'\\') => match b.get(*i + 1) {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => *i += 2,
                Some(b'u') => {
                    let hex = b.get(*i + 2..*i + 6);
                    if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                        return false;
                    }
                    *i += 6;
                }
                _ => return false,
            },
            Some(c) if *c < 0x20 => return false,
            Some(_) => *i += 1,
        }
    }
}

/// Whether the text holds a `\uD800`–`\uDFFF` escape (serde_json refuses lone ones).
pub fn has_surrogate_escape(b: &[u8]) -> bool {
    b.windows(3)
        .any(|w| w[0] == b'\\' && w[1] == b'u' && matches!(w[2], b'd' | b'D'))
}

/// A JSON object's members in order, duplicates kept, keys decoded, values raw.
pub struct MemberList<'a>(pub Vec<(String, &'a serde_json::value::RawValue)>);

impl<'a> MemberList<'a> {
    /// The last member called `key` (as a parser that keeps the last duplicate reads it).
    pub fn last(&self, key: &str) -> Option<&'a serde_json::value::RawValue> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| *v)
    }
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for MemberList<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = MemberList<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut m: M,
            ) -> Result<Self::Value, M::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) =
                    m.next_entry::<String, &'de serde_json::value::RawValue>()?
                {
                    out.push((k, v));
                }
                Ok(MemberList(out))
            }
        }
        d.deserialize_map(Visit(std::marker::PhantomData))
    }
}
