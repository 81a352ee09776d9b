//! A rewrite written over Envoy's slices of the held body, in place, and what happens when
//! it cannot be.

use super::*;

/// A request counted at `count` tokens whose rewrite is written over Envoy's slices of
/// `slice` bytes (0: one slice), with `fault` set on the fake before the answer.
fn rewritten(body: &[u8], slice: usize, fault: fn(&mut Fake)) -> (Fake, Vec<String>) {
    let (shared, names) = shared(CONFIG);
    let mut f = post(body);
    f.slice = slice;
    let mut s = Stream::new(shared);
    assert_eq!(s.request_headers(&mut f, false), HeadStatus::Stop);
    assert_eq!(send_body(&mut s, &mut f, body), DataStatus::Buffer);
    fault(&mut f);
    s.callout_done(&mut f, 7, &answer(&tokenizer_answer(1000)));
    assert_eq!(f.resumed, 1);
    (f, names)
}

/// Two caps, the rewrite drops one and writes the other: around the messages (`around`: the
/// edit spans the body), or both after them (the kept part, the messages, moves across every
/// slice boundary). `tag` makes the prompt its own: the count table is the
/// process's.
fn two_caps(tag: &str, around: bool) -> Vec<u8> {
    let messages = format!(
        r#""messages": [{{"role": "user", "content": "{tag}{}"}}]"#,
        " in place".repeat(40)
    );
    let body = if around {
        format!(
            r#"{{"max_tokens": 100000, "model": "m", {messages}, "max_completion_tokens" : 90000, "stream": false}}"#
        )
    } else {
        format!(
            r#"{{"model": "m", {messages}, "max_tokens": 100000, "stream": false, "max_completion_tokens" : 90000}}"#
        )
    };
    body.into_bytes()
}

#[test]
fn a_rewrite_is_written_in_place_over_any_slicing_with_the_bytes_of_a_whole_one() {
    for around in [true, false] {
        let body = two_caps(if around { "wa0000" } else { "wb0000" }, around);
        // One slice: written in place too; its bytes are checked against the rule here.
        let (whole, _) = rewritten(&body, 0, |_| {});
        let text = String::from_utf8(whole.request_body.clone()).unwrap();
        let source = String::from_utf8(body.clone()).unwrap();
        let want = if around {
            source
                .replace(r#""max_tokens": 100000, "#, "")
                .replace(": 90000", ": 31768")
        } else {
            source
                .replace(r#", "max_tokens": 100000"#, "")
                .replace(": 90000", ": 31768")
        };
        assert_eq!(text, want);
        in_place_over_slices(&text, around);
    }
}

/// `whole` (a rewrite written over one slice) again over slices of many sizes.
fn in_place_over_slices(whole: &str, around: bool) {
    let first = if around { "wa0000" } else { "wb0000" };
    for slice in [1, 2, 3, 7, 16, 63, 64, 100, 4096] {
        let tag = format!("{}{slice:04}", &first[..2]);
        let (f, names) = rewritten(&two_caps(&tag, around), slice, |_| {});
        assert_eq!(
            String::from_utf8(f.request_body.clone()).unwrap(),
            whole.replace(first, &tag),
            "slices of {slice}"
        );
        assert_counted_rewrite(&names, &f);
    }
}

#[test]
fn a_cap_replaced_by_one_as_long_is_written_over_its_digits_alone() {
    for slice in [0, 1, 3, 7, 64, 4096] {
        let tag = format!("same{slice:04}");
        let messages = format!(
            r#"[{{"role": "user", "content": "{tag}{}"}}]"#,
            " x".repeat(90)
        );
        let body = format!(r#"{{"model": "m", "messages": {messages}, "max_tokens": 90000}}"#);
        let (f, names) = rewritten(body.as_bytes(), slice, |f| f.refuse_drain = true);
        // The same length: nothing drained (the fake refuses any drain), only the digits.
        assert_eq!(
            String::from_utf8(f.request_body.clone()).unwrap(),
            body.replace(": 90000", ": 31768"),
            "slices of {slice}"
        );
        assert_counted_rewrite(&names, &f);
    }
}

#[test]
fn a_rewrite_in_place_sets_the_content_length_only_when_it_changes() {
    // (cap as sent, the Content-Length it declares is kept, request headers set)
    for (k, (cap, kept, sets)) in [("32000", true, 0), ("100000", false, 1)]
        .into_iter()
        .enumerate()
    {
        let body = format!(
            r#"{{"model": "m", "messages": [{{"role": "user", "content": "length {k}"}}], "max_tokens": {cap}}}"#
        );
        let (f, _) = rewritten(body.as_bytes(), 7, |_| {});
        let sent: serde_json::Value = serde_json::from_slice(&f.request_body).unwrap();
        assert_eq!(sent["max_tokens"], 32768 - 1000, "cap {cap}");
        assert_eq!(f.request_body.len() == body.len(), kept, "cap {cap}");
        assert_eq!(
            header(&f.request_headers, "content-length"),
            Some(f.request_body.len().to_string().as_str()),
            "cap {cap}"
        );
        assert_eq!(f.request_sets, sets, "cap {cap}");
    }
}

#[test]
fn a_rewrite_that_does_not_fit_in_place_replaces_the_body_whole() {
    // No cap: `max_tokens` is written where there was none.
    let body = serde_json::to_vec(&serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": "no cap, so no room in place"}],
    }))
    .unwrap();
    let (f, _) = rewritten(&body, 5, |_| {});
    let sent: serde_json::Value = serde_json::from_slice(&f.request_body).unwrap();
    assert_eq!(sent["max_tokens"], 32768 - 1000);
    assert_eq!(
        f.request_body.len(),
        body.len() + r#""max_tokens":31768,"#.len()
    );
    assert_eq!(
        header(&f.request_headers, "content-length"),
        Some(f.request_body.len().to_string().as_str())
    );
}

#[test]
fn a_rewrite_envoy_refuses_leaves_the_body_and_its_length_as_they_came() {
    let faults: [fn(&mut Fake); 2] = [|f| f.refuse_slices = true, |f| f.refuse_drain = true];
    for (k, (fault, around)) in faults
        .into_iter()
        .flat_map(|f| [(f, true), (f, false)])
        .enumerate()
    {
        let body = two_caps(&format!("f{k:03}"), around);
        let (f, names) = rewritten(&body, 3, fault);
        assert_eq!(f.request_body, body, "fault {k}");
        assert_eq!(
            header(&f.request_headers, "content-length"),
            Some(body.len().to_string().as_str())
        );
        assert_eq!(
            counted(&names, &f),
            counts(&[
                ("incontext_requests", 1),
                ("incontext_unchanged_internal", 1),
                ("incontext_tokenizer_calls", 1),
                ("incontext_cache_misses", 1),
                ("incontext_count_calls", 1),
            ]),
            "fault {k}"
        );
    }
}
