//! The cache's keys and value encoding (docs/spec.md §6); the host layer stores them in shared data.
//!
//! Direct-mapped: a key's slot is `hash % entries`, so at most `entries` keys ever exist,
//! however many distinct prompts arrive. A slot stores the full 128-bit hash, so a
//! collision reads as a miss, never as a wrong count.

use super::tokenize::Reply;

const PREFIX: &str = "incontext.v1.";

/// The shared-data key of the slot for `hash`.
pub fn slot_key(hash: u128, entries: u32) -> String {
    format!("{PREFIX}count.{}", slot(hash, entries))
}

/// The slot of `hash` in a table of `entries` slots (at least one), as a number that prints
/// fast.
pub fn slot(hash: u128, entries: u32) -> u32 {
    let n = entries.max(1);
    // Below `n`, so it fits.
    u32::try_from(hash % u128::from(n)).unwrap_or_default()
}

/// The shared-data key of the context length learned for `model` behind the tokenizer route
/// `scope` (backend, cluster, authority, path). Envoy shares one VM's shared data between
/// every filter configuration with the same `vm_id`: the scope keeps two listeners in front of
/// two servers that serve the same model name apart.
pub fn model_key(scope: &str, model: &str) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&(scope.len() as u64).to_le_bytes());
    h.update(scope.as_bytes());
    h.update(model.as_bytes());
    format!("{PREFIX}max_model_len.{:032x}", h.digest128())
}

pub fn encode(hash: u128, reply: Reply) -> [u8; 32] {
    let mut out = [0u8; 32];
    out[..16].copy_from_slice(&hash.to_le_bytes());
    out[16..24].copy_from_slice(&reply.count.to_le_bytes());
    out[24..].copy_from_slice(&reply.max_model_len.to_le_bytes());
    out
}

/// The stored reply, if the slot holds this very hash.
pub fn decode(hash: u128, value: &[u8]) -> Option<Reply> {
    let bytes: &[u8; 32] = value.try_into().ok()?;
    let (stored, rest) = bytes.split_at(16);
    let (count, mml) = rest.split_at(8);
    if u128::from_le_bytes(stored.try_into().ok()?) != hash {
        return None;
    }
    Some(Reply {
        count: u64::from_le_bytes(count.try_into().ok()?),
        max_model_len: u64::from_le_bytes(mml.try_into().ok()?),
    })
}

/// A learned context length and when it was learned (the host's clock, ms).
pub fn encode_context(c: u64, at_ms: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&c.to_le_bytes());
    out[8..].copy_from_slice(&at_ms.to_le_bytes());
    out
}

pub fn decode_context(value: &[u8]) -> Option<(u64, u64)> {
    let bytes: &[u8; 16] = value.try_into().ok()?;
    let (c, at) = bytes.split_at(8);
    let c = u64::from_le_bytes(c.try_into().ok()?);
    (c > 0).then_some((c, u64::from_le_bytes(at.try_into().ok()?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_collision() {
        let r = Reply {
            count: 1234,
            max_model_len: 32768,
        };
        let v = encode(42, r);
        assert_eq!(decode(42, &v), Some(r));
        assert_eq!(decode(43, &v), None);
        assert_eq!(decode(42, &v[..31]), None);
        assert_eq!(decode_context(&encode_context(512, 7)), Some((512, 7)));
        assert_eq!(decode_context(&encode_context(0, 7)), None);
        assert_eq!(decode_context(b"abc"), None);
    }

    #[test]
    fn slots_are_bounded() {
        let mut keys: Vec<String> = (0u128..10_000)
            .map(|h| slot_key(h.wrapping_mul(0x9E3779B97F4A7C15), 16))
            .collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), 16);
        assert_ne!(model_key("r", "a"), model_key("r", "b"));
        assert_ne!(
            model_key("vllm|a|a|/tokenize", "m"),
            model_key("vllm|b|b|/tokenize", "m")
        );
        assert_ne!(model_key("ab", "c"), model_key("a", "bc"));
    }
}
