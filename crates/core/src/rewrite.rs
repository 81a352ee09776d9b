//! The body rewrite as a splice (docs/spec.md §2): cap members are removed and exactly one integer
//! cap is written; every byte of every other member, and the text around them, is kept.

use crate::json::scan::Member;
use std::borrow::Cow;

/// A rewrite as an edit of the body's head: replace `body[..end]` by `body[..keep]` followed
/// by `tail`; the rest of the body is unchanged. Envoy replaces a buffer's head without
/// copying the rest (`proxy_set_buffer_bytes(0, end, head)` drains `end` bytes and prepends),
/// so the cost is that of the head only; and when `tail` fits where it goes, the head is the
/// body's own bytes, patched in place ([`Edit::patch`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    /// The end of the body's head that is replaced.
    pub end: usize,
    /// How much of the body's head stays as it is.
    pub keep: usize,
    /// What follows the kept bytes in the new head.
    pub tail: Vec<u8>,
}

impl Edit {
    /// The new head: what replaces `body[..end]`.
    pub fn head(&self, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.keep + self.tail.len());
        out.extend_from_slice(body.get(..self.keep).unwrap_or_default());
        out.extend_from_slice(&self.tail);
        out
    }

    /// The new head written over the body's own bytes, without a copy of the kept part, when
    /// the tail fits before `end` (a cap value replaced by one no longer: nearly always).
    /// `None` (body untouched) otherwise.
    pub fn patch<'a>(&self, body: &'a mut [u8]) -> Option<&'a [u8]> {
        let len = self.patch_in_place(body)?;
        body.get(..len)
    }

    /// What replaces `body[..end]`: patched over `body` when it fits there, else built.
    pub fn write_head<'a>(&self, body: &'a mut [u8]) -> Cow<'a, [u8]> {
        let patched = self.patch_in_place(body);
        let body: &'a [u8] = body;
        // `patch_in_place` wrote `body[keep..len]` inside `body[..end]`.
        match patched.and_then(|len| body.get(..len)) {
            Some(head) => Cow::Borrowed(head),
            None => Cow::Owned(self.head(body)),
        }
    }

    /// Writes the tail over `body[keep..end]` when it fits; the length of the new head.
    fn patch_in_place(&self, body: &mut [u8]) -> Option<usize> {
        let at = body.get_mut(self.keep..self.end)?;
        at.get_mut(..self.tail.len())?.copy_from_slice(&self.tail);
        Some(self.keep + self.tail.len())
    }

    /// The whole rewritten body.
    pub fn apply(&self, body: &[u8]) -> Vec<u8> {
        let mut out = self.head(body);
        out.extend_from_slice(body.get(self.end..).unwrap_or_default());
        out
    }
}

/// The new head as it is written: bytes copied from the body in order from its start only
/// extend the kept part; from the first other write on, everything goes to the tail.
struct HeadWriter<'a> {
    body: &'a [u8],
    keep: usize,
    tail: Vec<u8>,
}

impl HeadWriter<'_> {
    fn copy(&mut self, range: std::ops::Range<usize>) {
        if self.tail.is_empty() && range.start == self.keep {
            self.keep = range.end;
        } else {
            self.tail
                .extend_from_slice(self.body.get(range).unwrap_or_default());
        }
    }

    fn write(&mut self, bytes: &[u8]) {
        self.tail.extend_from_slice(bytes);
    }
}

/// Rewrites `body` (a JSON object whose members are `members`): drops every member whose
/// index is in `drop`, and writes `"field":value` — in place of member `target` when given
/// (keeping its key text and spacing when the name is unchanged), else as the first member.
/// Only the head of the body up to the last member changed is rebuilt.
/// With `replace`, member `replace.0` also gets the new value `replace.1` (kept where it is,
/// with its key and spacing).
pub fn splice_edit(
    body: &[u8],
    members: &[Member],
    drop: &[usize],
    target: Option<usize>,
    field: &str,
    value: u64,
    replace: Option<(usize, &[u8])>,
) -> Edit {
    let number = value.to_string();
    let open = match members.first() {
        Some(m) => m.key_start,
        // An empty object: write right after the opening brace.
        None => body
            .iter()
            .position(|b| *b == b'{')
            .map_or(body.len(), |i| i + 1),
    };
    // The end of the last member that changes; everything after it stays as it is.
    let last = drop
        .iter()
        .copied()
        .chain(target)
        .chain(replace.map(|r| r.0))
        .filter_map(|i| members.get(i).map(|m| (i, m.value.end)))
        .max_by_key(|(_, end)| *end);
    let end = last.map_or(open, |(_, end)| end);
    let mut out = HeadWriter {
        body,
        keep: 0,
        tail: Vec::with_capacity(field.len() + number.len() + 4),
    };
    out.copy(0..open);
    let mut wrote_any = false;
    if target.is_none() {
        write_key(&mut out, field);
        out.write(number.as_bytes());
        wrote_any = true;
    }
    let mut prev_end = open;
    for (i, m) in members.iter().enumerate() {
        if m.value.end > end {
            break;
        }
        // Before the first member there is no separator in the body: after an inserted
        // member it needs a comma.
        let separator = prev_end..m.key_start;
        let first = i == 0;
        prev_end = m.value.end;
        let is_target = target == Some(i);
        if drop.contains(&i) && !is_target {
            continue;
        }
        if wrote_any {
            if first {
                out.write(b",");
            } else {
                out.copy(separator);
            }
        }
        wrote_any = true;
        if is_target {
            let quoted_len = field.len() + 2;
            let key_text = body.get(m.key_start..m.key_start + quoted_len);
            if m.key == field
                && key_text.and_then(|k| k.get(1..quoted_len - 1)) == Some(field.as_bytes())
            {
                // Same name written plainly: keep key and spacing, replace the value only.
                out.copy(m.key_start..m.value.start);
            } else {
                write_key(&mut out, field);
            }
            out.write(number.as_bytes());
        } else if let Some((_, new_value)) = replace.filter(|r| r.0 == i) {
            out.copy(m.key_start..m.value.start);
            out.write(new_value);
        } else {
            out.copy(m.key_start..m.value.end);
        }
    }
    // A new first member before members that follow unchanged needs its comma.
    if target.is_none() && last.is_none() && !members.is_empty() {
        out.write(b",");
    }
    Edit {
        end,
        keep: out.keep,
        tail: out.tail,
    }
}

