//! The count and anchor tables' sets (docs/spec.md §6): set-associative, each set one
//! shared-data value, read once per lookup and written once per store.
//!
//! A table of `entries` entries has `⌈entries / WAYS⌉` sets of [`WAYS`] ways; a key's set is
//! its 128-bit hash modulo the number of sets, so at most that many values ever exist, however
//! many distinct prompts and conversations arrive. A way keeps the key's whole hash, a
//! 16-byte payload and a stamp: the set's count of stores when the way was last written. A
//! store into a full set replaces the way stored least recently. A table may keep, in each
//! set, a record of 32-bit tags of the keys its last evictions dropped ([`Shape::record`]), so
//! that a lookup that misses can tell a key evicted lately from one never stored.
//!
//! A value that is not a set of this shape (another version's, a torn or foreign one) reads
//! as an empty set: every lookup misses, and the next store starts the set afresh. A store
//! that loses a race with another worker's store into the same set loses one of the two
//! writes (a miss later), never mixes them: each value is written whole, and each way is
//! checked against the whole hash.

/// Ways per set.
pub const WAYS: u32 = 16;
/// A way's payload.
pub const PAYLOAD: usize = 16;
/// Hash, payload, stamp.
const WAY: usize = 16 + PAYLOAD + 8;
/// The ways of one set.
const WAYS_BYTES: usize = WAYS as usize * WAY;

/// What a table's sets hold besides their ways.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Evicted keys remembered per set (0: none).
    pub record: usize,
}

impl Shape {
    /// The bytes of one set's value: its ways, then its record.
    pub const fn set_bytes(self) -> usize {
        WAYS_BYTES + 4 * self.record
    }
}

/// How many sets a table of `entries` entries has (at least one).
pub fn sets(entries: u32) -> u32 {
    entries.div_ceil(WAYS).max(1)
}

/// The set of `hash` in a table of `entries` entries.
pub fn set_of(hash: u128, entries: u32) -> u32 {
    crate::cache::slot(hash, sets(entries))
}

/// What a lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// The key's payload.
    Hit([u8; PAYLOAD]),
    /// The set evicted the key within the evictions its record reaches.
    Evicted,
    /// Not stored, or evicted longer ago than the record reaches.
    Miss,
}

/// One set, decoded from its value (or empty).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    shape: Shape,
    bytes: Vec<u8>,
}

/// The tag an eviction record keeps of `hash`: its top 32 bits, never 0 (an empty record).
fn tag(hash: u128) -> u32 {
    ((hash >> 96) as u32).max(1)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

fn u128_at(bytes: &[u8], at: usize) -> u128 {
    bytes
        .get(at..at + 16)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u128::from_le_bytes)
}

impl Set {
    pub fn empty(shape: Shape) -> Set {
        Set {
            shape,
            bytes: vec![0; shape.set_bytes()],
        }
    }

    /// The set of `shape` a stored value holds; an empty one when it is none.
    pub fn decode(shape: Shape, value: Option<Vec<u8>>) -> Set {
        match value {
            Some(bytes) if bytes.len() == shape.set_bytes() => Set { shape, bytes },
            _ => Set::empty(shape),
        }
    }

    /// The value to store.
    pub fn encode(&self) -> &[u8] {
        &self.bytes
    }

    fn stamp(&self, way: usize) -> u64 {
        u64_at(&self.bytes, way * WAY + 32)
    }

    fn hash(&self, way: usize) -> u128 {
        u128_at(&self.bytes, way * WAY)
    }

    fn ways() -> std::ops::Range<usize> {
        0..WAYS as usize
    }

    /// The way that holds `hash`.
    fn way_of(&self, hash: u128) -> Option<usize> {
        Set::ways().find(|&w| self.stamp(w) != 0 && self.hash(w) == hash)
    }

