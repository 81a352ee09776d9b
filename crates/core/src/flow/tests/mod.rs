//! The flow driven as the glue drives it, over a fake host: one file per part of the flow.

mod answers;
mod count;
mod forms;
mod guess;
mod modules;
mod partial;
mod publish;
mod routes;
mod skip;
pub(crate) mod support;
mod usage;

/// The whole rewritten body is the new head then the rest of the body, whether the head fits
/// over the old one or not.
#[test]
fn a_rewrite_gives_its_whole_body() {
    use super::Rewrite;
    use crate::rewrite::Edit;
    let body = br#"{"max_tokens":100000,"model":"m"}"#.to_vec();
    let end = body.iter().position(|&b| b == b',').unwrap();
    for tail in [&b"7"[..], &b"12345678901234"[..]] {
        let edit = Edit {
            end,
            keep: 14,
            tail: tail.to_vec(),
        };
        let mut want = body[..14].to_vec();
        want.extend_from_slice(tail);
        want.extend_from_slice(&body[end..]);
        let mut by_head = Rewrite {
            body: body.clone(),
            edit: edit.clone(),
        };
        let (e, head) = by_head.head();
        let mut joined = head.into_owned();
        joined.extend_from_slice(&body[e..]);
        assert_eq!(joined, want);
        let whole = Rewrite {
            body: body.clone(),
            edit,
        }
        .into_body();
        assert_eq!(whole, want, "{}", String::from_utf8_lossy(&whole));
    }
}
