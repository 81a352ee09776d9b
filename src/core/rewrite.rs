//! The body rewrite as a splice (SPEC §2): cap members are removed and exactly one integer
//! cap is written; every byte of every other member, and the text around them, is kept.

use super::scan::Member;

/// Rewrites `body` (a JSON object whose members are `members`): drops every member whose
/// index is in `drop`, and writes `"field":value` — in place of member `target` when given
/// (keeping its key text and spacing when the name is unchanged), else after the last member.
pub fn splice(
    body: &[u8],
    members: &[Member],
    drop: &[usize],
    target: Option<usize>,
    field: &str,
    value: u64,
) -> Vec<u8> {
    let number = value.to_string();
    let mut out = Vec::with_capacity(body.len() + field.len() + number.len() + 4);
    let open = match members.first() {
        Some(m) => m.key_start,
        // An empty object: write right after the opening brace.
        None => body
            .iter()
            .position(|b| *b == b'{')
            .map_or(body.len(), |i| i + 1),
    };
    out.extend_from_slice(&body[..open]);
    let mut wrote_any = false;
    let mut prev_end = open;
    for (i, m) in members.iter().enumerate() {
        let separator = &body[prev_end..m.key_start];
        prev_end = m.value.end;
        let is_target = target == Some(i);
        if drop.contains(&i) && !is_target {
            continue;
        }
        if wrote_any {
            out.extend_from_slice(separator);
        }
        wrote_any = true;
        if is_target {
            let quoted_len = field.len() + 2;
            let key_text = body.get(m.key_start..m.key_start + quoted_len);
            if m.key == field && key_text.is_some_and(|k| &k[1..quoted_len - 1] == field.as_bytes())
            {
                // Same name written plainly: keep key and spacing, replace the value only.
                out.extend_from_slice(&body[m.key_start..m.value.start]);
            } else {
                write_key(&mut out, field);
            }
            out.extend_from_slice(number.as_bytes());
        } else {
            out.extend_from_slice(&body[m.key_start..m.value.end]);
        }
    }
    if target.is_none() {
        if wrote_any {
            out.push(b',');
        }
        write_key(&mut out, field);
        out.extend_from_slice(number.as_bytes());
    }
    out.extend_from_slice(&body[members.last().map_or(open, |m| m.value.end)..]);
    out
}

fn write_key(out: &mut Vec<u8>, field: &str) {
    out.push(b'"');
    out.extend_from_slice(field.as_bytes());
    out.extend_from_slice(b"\":");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::scan::scan;

    fn run(body: &str, drop: &[usize], target: Option<usize>, field: &str, value: u64) -> String {
        let m = scan(body.as_bytes()).unwrap();
        String::from_utf8(splice(body.as_bytes(), &m, drop, target, field, value)).unwrap()
    }

    #[test]
    fn replaces_value_in_place() {
        assert_eq!(
            run(
                r#"{"model":"m", "max_tokens" : 65536 ,"stream":true}"#,
                &[1],
                Some(1),
                "max_tokens",
                100
            ),
            r#"{"model":"m", "max_tokens" : 100 ,"stream":true}"#
        );
    }

    #[test]
    fn renames_when_field_changes() {
        assert_eq!(
            run(
                r#"{"messages":[],"max_output_tokens":9}"#,
                &[1],
                Some(1),
                "max_tokens",
                5
            ),
            r#"{"messages":[],"max_tokens":5}"#
        );
        // escaped key is rewritten plainly
        assert_eq!(
            run(r#"{"max\u005ftokens":9}"#, &[0], Some(0), "max_tokens", 5),
            r#"{"max_tokens":5}"#
        );
    }

    #[test]
    fn drops_other_caps_keeping_separators() {
        assert_eq!(
            run(
                r#"{ "max_tokens":1,  "a":1, "max_completion_tokens":2 , "b":2,"max_output_tokens":3 }"#,
                &[0, 2, 4],
                Some(2),
                "max_completion_tokens",
                2
            ),
            r#"{ "a":1, "max_completion_tokens":2 , "b":2 }"#
        );
        assert_eq!(
            run(r#"{"max_tokens":false,"a":1}"#, &[0], None, "max_tokens", 7),
            r#"{"a":1,"max_tokens":7}"#
        );
    }

    #[test]
    fn inserts_when_absent() {
        assert_eq!(
            run("{\"a\":1}\n", &[], None, "max_tokens", 7),
            "{\"a\":1,\"max_tokens\":7}\n"
        );
        assert_eq!(
            run("{\"a\":1 \n}", &[], None, "max_tokens", 7),
            "{\"a\":1,\"max_tokens\":7 \n}"
        );
        assert_eq!(
            run(" { } ", &[], None, "max_tokens", 7),
            " {\"max_tokens\":7 } "
        );
        assert_eq!(
            run(r#"{"max_tokens":0}"#, &[0], None, "max_tokens", 7),
            r#"{"max_tokens":7}"#
        );
    }

    #[test]
    fn rewriting_twice_equals_once() {
        let body = r#"{"a" : [1, 2], "max_output_tokens":"99", "z":{}}"#;
        let once = run(body, &[1], Some(1), "max_tokens", 50);
        let m = scan(once.as_bytes()).unwrap();
        let idx = m.iter().position(|m| m.key == "max_tokens").unwrap();
        let twice = String::from_utf8(splice(
            once.as_bytes(),
            &m,
            &[idx],
            Some(idx),
            "max_tokens",
            50,
        ))
        .unwrap();
        assert_eq!(once, twice);
        assert_eq!(once, r#"{"a" : [1, 2], "max_tokens":50, "z":{}}"#);
    }
}
