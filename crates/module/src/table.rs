//! The process-wide table behind the core's shared data (`Host::get_shared`/`set_shared`):
//! counts, anchors, learned context lengths and flags, seen by every worker thread and every
//! filter configuration of the process, as a proxy-wasm VM's shared data is by every worker.
//!
//! The core's keys are sets and slots (docs/spec.md §6): at most `cache_entries / 16`
//! (≤ 2^16) sets of the count table and as many of the anchor table, each one value the core
//! reads and writes whole, and 1024 slots for each table keyed by route and model. The table
//! holds at most [`MAX_KEYS`] keys besides, so that no key space can grow it without bound;
//! a new key past it is not stored (a miss later, as a failed write is for the core). Two
//! workers that store into one set at once each write the whole set: one of the two stores is
//! lost (a count later), and neither is mixed with the other.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex};

/// Above every key the core can make: 2 × 2^16 sets, 3 × 1024 route-and-model slots.
pub const MAX_KEYS: usize = 1 << 22;

/// Locks are held per shard, so workers rarely wait for each other.
const SHARDS: usize = 16;

pub struct Table {
    shards: Vec<Mutex<HashMap<String, Vec<u8>>>>,
    hasher: RandomState,
    keys: AtomicUsize,
    max_keys: usize,
}

impl Table {
    pub fn new(max_keys: usize) -> Table {
        Table {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            keys: AtomicUsize::new(0),
            max_keys,
        }
    }

    fn shard(&self, key: &str) -> Option<&Mutex<HashMap<String, Vec<u8>>>> {
        let at = (self.hasher.hash_one(key) % SHARDS as u64) as usize;
        self.shards.get(at)
    }

    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        let shard = self.shard(key)?.lock().ok()?;
        shard.get(key).cloned()
    }

    /// Stores `value` at `key`; `false` when a new key would pass the bound (or a lock is
    /// poisoned).
    pub fn set(&self, key: &str, value: &[u8]) -> bool {
        let Some(Ok(mut shard)) = self.shard(key).map(Mutex::lock) else {
            return false;
        };
        if let Some(slot) = shard.get_mut(key) {
            slot.clear();
            slot.extend_from_slice(value);
            return true;
        }
        let taken = self
            .keys
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_keys).then_some(n + 1)
            });
        if taken.is_err() {
            return false;
        }
        shard.insert(key.to_string(), value.to_vec());
        true
    }

    /// How many keys it holds.
    pub fn len(&self) -> usize {
        self.keys.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The one table of the process.
pub static TABLE: LazyLock<Table> = LazyLock::new(|| Table::new(MAX_KEYS));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_read_back_and_replaced() {
        let t = Table::new(8);
        assert_eq!(t.get("a"), None);
        assert!(t.set("a", b"one"));
        assert_eq!(t.get("a").as_deref(), Some(&b"one"[..]));
        assert!(t.set("a", b"second"));
        assert_eq!(t.get("a").as_deref(), Some(&b"second"[..]));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn no_key_past_the_bound_is_stored_but_known_keys_still_change() {
        let t = Table::new(3);
        for i in 0..10 {
            t.set(&format!("k{i}"), b"v");
        }
        assert_eq!(t.len(), 3);
        let stored: Vec<_> = (0..10)
            .filter(|i| t.get(&format!("k{i}")).is_some())
            .collect();
        assert_eq!(stored, vec![0, 1, 2]);
        assert!(t.set("k1", b"w"));
        assert_eq!(t.get("k1").as_deref(), Some(&b"w"[..]));
        assert!(!t.set("k9", b"w"));
    }

    #[test]
    fn every_thread_sees_every_other_threads_writes() {
        let t = std::sync::Arc::new(Table::new(1000));
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for i in 0..50 {
                        assert!(t.set(&format!("w{w}.{i}"), &[w as u8, i as u8]));
                    }
                })
            })
            .collect();
        for h in writers {
            h.join().unwrap();
        }
        assert_eq!(t.len(), 200);
        for w in 0..4u8 {
            for i in 0..50u8 {
                assert_eq!(t.get(&format!("w{w}.{i}")), Some(vec![w, i]));
            }
        }
    }

    /// The core's sets stored through the table by four threads at once, as four workers
    /// do: every key is a set, every value a whole set, every key found holds its own value.
    #[test]
    fn the_cores_sets_stay_whole_and_bounded_under_concurrent_stores() {
        use incontext_core::table::{set_of, Found, Set, Shape};
        const SHAPE: Shape = Shape { record: 256 };
        const ENTRIES: u32 = 256;
        let payload = |h: u128| {
            let mut p = [0u8; 16];
            p.copy_from_slice(&h.to_be_bytes());
            p
        };
        let hash = |w: u64, i: u64| {
            incontext_core::digest::digest(&[w.to_le_bytes(), i.to_le_bytes()].concat())
        };
        // Stores a thread makes: fewer under Miri (an interpreter), still about 50 a set.
        const WRITES: u64 = if cfg!(miri) { 200 } else { 5000 };
        let t = std::sync::Arc::new(Table::new(1000));
        let writers: Vec<_> = (0..4u64)
            .map(|w| {
                let t = t.clone();
                std::thread::spawn(move || {
                    for i in 0..WRITES {
                        let h = hash(w, i);
                        let key = format!("s.{}", set_of(h, ENTRIES));
                        let mut set = Set::decode(SHAPE, t.get(&key));
                        set.store(h, &payload(h));
                        assert!(t.set(&key, set.encode()));
                    }
                })
            })
            .collect();
        for h in writers {
            h.join().unwrap();
        }
        assert_eq!(t.len(), 16, "⌈256 / 16⌉ sets, no other key");
        let mut found = 0;
        for w in 0..4u64 {
            for i in 0..WRITES {
                let h = hash(w, i);
                let value = t.get(&format!("s.{}", set_of(h, ENTRIES))).unwrap();
                assert_eq!(value.len(), SHAPE.set_bytes());
                match Set::decode(SHAPE, Some(value)).find(h) {
                    Found::Hit(p) => {
                        assert_eq!(p, payload(h), "a way holds its own key's payload");
                        found += 1;
                    }
                    Found::Evicted | Found::Miss => {}
                }
            }
        }
        // Every set took far more than 16 stores: all 16 ways of each hold one of the keys
        // stored, with its own payload. A race may only lose a store, never mix two.
        assert_eq!(found, 256);
    }
}
