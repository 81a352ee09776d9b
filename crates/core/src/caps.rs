//! Caller caps (docs/spec.md §3): mirrors vLLM's (pydantic's) lax integer parsing of
//! `max_tokens`, `max_completion_tokens` and `max_output_tokens`.

/// The three top-level cap fields, in tie-break order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CapField {
    MaxTokens,
    MaxCompletionTokens,
    MaxOutputTokens,
}

impl CapField {
    pub fn from_key(key: &str) -> Option<CapField> {
        match key {
            "max_tokens" => Some(CapField::MaxTokens),
            "max_completion_tokens" => Some(CapField::MaxCompletionTokens),
            "max_output_tokens" => Some(CapField::MaxOutputTokens),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CapField::MaxTokens => "max_tokens",
            CapField::MaxCompletionTokens => "max_completion_tokens",
            CapField::MaxOutputTokens => "max_output_tokens",
        }
    }
}

/// Parses one cap value given as raw JSON text. `None` means invalid (ignored, and removed
/// on rewrite). Huge values saturate at `u64::MAX`.
pub fn parse_cap(raw: &str) -> Option<u64> {
    let raw = raw.trim_matches(|c: char| matches!(c, ' ' | '\t' | '\n' | '\r'));
    match raw.as_bytes().first()? {
        b't' if raw == "true" => Some(1),
        b'"' => {
            let text: String = serde_json::from_str(raw).ok()?;
            parse_lax_string(text.trim())
        }
        b'-' | b'0'..=b'9' => parse_json_number(raw),
        _ => None,
    }
}

/// A JSON number: an integer, or a float whose value is integral.
fn parse_json_number(raw: &str) -> Option<u64> {
    if raw.bytes().all(|b| b.is_ascii_digit()) {
        return positive(saturating_digits(raw));
    }
    if raw.starts_with('-') && raw[1..].bytes().all(|b| b.is_ascii_digit()) {
        return None; // negative integer (or -0)
    }
    let f: f64 = raw.parse().ok()?;
    if !f.is_finite() || f.fract() != 0.0 || f <= 0.0 {
        return None;
    }
    // `as` saturates for floats above u64::MAX.
    Some(f as u64)
}

/// A string: trimmed, `[+-]?[0-9]+(_[0-9]+)*(\.0+)?`, > 0.
fn parse_lax_string(s: &str) -> Option<u64> {
    let (negative, rest) = match s.as_bytes().first()? {
        b'+' => (false, &s[1..]),
        b'-' => (true, &s[1..]),
        _ => (false, s),
    };
    let (int_part, frac) = match rest.find('.') {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    if let Some(frac) = frac {
        if frac.is_empty() || !frac.bytes().all(|b| b == b'0') {
            return None;
        }
    }
    // Digit groups separated by single underscores, no leading/trailing underscore.
    if int_part.is_empty()
        || int_part
            .split('_')
            .any(|g| g.is_empty() || !g.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    let digits: String = int_part.chars().filter(|c| *c != '_').collect();
    let value = saturating_digits(&digits);
    if negative {
        return None;
    }
    positive(value)
}

fn saturating_digits(digits: &str) -> u64 {
    digits.bytes().fold(0u64, |acc, d| {
        acc.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    })
}

fn positive(v: u64) -> Option<u64> {
    (v > 0).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_caps() {
        for (raw, want) in [
            ("5", 5),
            ("5.0", 5),
            ("5.000", 5),
            ("5e3", 5000),
            ("5E0", 5),
            ("50e-1", 5),
            ("true", 1),
            (r#""5""#, 5),
            (r#"" 5 ""#, 5),
            (r#""+5""#, 5),
            (r#""5.0""#, 5),
            (r#""5.00""#, 5),
            (r#""1_0""#, 10),
            (r#""1_000_000""#, 1_000_000),
            (r#""007""#, 7),
            (r#""\u0035""#, 5),
            ("18446744073709551616", u64::MAX),
            ("99999999999999999999999999999", u64::MAX),
            ("1e300", u64::MAX),
            (r#""99999999999999999999999999""#, u64::MAX),
            ("  7  ", 7),
        ] {
            assert_eq!(parse_cap(raw), Some(want), "{raw}");
        }
    }

    #[test]
    fn invalid_caps() {
        for raw in [
            "false",
            "0",
            "-0",
            "0.0",
            "-5",
            "-5.0",
            "null",
            "1.5",
            "0.5",
            "1e400",
            "-1e400",
            r#""""#,
            r#""abc""#,
            r#""1.5""#,
            r#""5.""#,
            r#""_1""#,
            r#""1_""#,
            r#""1__0""#,
            r#""-5""#,
            r#""0""#,
            r#""5e3""#,
            r#""0x10""#,
            "[5]",
            "{}",
            r#"{"a":5}"#,
            "",
            "tru",
        ] {
            assert_eq!(parse_cap(raw), None, "{raw}");
        }
    }

    #[test]
    fn field_names_round_trip() {
        for f in [
            CapField::MaxTokens,
            CapField::MaxCompletionTokens,
            CapField::MaxOutputTokens,
        ] {
            assert_eq!(CapField::from_key(f.name()), Some(f));
        }
        assert_eq!(CapField::from_key("max_new_tokens"), None);
        assert!(CapField::MaxTokens < CapField::MaxCompletionTokens);
        assert!(CapField::MaxCompletionTokens < CapField::MaxOutputTokens);
    }
}