/// The whole rewritten body (see [`splice_edit`]).
pub fn splice(
    body: &[u8],
    members: &[Member],
    drop: &[usize],
    target: Option<usize>,
    field: &str,
    value: u64,
) -> Vec<u8> {
    splice_edit(body, members, drop, target, field, value, None).apply(body)
}

fn write_key(out: &mut HeadWriter, field: &str) {
    out.write(b"\"");
    out.write(field.as_bytes());
    out.write(b"\":");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::scan::scan;

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
            r#"{"max_tokens":7,"a":1}"#
        );
    }

    #[test]
    fn inserts_when_absent() {
        assert_eq!(
            run("{\"a\":1}\n", &[], None, "max_tokens", 7),
            "{\"max_tokens\":7,\"a\":1}\n"
        );
        assert_eq!(
            run("{\"a\":1 \n}", &[], None, "max_tokens", 7),
            "{\"max_tokens\":7,\"a\":1 \n}"
        );
        assert_eq!(
            run(" { } ", &[], None, "max_tokens", 7),
            " {\"max_tokens\":7 } "
        );
        assert_eq!(
            run(r#"{"max_tokens":0}"#, &[0], None, "max_tokens", 7),
            r#"{"max_tokens":7}"#
        );
        assert_eq!(
            run(
                r#"{"model":"m", "a":[1],"max_tokens":false}"#,
                &[2],
                None,
                "max_tokens",
                7
            ),
            r#"{"max_tokens":7,"model":"m", "a":[1]}"#
        );
        assert_eq!(
            run(r#"{"model":"m","messages":[]}"#, &[], None, "max_tokens", 7),
            r#"{"max_tokens":7,"model":"m","messages":[]}"#
        );
    }

    #[test]
    fn edit_covers_only_the_head() {
        let body =
            r#"{"model":"m","max_tokens":65536,"messages":[{"role":"user","content":"long"}]}"#;
        let m = scan(body.as_bytes()).unwrap();
        let e = splice_edit(body.as_bytes(), &m, &[1], Some(1), "max_tokens", 9, None);
        assert_eq!(e.end, body.find(",\"messages\"").unwrap());
        assert_eq!(e.head(body.as_bytes()), br#"{"model":"m","max_tokens":9"#);
        // The value replaced by a shorter one: the head is the body's own bytes up to it.
        assert_eq!((e.keep, e.tail.as_slice()), (e.end - 5, &b"9"[..]));
        let mut patched = body.as_bytes().to_vec();
        assert_eq!(
            e.patch(&mut patched),
            Some(&br#"{"model":"m","max_tokens":9"#[..])
        );
        // no cap: the new member goes first, nothing else is rebuilt
        let body = r#"{"messages":[]}"#;
        let m = scan(body.as_bytes()).unwrap();
        let e = splice_edit(body.as_bytes(), &m, &[], None, "max_tokens", 9, None);
        assert_eq!(
            (e.head(body.as_bytes()).as_slice(), e.end),
            (&br#"{"max_tokens":9,"#[..], 1)
        );
        // No room to write it in place: the head must be built.
        assert_eq!(e.patch(&mut body.as_bytes().to_vec()), None);
        assert_eq!(
            e.apply(body.as_bytes()),
            br#"{"max_tokens":9,"messages":[]}"#
        );
    }

    #[test]
    fn patch_equals_head_whenever_it_applies() {
        let cases = [
            (
                r#"{"max_tokens" : 65536 , "messages":[]}"#,
                &[0][..],
                Some(0),
                "max_tokens",
            ),
            (
                r#"{"max_tokens":1,"messages":[]}"#,
                &[0][..],
                Some(0),
                "max_tokens",
            ),
            (
                r#"{"a":1,"max_completion_tokens":400,"max_tokens":300}"#,
                &[1, 2][..],
                Some(2),
                "max_tokens",
            ),
            (
                r#"{"a":1,"max_tokens":300,"b":2}"#,
                &[1][..],
                Some(1),
                "max_completion_tokens",
            ),
        ];
        for (body, drop, target, field) in cases {
            let m = scan(body.as_bytes()).unwrap();
            for value in [7, 4321, 123456] {
                let e = splice_edit(body.as_bytes(), &m, drop, target, field, value, None);
                let head = e.head(body.as_bytes());
                assert_eq!(
                    e.write_head(&mut body.as_bytes().to_vec()).as_ref(),
                    head.as_slice()
                );
                let mut bytes = body.as_bytes().to_vec();
                match e.patch(&mut bytes) {
                    Some(patched) => assert_eq!(patched, head.as_slice(), "{body} {value}"),
                    None => {
                        assert!(e.tail.len() > e.end - e.keep, "{body} {value}");
                        assert_eq!(bytes, body.as_bytes(), "untouched");
                    }
                }
                let mut whole = head.clone();
                whole.extend_from_slice(&body.as_bytes()[e.end..]);
                assert_eq!(whole, e.apply(body.as_bytes()));
            }
        }
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
