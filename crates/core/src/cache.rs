//! The count table's payload (docs/spec.md §6): a prompt's exact count and the context length
//! it came with, in a way of [`crate::table`]'s sets.

use super::table::PAYLOAD;
use super::tokenize::Reply;

/// The slot of `hash` in a table of `entries` slots (at least one), as a number that prints
/// fast.
pub fn slot(hash: u128, entries: u32) -> u32 {
    let n = entries.max(1);
    // Below `n`, so it fits.
    u32::try_from(hash % u128::from(n)).unwrap_or_default()
}

pub fn encode(reply: Reply) -> [u8; PAYLOAD] {
    let mut out = [0u8; PAYLOAD];
    out[..8].copy_from_slice(&reply.count.to_le_bytes());
    out[8..].copy_from_slice(&reply.max_model_len.to_le_bytes());
    out
}

pub fn decode(payload: &[u8; PAYLOAD]) -> Reply {
    let (count, mml) = payload.split_at(8);
    let u64_of = |b: &[u8]| b.try_into().map_or(0, u64::from_le_bytes);
    Reply {
        count: u64_of(count),
        max_model_len: u64_of(mml),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_slots_are_bounded() {
        let r = Reply {
            count: 1234,
            max_model_len: 32768,
        };
        assert_eq!(decode(&encode(r)), r);
        let mut slots: Vec<u32> = (0u128..10_000)
            .map(|h| slot(h.wrapping_mul(0x9E3779B97F4A7C15), 16))
            .collect();
        slots.sort();
        slots.dedup();
        assert_eq!(slots, (0..16).collect::<Vec<_>>());
        assert_eq!(slot(5, 0), 0);
    }
}
