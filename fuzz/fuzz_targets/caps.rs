//! Caller caps (docs/spec.md §3): `parse_cap` on arbitrary text never panics, returns only values > 0,
//! and agrees with the reference model (fuzz_targets/common) on every input that is one valid
//! JSON value. Metamorphic checks: surrounding JSON white space changes nothing; a plain
//! integer gives the same value as a literal, as a string, as a padded string and with `.0`.
#![no_main]

mod common;

use common::{json_trim, ref_cap, saturating_decimal};
use incontext_core::caps::parse_cap;
use libfuzzer_sys::fuzz_target;
use serde_json::value::RawValue;

fn check(s: &str) {
    let got = parse_cap(s);
    if let Some(v) = got {
        assert!(v > 0, "parse_cap({s:?}) = Some(0)");
    }

    // Pure ASCII digits: the saturating decimal value, or invalid when 0.
    let t = json_trim(s);
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        let want = saturating_decimal(t);
        assert_eq!(got, (want > 0).then_some(want), "digits {s:?}");
        let quoted = format!("\" {t}\\t\"");
        assert_eq!(parse_cap(&quoted), got, "digits as a string {quoted:?}");
        let underscored: String = t
            .chars()
            .enumerate()
            .flat_map(|(i, c)| (i > 0 && i % 3 == 0).then_some('_').into_iter().chain([c]))
            .collect();
        assert_eq!(
            parse_cap(&format!("\"{underscored}\"")),
            got,
            "underscores {underscored:?}"
        );
        assert_eq!(parse_cap(&format!("\"+{t}.00\"")), got, "signed, .00 {t:?}");
        if t.len() <= 15 {
            assert_eq!(parse_cap(&format!("{t}.0")), got, "{t}.0");
        }
        assert_eq!(parse_cap(&format!("-{t}")), None, "-{t}");
    }

    // Any single JSON value: the reference model.
    if serde_json::from_str::<&RawValue>(s).is_ok() {
        assert_eq!(
            got,
            ref_cap(s),
            "parse_cap({s:?}) differs from the reference"
        );
        // Surrounding JSON white space does not matter.
        assert_eq!(parse_cap(&format!(" \r\n{s}\t ")), got, "padded {s:?}");
    }

    // As the content of a JSON string.
    let as_string = serde_json::to_string(s).expect("a str serializes");
    assert_eq!(
        parse_cap(&as_string),
        ref_cap(&as_string),
        "string {as_string:?} differs from the reference"
    );
}

fuzz_target!(|data: &[u8]| check(&String::from_utf8_lossy(data)));
