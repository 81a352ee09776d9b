//! Top-level JSON object scanner: validates the whole body and returns the byte ranges of
//! each top-level member, without building a DOM of the values (they are skipped as raw text).

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;
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

struct Entries<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de> serde::Deserialize<'de> for Entries<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
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

/// A key borrowed from the input when it has no escapes.
struct CowStr<'a>(Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for CowStr<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = CowStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(CowStr(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(CowStr(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(V)
    }
}

pub fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

pub fn skip_ws(body: &[u8], mut i: usize) -> usize {
    while i < body.len() && is_ws(body[i]) {
        i += 1;
    }
    i
}

/// Scans a body that must be a JSON object. Duplicate keys are all returned, in order.
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
    let mut members = Vec::with_capacity(entries.0.len());
    // Each key starts after `{` or `,` and white space; values are located by address.
    let mut cursor = start + 1;
    for (key, raw) in entries.0 {
        let text = raw.get();
        let value_start = text.as_ptr() as usize - base;
        let value_end = value_start + text.len();
        let mut key_start = skip_ws(body, cursor);
        if body.get(key_start) == Some(&b',') {
            key_start = skip_ws(body, key_start + 1);
        }
        if body.get(key_start) != Some(&b'"') || value_end > body.len() {
            return Err(ScanError::NotJson); // cannot happen for input serde_json accepted
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

#[cfg(test)]
mod tests {
    use super::*;

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
