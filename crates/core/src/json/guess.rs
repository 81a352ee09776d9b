//! Where a long skimmed value that began this way ended before: a guess that spares the skim.
//!
//! Finding where `messages` ends reads every byte of it (`skim`), and so does the cache key's
//! hash of it: a cache hit on a 400 KB prompt read it twice. Each thread remembers, for the
//! long values it skimmed, a hash of their first and of their last 64 bytes and their length.
//! A value that begins as one remembered, and whose bytes at that length end as it ended, is
//! guessed to end there, and the skim is not run.
//!
//! A guess is only a guess: a request analyzed on one is the request only once something
//! proves it, a count stored under the cache key of its exact bytes (which was stored for a
//! request whose values were validated, so the guessed span is a whole JSON value, and a
//! value's skim ends where the value ends). Without that proof the request is analyzed again
//! without guesses (`flow::exchange`). So a guess can make a request cheaper, never different.
//!
//! The table is per thread (a proxy-wasm VM, an Envoy worker), bounded: 64 sets of 8 entries,
//! each set replaced in turn.

use std::cell::RefCell;
use xxhash_rust::xxh3::xxh3_64;

/// Values shorter than this are skimmed: a guess would save next to nothing.
pub const MIN_LEN: usize = 4096;
/// The bytes hashed at each end of a value.
pub(crate) const EDGE: usize = 64;
const SETS: usize = 64;
const WAYS: usize = 8;

#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct Entry {
    head: u64,
    tail: u64,
    /// 0: empty.
    len: usize,
}

/// One set: its entries, and the one the next new entry replaces.
#[derive(Clone, Copy)]
struct Set {
    ways: [Entry; WAYS],
    next: usize,
}

struct Table {
    sets: [Set; SETS],
}

impl Table {
    const fn new() -> Table {
        const EMPTY: Entry = Entry {
            head: 0,
            tail: 0,
            len: 0,
        };
        Table {
            sets: [Set {
                ways: [EMPTY; WAYS],
                next: 0,
            }; SETS],
        }
    }

    /// The set of a value that begins with `head`: the hash's high bits pick it, and the
    /// entries compare all of it.
    fn set(&self, head: u64) -> Option<&Set> {
        self.sets.get((head >> 58) as usize % SETS)
    }

    fn learn(&mut self, entry: Entry) {
        let Some(set) = self.sets.get_mut((entry.head >> 58) as usize % SETS) else {
            return;
        };
        if set.ways.contains(&entry) {
            return;
        }
        if let Some(way) = set.ways.get_mut(set.next % WAYS) {
            *way = entry;
        }
        set.next = (set.next + 1) % WAYS;
    }
}

thread_local! {
    static TABLE: RefCell<Table> = const { RefCell::new(Table::new()) };
}

fn hash_at(body: &[u8], from: usize) -> Option<u64> {
    Some(xxh3_64(body.get(from..from.checked_add(EDGE)?)?))
}

/// Remembers that the value at `start` ends at `end` (exclusive), when it is long enough to be
/// worth a guess.
pub fn learn(body: &[u8], start: usize, end: usize) {
    let len = end.saturating_sub(start);
    if len < MIN_LEN {
        return;
    }
    let (Some(head), Some(tail)) = (hash_at(body, start), hash_at(body, end - EDGE)) else {
        return;
    };
    // A thread being torn down, or a table already borrowed (never: nothing here calls back),
    // learns nothing.
    let _ = TABLE.try_with(|t| {
        if let Ok(mut t) = t.try_borrow_mut() {
            t.learn(Entry { head, tail, len });
        }
    });
}

/// Where the value at `start` ends if it is one remembered: its first and last 64 bytes
/// hash as that value's did, and its last byte closes an array or an object. `None`: skim.
pub fn guess(body: &[u8], start: usize) -> Option<usize> {
    let head = hash_at(body, start)?;
    TABLE
        .try_with(|t| {
            let t = t.try_borrow().ok()?;
            t.set(head)?
                .ways
                .iter()
                .filter(|e| e.len > 0 && e.head == head)
                .find_map(|e| {
                    let end = start.checked_add(e.len)?;
                    let closes = matches!(body.get(end.checked_sub(1)?), Some(b']' | b'}'));
                    (closes && hash_at(body, end - EDGE)? == e.tail).then_some(end)
                })
        })
        .ok()
        .flatten()
}

