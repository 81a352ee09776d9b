//! A long prompt seen before, read from Envoy's slices in part (`crate::part`): decided as
//! when read whole, without copying its long values out of Envoy.

use super::*;
use incontext_core::flow::partial;

/// A chat whose `messages` holds three messages of `len` bytes made from `seed`, with
/// `max_tokens` when `cap`.
fn long_chat(seed: &str, len: usize, cap: Option<u64>) -> Vec<u8> {
    let text: String = seed.chars().cycle().take(len).collect();
    let mut body = serde_json::json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": text},
            {"role": "user", "content": text},
            {"role": "user", "content": text},
        ],
    });
    if let Some(cap) = cap {
        body["max_tokens"] = cap.into();
    }
    serde_json::to_vec(&body).unwrap()
}

/// `body` through a new stream, Envoy handing it out in slices of `slice` bytes; a call's
/// answer counts 1000 tokens.
fn through(shared: &Arc<Shared>, body: &[u8], slice: usize) -> Fake {
    let mut f = post(body);
    f.slice = slice;
    let mut s = Stream::new(shared.clone());
    assert_eq!(s.request_headers(&mut f, false), HeadStatus::Stop);
    if send_body(&mut s, &mut f, body) == DataStatus::Buffer {
        s.callout_done(&mut f, 7, &answer(&tokenizer_answer(1000)));
    }
    f
}

fn hit_counts() -> Vec<(String, u64)> {
    counts(&[
        ("incontext_requests", 1),
        ("incontext_rewritten", 1),
        ("incontext_cache_hits", 1),
    ])
}

#[test]
fn a_long_prompt_seen_before_is_decided_on_its_slices_read_in_part() {
    // Each of its own length: a layout is learned for a length.
    for (len, slice) in [(3000, 0), (3001, 1000), (3002, 16_384), (3003, 7)] {
        let (shared, names) = shared(CONFIG);
        let body = long_chat("slices ", len, Some(100_000));
        let first = through(&shared, &body, slice);
        assert_eq!(first.callouts.len(), 1);
        let want: serde_json::Value = serde_json::from_slice(&first.request_body).unwrap();
        assert_eq!(want["max_tokens"], 32768 - 1000);

        // Read whole, a hit: where `messages` lay is learned.
        let whole = through(&shared, &body, slice);
        assert_eq!(whole.reads, 1);
        assert_eq!(whole.request_body, first.request_body);
        let text = serde_json::to_vec(&want["messages"]).unwrap();
        let at = body.windows(text.len()).position(|w| w == text).unwrap();
        assert_eq!(partial::layout(body.len()), vec![at..at + text.len()]);

        // Read in part: never copied whole, the same bytes go on, counted as a hit.
        let part = through(&shared, &body, slice);
        assert_eq!(part.reads, 0, "slices of {slice}");
        assert_eq!(part.request_body, first.request_body);
        assert_eq!(
            header(&part.request_headers, "content-length"),
            Some(part.request_body.len().to_string().as_str())
        );
        assert_eq!(counted(&names, &part), hit_counts());
        assert!(part.callouts.is_empty());
    }
}

/// A cap added where there was none does not fit in place: the body is then read whole and
/// replaced.
#[test]
fn a_rewrite_that_does_not_fit_in_place_reads_the_body_whole() {
    let (shared, names) = shared(CONFIG);
    let body = long_chat("no cap ", 3100, None);
    let first = through(&shared, &body, 1000);
    through(&shared, &body, 1000);
    assert_eq!(partial::layout(body.len()).len(), 1);
    let part = through(&shared, &body, 1000);
    assert_eq!(part.reads, 1, "read whole only to write it");
    assert_eq!(part.request_body, first.request_body);
    let sent: serde_json::Value = serde_json::from_slice(&part.request_body).unwrap();
    assert_eq!(sent["max_tokens"], 32768 - 1000);
    assert_eq!(
        sent["messages"][2]["content"].as_str().map(str::len),
        Some(3100)
    );
    assert_eq!(counted(&names, &part), hit_counts());
}

/// Envoy refuses its slices: the body is read whole, and the rewrite, which needs them, is
/// not written.
#[test]
fn slices_refused_read_the_body_whole() {
    let (shared, names) = shared(CONFIG);
    let body = long_chat("refused ", 3200, Some(100_000));
    through(&shared, &body, 0);
    through(&shared, &body, 0);
    let mut f = post(&body);
    f.refuse_slices = true;
    let mut s = Stream::new(shared.clone());
    assert_eq!(s.request_headers(&mut f, false), HeadStatus::Stop);
    assert_eq!(send_body(&mut s, &mut f, &body), DataStatus::Continue);
    assert_eq!(f.reads, 1);
    assert_eq!(f.request_body, body);
    assert_eq!(
        counted(&names, &f),
        counts(&[
            ("incontext_requests", 1),
            ("incontext_cache_hits", 1),
            ("incontext_unchanged_internal", 1),
        ])
    );
}

/// Another prompt of a length seen before, with the same edges: read in part, it is no hit,
/// so it is read whole and counted.
#[test]
fn a_prompt_of_a_length_seen_before_that_is_no_hit_is_read_whole() {
    let (shared, _) = shared(CONFIG);
    let body = long_chat("length ", 3300, Some(100_000));
    through(&shared, &body, 0);
    through(&shared, &body, 0);
    let mut other = body.clone();
    let at = other.windows(6).position(|w| w == b"length").unwrap() + 1000;
    other[at..at + 6].copy_from_slice(b"LENGTH");
    let f = through(&shared, &other, 0);
    assert_eq!(f.reads, 1);
    assert_eq!(f.callouts.len(), 1, "counted");
    let payload: serde_json::Value = serde_json::from_slice(&f.callouts[0].2).unwrap();
    let content = payload["messages"][0]["content"].as_str().unwrap();
    assert_eq!(content.matches("LENGTH").count(), 1);
}
