//! Tokenizer reply contract (docs/spec.md §5): `check_status`, `parse_reply` and
//! `check_context` on any status and body never panic; non-2xx statuses map to their failure
//! kinds; `Ok` only for a 2xx JSON object whose `count` is a non-negative integer and
//! `max_model_len` a positive integer equal to the configured C; valid JSON is never called
//! `BadJson`; a reply meeting the contract is accepted.
//!
//! Input: byte 0 picks the status family, byte 1 the configured context length, the rest is
//! the body (see fuzz/README.md).
#![no_main]

mod common;

use common::{json_value, show};
use incontext_core::json::scan::scan;
use incontext_core::tokenize::{check_context, check_status, parse_reply, Failure, Reply};
use libfuzzer_sys::fuzz_target;

fn check(data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    let (h, body) = data.split_at(2);
    let status = match h[0] {
        0..=159 => Some(200),
        160..=179 => Some(200 + u16::from(h[0] - 160) * 5), // 200..295
        180..=189 => None,
        190..=199 => Some(504),
        b => Some(u16::from(b) * 4), // 800..1020 and friends
    };
    let context = match h[1] {
        0..=127 => None,
        128..=191 => Some(512),
        192..=250 => Some(32768),
        b => Some(u64::from(b)),
    };
    // What the flow does with an answer: the status gate, the body, then C.
    let got = check_status(status).and_then(|()| {
        let reply = parse_reply(body)?;
        check_context(reply.max_model_len, context)?;
        Ok(reply)
    });
    let ctx = || format!("status {status:?}, C {context:?}, body {}", show(body));

    match status {
        None => return assert_eq!(got, Err(Failure::Transport), "{}", ctx()),
        Some(504) => return assert_eq!(got, Err(Failure::Timeout), "{}", ctx()),
        Some(s) if !(200..300).contains(&s) => {
            return assert_eq!(got, Err(Failure::Status), "{}", ctx())
        }
        Some(_) => {}
    }

    let value = json_value(body);
    match got {
        Ok(Reply {
            count,
            max_model_len,
        }) => {
            assert!(max_model_len > 0, "{}", ctx());
            // Only a JSON object is a reply (docs/spec.md §5); a derived struct alone would also take
            // a two-element array `[count, max_model_len]`.
            let first = body.iter().find(|b| !b" \t\r\n".contains(b));
            if first != Some(&b'{') {
                panic!("non-object reply accepted as {got:?}: {}", ctx());
            }
            assert_eq!(check_context(max_model_len, context), Ok(()));
            if let Some(c) = context {
                assert_eq!(c, max_model_len, "{}", ctx());
            }
            match value {
                Err(e) => panic!("accepted a body that is not JSON ({e}): {}", ctx()),
                Ok(None) => {}
                Ok(Some(v)) => {
                    assert!(v["count"].is_u64(), "count not an integer: {}", ctx());
                    assert_eq!(v["count"].as_u64(), Some(count), "{}", ctx());
                    assert!(v["max_model_len"].is_u64(), "{}", ctx());
                    assert_eq!(
                        v["max_model_len"].as_u64(),
                        Some(max_model_len),
                        "{}",
                        ctx()
                    );
                }
            }
        }
        Err(f) => {
            assert!(
                matches!(f, Failure::BadJson | Failure::Contract | Failure::Mismatch),
                "{f:?} for a 2xx reply: {}",
                ctx()
            );
            if let Ok(Some(v)) = &value {
                assert_ne!(f, Failure::BadJson, "valid JSON called bad: {}", ctx());
                // A reply that meets the contract is refused only for a mismatch with C, or
                // when it repeats `count` / `max_model_len` (a duplicate key is refused).
                let meets =
                    v["count"].is_u64() && v["max_model_len"].as_u64().is_some_and(|m| m > 0);
                if meets {
                    let mml = v["max_model_len"].as_u64().expect("checked");
                    let dup = scan(body).is_ok_and(|m| {
                        m.iter().filter(|m| m.key == "count").count() > 1
                            || m.iter().filter(|m| m.key == "max_model_len").count() > 1
                    });
                    assert!(
                        dup || (f == Failure::Mismatch && context.is_some_and(|c| c != mml)),
                        "contract-conforming reply refused as {f:?}: {}",
                        ctx()
                    );
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| check(data));
