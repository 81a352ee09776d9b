//! Every shared-data table, typed, over the host. Each keeps a key's whole 128-bit hash with
//! its value, so a collision reads as a miss, never as another key's value, and each has a
//! fixed number of shared-data keys: however many prompts, conversations and model names
//! clients send, no more exist (docs/spec.md §6).
//!
//! * counts (`cache_entries` entries, set-associative: [`crate::table`]): a prompt's exact
//!   count and the context length it came with;
//! * anchors (`cache_entries` entries, set-associative): the count of the conversation that
//!   ended with a prefix (docs/spec.md §15). A store into a full set replaces the entry stored
//!   least recently: each turn of a conversation stores the anchor of its grown prefix, so
//!   the anchor that turn was bounded from, stored a turn earlier, goes before the newest
//!   anchor of any conversation;
//! * contexts ([`MODEL_SLOTS`], direct-mapped): a context length learned for a route and
//!   model, and when;
//! * flags ([`MODEL_SLOTS`] each, direct-mapped): skipping off, tails off, a usage mismatch
//!   logged, for a route and model.

use super::route::Ctx;
use super::Metric;
use crate::backend::Counted;
use crate::bound;
use crate::cache;
use crate::table::{self, Found, Set, Shape, PAYLOAD};
use crate::tokenize::Reply as Stored;
use xxhash_rust::xxh3::Xxh3;

/// Slots of each table keyed by route and model.
pub const MODEL_SLOTS: u32 = 1024;

const PREFIX: &str = "incontext.v2.";

/// A flag kept per route and model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flag {
    /// A count exceeded its bound: no request of this route and model skips its count.
    SkipOff,
    /// The server refused to count a conversation's new messages alone.
    TailOff,
    /// An answer's usage differed from the count (logged once).
    UsageMismatch,
}

impl Flag {
    fn table(self) -> &'static str {
        match self {
            Flag::SkipOff => "skip_off",
            Flag::TailOff => "tail_off",
            Flag::UsageMismatch => "usage_mismatch",
        }
    }
}

/// The hash of a route and model: the key of every table keyed by them.
fn model_hash(scope: &str, model: &str) -> u128 {
    let mut h = Xxh3::new();
    h.update(&(scope.len() as u64).to_le_bytes());
    h.update(scope.as_bytes());
    h.update(model.as_bytes());
    h.digest128()
}

/// The shared-data key of set `set` of `table`.
fn set_key(table: &str, set: u32) -> String {
    format!("{PREFIX}{table}.{set}")
}

/// A table's name in its keys, and what its sets hold.
#[derive(Clone, Copy)]
struct Table {
    name: &'static str,
    shape: Shape,
}

/// The count cache: a miss costs one count, whatever the reason.
const COUNTS: Table = Table {
    name: "counts",
    shape: Shape { record: 0 },
};

/// Evicted anchors remembered per set: a turn finds its anchor's eviction when its set evicted
/// fewer than this many keys since, that is while the table holds at least about a
/// seventeenth of the conversations that take a turn between two turns of one conversation.
pub const ANCHOR_RECORD: usize = 256;

/// The conversations' anchors, with a record of each set's last evictions.
const ANCHORS: Table = Table {
    name: "anchors",
    shape: Shape {
        record: ANCHOR_RECORD,
    },
};

fn encode_anchor(e: bound::Entry) -> [u8; PAYLOAD] {
    let mut out = [0u8; PAYLOAD];
    out[..8].copy_from_slice(&e.tokens.to_le_bytes());
    out[8] = u8::from(e.exact);
    out
}

fn decode_anchor(payload: &[u8; PAYLOAD]) -> bound::Entry {
    bound::Entry {
        tokens: u64_at(payload, 0).unwrap_or(0),
        exact: payload[8] == 1,
    }
}

fn model_slot_key(table: &str, hash: u128) -> String {
    format!("{PREFIX}{table}.{}", hash % u128::from(MODEL_SLOTS))
}

