//! A message sent again with some of its text blocks left out (docs/spec.md §15b): Qwen Code
//! sends its newest user message with the date as a block of its own and leaves that block
//! out once a newer message comes. The filter keeps, under the link of the messages before a
//! conversation's last message, that conversation's last link and the message's texts; a
//! later conversation whose message at that place is a shorter subsequence of them is bounded
//! by the earlier conversation's anchor and RESHAPE more.

use crate::bound::Chain;
use crate::dialect::canonical::Texts;
use crate::dialect::Form;
use std::ops::Range;

/// What a message sent again with some of its text blocks left out may render beyond the
/// tokens it rendered to before: the tokens at the seam where a block was, which the
/// tokenizer may split otherwise (docs/spec.md §15b).
pub const RESHAPE: u64 = 8;
/// A message is told block by block up to this many blocks.
pub const MAX_TEXTS: usize = 16;
const LAST: &str = "incontext.v1.last.";

/// What a conversation's last message was, kept under the link of the messages before it: the
/// link of the whole conversation (whose anchor counts it) and the message's texts. A later
/// turn that sends that message again with blocks left out finds its count through it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Last {
    pub link: u128,
    pub texts: Texts,
}

/// The shared-data key of the slot for the conversation before `link`'s last message.
pub fn key(before: u128, entries: u32) -> String {
    format!("{LAST}{}", crate::cache::slot(before, entries))
}

pub fn encode(before: u128, last: &Last) -> Vec<u8> {
    let mut out = Vec::with_capacity(40 + 8 * last.texts.texts.len());
    out.extend_from_slice(&before.to_le_bytes());
    out.extend_from_slice(&last.link.to_le_bytes());
    out.extend_from_slice(&last.texts.shape.to_le_bytes());
    for t in &last.texts.texts {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out
}

/// The stored last message, if the slot holds this very link.
pub fn decode(before: u128, value: &[u8]) -> Option<Last> {
    let (head, texts) = value.split_at_checked(40)?;
    if u128::from_le_bytes(head.get(..16)?.try_into().ok()?) != before
        || texts.len() % 8 != 0
        || texts.len() > 8 * MAX_TEXTS
    {
        return None;
    }
    let u64_at = |b: &[u8]| b.try_into().ok().map(u64::from_le_bytes);
    Some(Last {
        link: u128::from_le_bytes(head.get(16..32)?.try_into().ok()?),
        texts: Texts {
            shape: u64_at(head.get(32..40)?)?,
            texts: texts.chunks(8).map(u64_at).collect::<Option<_>>()?,
        },
    })
}

/// The last message of a conversation of at least two messages, to keep (see [`Last`]):
/// the link before it, and what to keep; `None` where it is not told block by block or has
/// fewer than two blocks (none could be left out and leave a message).
pub fn last(form: Form, body: &[u8], chain: &Chain) -> Option<(u128, Last)> {
    let n = chain.links.len();
    let before = *chain.links.get(n.checked_sub(2)?)?;
    let raw = body.get(chain.items.get(n - 1)?.clone())?;
    // Blocks are text blocks: a message without one has nothing to leave out.
    memchr::memmem::find(raw, b"\"text\"")?;
    let texts = crate::dialect::canonical::texts(form.canon(), raw)?;
    let link = *chain.links.get(n - 1)?;
    (2..=MAX_TEXTS)
        .contains(&texts.texts.len())
        .then_some((before, Last { link, texts }))
}

/// The texts message `k − 1` of this conversation leaves out, where it is the last message
/// kept as `last` with some of its blocks left out; `None` where it is not.
pub fn left_out(form: Form, body: &[u8], chain: &Chain, k: usize, last: &Last) -> Option<Vec<u64>> {
    let raw = body.get(chain.items.get(k.checked_sub(1)?)?.clone())?;
    let texts = crate::dialect::canonical::texts(form.canon(), raw)?;
    texts
        .leaves_out(&last.texts)
        .then(|| texts.left_out(&last.texts))
}

/// The tail `items` as a JSON array with the blocks `left` (left out of an earlier message)
/// left out of the newest tail message that carries them all as blocks of its own: Qwen Code
/// moves its date reminder from the message before to the newest one. The earlier message's
/// count still holds those blocks, so the tail's count without them keeps the bound tight: a
/// cap may be written from it (docs/spec.md §15b). `None` where no tail message carries them.
pub fn moved_tail(
    form: Form,
    body: &[u8],
    items: &[Range<usize>],
    left: &[u64],
) -> Option<Vec<u8>> {
    if left.is_empty() {
        return None;
    }
    let (at, moved) = items.iter().enumerate().rev().find_map(|(i, r)| {
        let raw = body.get(r.clone())?;
        crate::dialect::canonical::without(form.canon(), raw, left).map(|m| (i, m))
    })?;
    let mut out = Vec::with_capacity(items.iter().map(|r| r.len() + 1).sum::<usize>() + 2);
    out.push(b'[');
    for (i, r) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match i == at {
            true => out.extend_from_slice(&moved),
            false => out.extend_from_slice(body.get(r.clone())?),
        }
    }
    out.push(b']');
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_last_message_decodes_for_its_own_link_only() {
        let last = Last {
            link: 9,
            texts: Texts {
                shape: 3,
                texts: vec![1, 2],
            },
        };
        let stored = encode(7, &last);
        assert_eq!(stored.len(), 40 + 16);
        assert_eq!(decode(7, &stored), Some(last.clone()));
        assert_eq!(decode(8, &stored), None, "a collision reads as a miss");
        assert_eq!(decode(7, &stored[..stored.len() - 1]), None);
        let too_many = Last {
            link: 9,
            texts: Texts {
                shape: 3,
                texts: vec![1; MAX_TEXTS + 1],
            },
        };
        assert_eq!(decode(7, &encode(7, &too_many)), None);
    }
}