    fn record(&self) -> impl Iterator<Item = u32> + '_ {
        let start = WAYS_BYTES;
        (0..self.shape.record).map(move |i| {
            self.bytes
                .get(start + 4 * i..start + 4 * i + 4)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u32::from_le_bytes)
        })
    }

    pub fn find(&self, hash: u128) -> Found {
        if let Some(w) = self.way_of(hash) {
            let mut out = [0u8; PAYLOAD];
            if let Some(p) = self.bytes.get(w * WAY + 16..w * WAY + 32) {
                out.copy_from_slice(p);
            }
            return Found::Hit(out);
        }
        let t = tag(hash);
        if self.record().any(|r| r == t) {
            Found::Evicted
        } else {
            Found::Miss
        }
    }

    /// Stores `payload` under `hash`: in its own way if it has one, else in an empty way,
    /// else in the way stored least recently. The key evicted, if any.
    pub fn store(&mut self, hash: u128, payload: &[u8; PAYLOAD]) -> Option<u128> {
        let next = Set::ways().map(|w| self.stamp(w)).max().unwrap_or(0) + 1;
        let (way, evicted) = match self.way_of(hash) {
            Some(w) => (w, None),
            None => {
                let oldest = Set::ways().min_by_key(|&w| self.stamp(w)).unwrap_or(0);
                let evicted = (self.stamp(oldest) != 0).then(|| self.hash(oldest));
                (oldest, evicted)
            }
        };
        if let Some(gone) = evicted {
            self.remember(tag(gone));
        }
        let at = way * WAY;
        self.write(at, &hash.to_le_bytes());
        self.write(at + 16, payload);
        self.write(at + 32, &next.to_le_bytes());
        evicted
    }

    /// Puts `tag` first in the record, dropping the oldest.
    fn remember(&mut self, tag: u32) {
        let Some(kept) = self.shape.record.checked_sub(1) else {
            return;
        };
        let start = WAYS_BYTES;
        self.bytes.copy_within(start..start + kept * 4, start + 4);
        self.write(start, &tag.to_le_bytes());
    }

    /// Copies `src` to `at` (a set's buffer always has the room: [`Shape::set_bytes`]).
    fn write(&mut self, at: usize, src: &[u8]) {
        if let Some(dst) = self.bytes.get_mut(at..at + src.len()) {
            dst.copy_from_slice(src);
        }
    }

    /// How many ways hold a key.
    pub fn occupied(&self) -> usize {
        Set::ways().filter(|&w| self.stamp(w) != 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distinct hashes spread like xxh3's.
    fn key(i: u64) -> u128 {
        xxhash_rust::xxh3::xxh3_128(&i.to_le_bytes())
    }

    fn payload(v: u8) -> [u8; PAYLOAD] {
        [v; PAYLOAD]
    }

    const RECORD: usize = 32;
    const SHAPE: Shape = Shape { record: RECORD };

    /// `n` keys that all fall in set 0 of a table of `entries` entries.
    fn same_set(n: usize, entries: u32) -> Vec<u128> {
        (0..)
            .map(key)
            .filter(|h| set_of(*h, entries) == 0)
            .take(n)
            .collect()
    }

    #[test]
    fn sets_round_up_to_whole_sets() {
        assert_eq!(sets(1), 1);
        assert_eq!(sets(16), 1);
        assert_eq!(sets(17), 2);
        assert_eq!(sets(65536), 4096);
        assert_eq!(sets(1 << 20), 65536);
        assert_eq!(SHAPE.set_bytes(), 16 * 40 + 32 * 4);
        assert_eq!(Shape { record: 0 }.set_bytes(), 640);
    }

    #[test]
    fn a_full_set_evicts_the_way_stored_least_recently() {
        let keys = same_set(20, 64);
        let mut set = Set::empty(SHAPE);
        for (i, k) in keys.iter().take(16).enumerate() {
            assert_eq!(set.store(*k, &payload(i as u8)), None);
        }
        assert_eq!(set.occupied(), 16);
        // Storing key 0 again refreshes it in place: no eviction.
        assert_eq!(set.store(keys[0], &payload(100)), None);
        // The next new keys evict 1, 2, 3 in their order, not 0.
        assert_eq!(set.store(keys[16], &payload(16)), Some(keys[1]));
        assert_eq!(set.store(keys[17], &payload(17)), Some(keys[2]));
        assert_eq!(set.store(keys[18], &payload(18)), Some(keys[3]));
        assert_eq!(set.find(keys[0]), Found::Hit(payload(100)));
        for k in &keys[4..19] {
            assert!(matches!(set.find(*k), Found::Hit(_)));
        }
        for k in &keys[1..4] {
            assert_eq!(set.find(*k), Found::Evicted);
        }
        assert_eq!(set.find(keys[19]), Found::Miss);
        assert_eq!(set.occupied(), 16);
        // A table without a record evicts the same, and tells nothing of it.
        let mut bare = Set::empty(Shape { record: 0 });
        for k in &keys[..17] {
            bare.store(*k, &payload(1));
        }
        assert_eq!(bare.find(keys[0]), Found::Miss);
        assert!(matches!(bare.find(keys[16]), Found::Hit(_)));
        assert_eq!(bare.encode().len(), 640);
    }

    #[test]
    fn the_record_reaches_back_its_last_evictions_only() {
        let keys = same_set(16 + RECORD + 1, 16);
        let mut set = Set::empty(SHAPE);
        for k in &keys {
            set.store(*k, &payload(1));
        }
        // Keys 0..=RECORD were evicted; the record remembers the last RECORD of them.
        assert_eq!(set.find(keys[0]), Found::Miss);
        for k in &keys[1..=RECORD] {
            assert_eq!(set.find(*k), Found::Evicted);
        }
        for k in &keys[RECORD + 1..] {
            assert!(matches!(set.find(*k), Found::Hit(_)));
        }
    }

    #[test]
    fn a_colliding_hash_reads_as_a_miss() {
        let mut set = Set::empty(SHAPE);
        let k = key(1);
        set.store(k, &payload(7));
        assert_eq!(set.find(k), Found::Hit(payload(7)));
        // Same set, same tag, another hash: a miss, never the stored payload.
        assert_eq!(set.find(k ^ 1), Found::Miss);
        assert_eq!(set.find(k.wrapping_add(1 << 64)), Found::Miss);
    }

    #[test]
    fn a_value_of_another_shape_reads_as_an_empty_set() {
        let mut set = Set::empty(SHAPE);
        set.store(key(1), &payload(7));
        let mut bytes = set.encode().to_vec();
        assert_eq!(
            Set::decode(SHAPE, Some(bytes.clone())).find(key(1)),
            Found::Hit(payload(7))
        );
        bytes.pop();
        assert_eq!(Set::decode(SHAPE, Some(bytes)).find(key(1)), Found::Miss);
        assert_eq!(
            Set::decode(SHAPE, Some(b"short".to_vec())),
            Set::empty(SHAPE)
        );
        assert_eq!(Set::decode(SHAPE, None).occupied(), 0);
    }
}
