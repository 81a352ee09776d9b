//! The rough prompt estimate used when the tokenizer fails (docs/spec.md §7), after Hermes' rough
//! estimator: all-ASCII text counts ceil(bytes / 4); otherwise each CJK, Hangul or Kana code
//! point counts 1 and the remaining bytes ceil(n / 4). Applied to the concatenated raw JSON
//! text of the given slices, exactly as they stand in the request body.

fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x1100..=0x11FF | 0x2E80..=0x9FFF | 0xA960..=0xA97F | 0xAC00..=0xD7AF | 0xF900..=0xFAFF | 0xFF00..=0xFFEF)
}

/// Estimates the token count of the concatenation of `parts`.
pub fn estimate(parts: &[&str]) -> u64 {
    let mut cjk: u64 = 0;
    let mut other_bytes: u64 = 0;
    for part in parts {
        if part.is_ascii() {
            other_bytes += part.len() as u64;
            continue;
        }
        for c in part.chars() {
            if is_cjk(c) {
                cjk += 1;
            } else {
                other_bytes += c.len_utf8() as u64;
            }
        }
    }
    cjk + other_bytes.div_ceil(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_is_ceil_bytes_over_four() {
        assert_eq!(estimate(&[]), 0);
        assert_eq!(estimate(&[""]), 0);
        assert_eq!(estimate(&["a"]), 1);
        assert_eq!(estimate(&["abcd"]), 1);
        assert_eq!(estimate(&["abcde"]), 2);
        assert_eq!(estimate(&["abc", "de"]), 2);
    }

    #[test]
    fn cjk_counts_one_each() {
        assert_eq!(estimate(&["你好"]), 2);
        assert_eq!(estimate(&["\"你好\""]), 3); // 2 CJK + ceil(2/4)
        assert_eq!(estimate(&["한국어"]), 3);
        assert_eq!(estimate(&["カタカナ"]), 4);
        assert_eq!(estimate(&["ｱ"]), 1); // U+FF71 halfwidth katakana
                                         // é is not CJK: 2 bytes; plus "ab" 2 bytes = 4 bytes -> 1
        assert_eq!(estimate(&["abé"]), 1);
        assert_eq!(estimate(&["😀"]), 1); // 4 bytes
        assert_eq!(estimate(&["😀a"]), 2);
    }

    #[test]
    fn ranges_edges() {
        for c in [
            '\u{1100}', '\u{11FF}', '\u{2E80}', '\u{9FFF}', '\u{A960}', '\u{A97F}', '\u{AC00}',
            '\u{D7AF}', '\u{F900}', '\u{FAFF}', '\u{FF00}', '\u{FFEF}',
        ] {
            assert!(is_cjk(c), "{:X}", c as u32);
        }
        for c in [
            '\u{10FF}', '\u{1200}', '\u{2E7F}', '\u{A000}', '\u{A95F}', '\u{D7B0}', '\u{FFF0}',
        ] {
            assert!(!is_cjk(c), "{:X}", c as u32);
        }
    }
}