/// `hash`, then `payload`.
fn entry(hash: u128, payload: &[u8]) -> Vec<u8> {
    let mut out = hash.to_le_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

/// The payload of a slot that holds `hash`.
fn payload(hash: u128, value: &[u8]) -> Option<&[u8]> {
    let (stored, rest) = value.split_at_checked(16)?;
    (u128::from_le_bytes(stored.try_into().ok()?) == hash).then_some(rest)
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

impl Ctx<'_> {
    /// The set of `table` that holds `hash`, and its key.
    fn set(&mut self, table: Table, hash: u128) -> (String, Set) {
        let key = set_key(table.name, table::set_of(hash, self.config().cache_entries));
        let set = Set::decode(table.shape, self.host.get_shared(&key));
        (key, set)
    }

    /// Stores `payload` under `hash` in `table`: one read, one write.
    fn put(&mut self, table: Table, hash: u128, payload: &[u8; PAYLOAD]) {
        let (key, mut set) = self.set(table, hash);
        if set.store(hash, payload).is_some() {
            self.count(Metric::Evictions);
        }
        self.host.set_shared(&key, set.encode());
    }

    /// The stored count of the prompt hashed to `key`.
    pub fn stored_count(&mut self, key: u128) -> Option<Stored> {
        match self.set(COUNTS, key).1.find(key) {
            Found::Hit(payload) => Some(cache::decode(&payload)),
            Found::Evicted | Found::Miss => None,
        }
    }

    /// Stores an exact count: the prompt's, the context length it reported, and the anchor
    /// of the conversation that ended with `link`.
    pub fn store_count(&mut self, key: u128, model: &str, link: Option<u128>, counted: Counted) {
        if let Some(c) = counted.window {
            if self.config().context_length.is_none() {
                self.learn_context(model, c);
            }
        }
        let stored = Stored {
            count: counted.count,
            max_model_len: counted.window.unwrap_or(0),
        };
        self.put(COUNTS, key, &cache::encode(stored));
        if let Some(link) = link {
            let anchor = bound::Entry {
                tokens: counted.count,
                exact: true,
            };
            self.put_anchor(link, anchor);
        }
    }

    /// The anchor of the conversation that ended with `link`. A miss on an anchor its set
    /// evicted lately is remembered for [`Ctx::count_evicted_anchor`].
    pub fn anchor(&mut self, link: u128) -> Option<bound::Entry> {
        match self.set(ANCHORS, link).1.find(link) {
            Found::Hit(payload) => Some(decode_anchor(&payload)),
            Found::Evicted => {
                self.evicted_anchor = true;
                None
            }
            Found::Miss => None,
        }
    }

    /// The last message of the conversation before `before` (see [`crate::reshape::Last`]).
    pub fn last(&mut self, before: u128) -> Option<crate::reshape::Last> {
        let slot = crate::reshape::key(before, self.config().cache_entries);
        crate::reshape::decode(before, &self.host.get_shared(&slot)?)
    }

    pub fn put_last(&mut self, before: u128, last: &crate::reshape::Last) {
        let slot = crate::reshape::key(before, self.config().cache_entries);
        self.host
            .set_shared(&slot, &crate::reshape::encode(before, last));
    }

    pub fn put_anchor(&mut self, link: u128, anchor: bound::Entry) {
        self.put(ANCHORS, link, &encode_anchor(anchor));
    }

    /// Counts a request that found no anchor to be bounded from, when one of the anchors it
    /// looked for was evicted lately (its conversation had been counted, and the table
    /// dropped that count before this turn): the table is too small for the traffic.
    pub fn count_evicted_anchor(&mut self) {
        if std::mem::take(&mut self.evicted_anchor) {
            self.count(Metric::EvictedRecounts);
        }
    }

    /// The context length learned for `model` on this route, and whether it is fresh
    /// (learned or confirmed within `window_ttl_ms`).
    pub fn context_at(&mut self, model: &str) -> Option<(u64, bool)> {
        let (c, at) = self.stored_context(model)?;
        // A host without a clock keeps every learned context length fresh.
        let age = self.host.now_ms().map_or(0, |now| now.saturating_sub(at));
        Some((c, age <= self.config().window_ttl_ms))
    }

    /// The learned context length, fresh or not (better than none for a decision).
    pub fn context(&mut self, model: &str) -> Option<u64> {
        self.context_at(model).map(|(c, _)| c)
    }

    /// A fresh learned context length (a stale one is learned again).
    pub fn fresh_context(&mut self, model: &str) -> Option<u64> {
        self.context_at(model)
            .filter(|(_, fresh)| *fresh)
            .map(|(c, _)| c)
    }

    fn stored_context(&mut self, model: &str) -> Option<(u64, u64)> {
        let hash = model_hash(&self.route.scope, model);
        let value = self.host.get_shared(&model_slot_key("context", hash))?;
        let bytes = payload(hash, &value)?;
        let c = u64_at(bytes, 0).filter(|c| *c > 0)?;
        Some((c, u64_at(bytes, 8)?))
    }

    /// Learns (or confirms) C for `model`: written when it changed or when the stored one is
    /// half its lifetime old, so a count that reports the context length keeps it fresh.
    pub fn learn_context(&mut self, model: &str, c: u64) {
        let now = self.host.now_ms().unwrap_or(0);
        let ttl = self.config().window_ttl_ms;
        let keep = self
            .stored_context(model)
            .is_some_and(|(old, at)| old == c && now.saturating_sub(at) <= ttl / 2);
        if !keep {
            let hash = model_hash(&self.route.scope, model);
            let mut value = c.to_le_bytes().to_vec();
            value.extend_from_slice(&now.to_le_bytes());
            self.host
                .set_shared(&model_slot_key("context", hash), &entry(hash, &value));
        }
    }

    pub fn flagged(&mut self, flag: Flag, model: &str) -> bool {
        let hash = model_hash(&self.route.scope, model);
        self.host
            .get_shared(&model_slot_key(flag.table(), hash))
            .is_some_and(|v| payload(hash, &v).is_some())
    }

    /// Sets `flag` for `model`; `true` when it was not set.
    pub fn set_flag(&mut self, flag: Flag, model: &str) -> bool {
        if self.flagged(flag, model) {
            return false;
        }
        let hash = model_hash(&self.route.scope, model);
        self.host
            .set_shared(&model_slot_key(flag.table(), hash), &entry(hash, &[1]));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::tests::support::FakeHost;
    use crate::flow::Plugin;

    #[test]
    fn model_tables_stay_bounded_whatever_the_names() {
        let p =
            Plugin::new(crate::config::Config::parse(br#"{"tokenizer":{"cluster":"v"}}"#).unwrap());
        let mut host = FakeHost::default();
        let mut ctx = p.ctx(Default::default(), &mut host);
        for i in 0..5000 {
            let model = format!("model-{i}");
            ctx.learn_context(&model, 1000 + i);
            ctx.set_flag(Flag::SkipOff, &model);
            ctx.set_flag(Flag::TailOff, &model);
        }
        // The last name is still there, as written.
        assert_eq!(ctx.context("model-4999"), Some(5999));
        assert!(ctx.flagged(Flag::SkipOff, "model-4999"));
        assert!(!ctx.flagged(Flag::SkipOff, "never-sent"));
        let per_table = |host: &FakeHost, table: &str| {
            let prefix = format!("{PREFIX}{table}.");
            host.shared
                .keys()
                .filter(|k| k.starts_with(&prefix))
                .count()
        };
        for table in ["context", "skip_off", "tail_off"] {
            assert!(per_table(&host, table) <= MODEL_SLOTS as usize, "{table}");
        }
        assert_eq!(host.shared.len(), 3 * per_table(&host, "context"));
        // More names add no table and no key beyond the slots.
        let mut ctx = p.ctx(Default::default(), &mut host);
        for i in 5000..20000 {
            ctx.learn_context(&format!("model-{i}"), 7);
        }
        assert_eq!(per_table(&host, "context"), MODEL_SLOTS as usize);
        assert!(host.shared.len() <= 3 * MODEL_SLOTS as usize);
    }

    #[test]
    fn a_slot_another_model_took_reads_as_nothing_learned() {
        let hash = model_hash("s", "m");
        let other = entry(hash.wrapping_add(u128::from(MODEL_SLOTS)), &[1; 16]);
        assert_eq!(payload(hash, &other), None);
        assert_eq!(payload(hash, &entry(hash, &[2])), Some(&[2u8][..]));
        assert_eq!(payload(hash, &[0; 3]), None);
    }

    /// A plugin whose tables have `entries` entries, skipping on.
    fn sized(entries: u32) -> Plugin {
        let config = format!(
            r#"{{"tokenizer":{{"cluster":"v"}},"cache_entries":{entries},"context_length":40960,"skip_count":true}}"#
        );
        Plugin::new(crate::config::Config::parse(config.as_bytes()).unwrap())
    }

    fn link(conversation: u64, turn: u64) -> u128 {
        xxhash_rust::xxh3::xxh3_128(&[conversation.to_le_bytes(), turn.to_le_bytes()].concat())
    }

    fn at(tokens: u64) -> bound::Entry {
        bound::Entry {
            tokens,
            exact: true,
        }
    }

    #[test]
    fn the_tables_hold_a_fixed_number_of_keys_whatever_is_stored() {
        let p = sized(1000);
        let mut host = FakeHost::default();
        let mut ctx = p.ctx(Default::default(), &mut host);
        for i in 0..100_000u64 {
            let counted = Counted {
                count: i,
                window: None,
            };
            ctx.store_count(link(i, 0), "m", Some(link(i, 1)), counted);
        }
        let keys = |host: &FakeHost, table: Table| {
            let prefix = format!("{PREFIX}{}.", table.name);
            host.shared
                .keys()
                .filter(|k| k.starts_with(&prefix))
                .count()
        };
        // ⌈1000 / 16⌉ = 63 sets per table, every one taken, and nothing else.
        assert_eq!(keys(&host, COUNTS), 63);
        assert_eq!(keys(&host, ANCHORS), 63);
        assert_eq!(host.shared.len(), 126);
        let sizes = |table: Table| {
            let prefix = format!("{PREFIX}{}.", table.name);
            (host.shared.iter())
                .filter(|(k, _)| k.starts_with(&prefix))
                .all(|(_, v)| v.len() == table.shape.set_bytes())
        };
        assert!(sizes(COUNTS) && sizes(ANCHORS));
        assert_eq!(COUNTS.shape.set_bytes(), 640);
        assert_eq!(ANCHORS.shape.set_bytes(), 640 + 4 * 256);
        // 63 × 16 ways of each table hold keys; every other store evicted one.
        assert_eq!(host.count(Metric::Evictions), 2 * (100_000 - 63 * 16));
        // The last stored are there, as written.
        let mut ctx = p.ctx(Default::default(), &mut host);
        assert_eq!(ctx.anchor(link(99_999, 1)), Some(at(99_999)));
        assert_eq!(
            ctx.stored_count(link(99_999, 0)).map(|s| s.count),
            Some(99_999)
        );
    }

    /// Conversations interleaved turn by turn in a table of one set (16 ways): each turn is
    /// bounded from its previous turn's anchor, then stores its own.
    fn interleave(conversations: u64, rounds: u64) -> (usize, FakeHost) {
        let p = sized(16);
        let mut host = FakeHost::default();
        let mut found = 0;
        for turn in 0..rounds {
            for c in 0..conversations {
                let mut ctx = p.ctx(Default::default(), &mut host);
                if turn > 0 && ctx.anchor(link(c, turn - 1)).is_some() {
                    found += 1;
                }
                ctx.put_anchor(link(c, turn), at(100 * turn + c));
            }
        }
        (found, host)
    }

    #[test]
    fn a_superseded_anchor_goes_before_any_conversations_newest() {
        // 16 conversations fill the 16 ways: each newest anchor evicts a superseded one, and
        // every turn finds the anchor of its previous turn.
        let (found, host) = interleave(16, 10);
        assert_eq!(found, 16 * 9);
        assert_eq!(host.count(Metric::Evictions), 16 * 9);
        let mut host = host;
        let p = sized(16);
        let mut ctx = p.ctx(Default::default(), &mut host);
        for c in 0..16 {
            assert_eq!(ctx.anchor(link(c, 9)), Some(at(900 + c)));
            assert_eq!(ctx.anchor(link(c, 8)), None, "superseded, evicted");
        }
        // Eight conversations keep their last two anchors each.
        let (found, _) = interleave(8, 10);
        assert_eq!(found, 8 * 9);
        // One conversation more than ways: each anchor is evicted the turn before it is
        // needed, the least recently stored first.
        let (found, host) = interleave(17, 10);
        assert_eq!(found, 0);
        assert_eq!(host.count(Metric::Evictions), 17 * 10 - 16);
    }

    #[test]
    fn a_turn_whose_anchor_was_evicted_is_counted_and_counted_as_such() {
        use crate::flow::tests::support::{anchor, leak, send, session};
        use crate::flow::Step;
        let cap = r#","max_tokens":16000"#;
        // `others` anchors of other conversations stored between a conversation's two turns.
        let run = |others: u64| {
            let p = sized(16);
            let mut host = FakeHost::default();
            anchor(&p, &mut host, 900);
            let mut ctx = p.ctx(Default::default(), &mut host);
            for i in 0..others {
                ctx.put_anchor(link(1_000_000 + i, 0), at(1));
            }
            let (_, step) = send(&p, &mut host, "/v1/chat/completions", leak(session(2, cap)));
            let counted = matches!(step, Step::Wait);
            assert_eq!(host.calls.len(), 1 + usize::from(counted));
            (counted, host.count(Metric::EvictedRecounts))
        };
        // 15 others leave its anchor: the turn skips its count.
        assert_eq!(run(15), (false, 0));
        // 16 evict it: the turn is counted, and counted as an evicted anchor's.
        assert_eq!(run(16), (true, 1));
        assert_eq!(run(16 + ANCHOR_RECORD as u64 - 1), (true, 1));
        // Past the record's reach, the eviction is no longer seen.
        assert_eq!(run(16 + ANCHOR_RECORD as u64), (true, 0));
    }
}