/// Where skimmed values are guessed to end, and which were.
#[derive(Debug)]
pub struct Guesses<'a> {
    /// The members whose end was guessed.
    pub found: &'a mut Vec<usize>,
    /// `None`: guess from this thread's table (`guess`). `Some`: a value that starts where one
    /// of these spans starts ends where it ends (a body read in part, `flow::partial`), and
    /// no other is guessed (the table's guesses could read bytes that were not read).
    pub known: Option<&'a [std::ops::Range<usize>]>,
}

impl Guesses<'_> {
    pub(crate) fn end(&self, body: &[u8], start: usize) -> Option<usize> {
        match self.known {
            None => guess(body, start),
            Some(spans) => spans
                .iter()
                .find(|s| s.start == start)
                .map(|s| s.end)
                .filter(|&end| matches!(body.get(end.wrapping_sub(1)), Some(b']' | b'}'))),
        }
    }
}

/// Forgets every value this thread remembers: a test starts from an empty table.
#[cfg(test)]
pub fn forget() {
    TABLE.with(|t| *t.borrow_mut() = Table::new());
}

/// How many values this thread remembers (the tests hold it to the bound).
#[cfg(test)]
fn remembered() -> usize {
    TABLE.with(|t| {
        let t = t.borrow();
        t.sets
            .iter()
            .flat_map(|s| s.ways)
            .filter(|e| e.len > 0)
            .count()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `{"messages":[...]}` with `n` messages, each made from `seed`; the value's range.
    fn body(seed: &str, n: usize) -> (Vec<u8>, usize, usize) {
        let mut b = br#"{"messages":["#.to_vec();
        let start = b.len() - 1;
        for i in 0..n {
            if i > 0 {
                b.push(b',');
            }
            b.extend(format!(r#"{{"role":"user","content":"{seed} {i}"}}"#).bytes());
        }
        b.push(b']');
        let end = b.len();
        b.extend(br#","max_tokens":9}"#);
        (b, start, end)
    }

    #[test]
    fn a_value_skimmed_before_is_guessed_to_end_where_it_ended() {
        let (b, start, end) = body("a guess", 300);
        assert!(end - start >= MIN_LEN);
        assert_eq!(guess(&b, start), None);
        learn(&b, start, end);
        assert_eq!(guess(&b, start), Some(end));
        // The same value in another body, at another offset.
        let mut other = b" {\"model\":\"m\",".to_vec();
        let shift = other.len() - 1;
        other.extend_from_slice(&b[1..]);
        assert_eq!(guess(&other, start + shift), Some(end + shift));
    }

    #[test]
    fn a_value_that_goes_on_is_not_guessed() {
        // The next turn of a conversation: the same beginning, one message more.
        let (b, start, end) = body("turns", 300);
        learn(&b, start, end);
        let (next, start2, end2) = body("turns", 301);
        assert_eq!(start2, start);
        assert_eq!(guess(&next, start), None);
        learn(&next, start2, end2);
        assert_eq!(guess(&next, start), Some(end2));
        assert_eq!(guess(&b, start), Some(end));
    }

    #[test]
    fn short_values_and_short_bodies_are_never_guessed() {
        let (b, start, end) = body("short", 10);
        assert!(end - start < MIN_LEN);
        learn(&b, start, end);
        assert_eq!(guess(&b, start), None);
        // A body cut inside a remembered value.
        let (b, start, end) = body("cut", 300);
        learn(&b, start, end);
        assert_eq!(guess(&b[..end - 1], start), None);
        assert_eq!(guess(&b[..start + 10], start), None);
    }

    #[test]
    fn the_table_is_bounded() {
        // Enough values to fill every set many times over.
        for i in 0..5000 {
            let (b, start, end) = body(&format!("bound {i}"), 200);
            learn(&b, start, end);
        }
        assert_eq!(remembered(), SETS * WAYS);
        // The last one learned is still there.
        let (b, start, end) = body("bound 4999", 200);
        assert_eq!(guess(&b, start), Some(end));
    }
}
