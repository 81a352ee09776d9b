//! Every shared-data table, typed, over the host. Each is direct-mapped: a key's slot is its
//! 128-bit hash modulo the table's size, and a slot keeps the whole hash, so a collision reads
//! as a miss, never as another key's value. However many prompts, conversations and model
//! names clients send, at most that many keys exist (docs/spec.md §6).
//!
//! * counts (`cache_entries` slots): a prompt's exact count and the context length it came
//!   with;
//! * anchors (`cache_entries` slots): the count of the conversation that ended with a prefix
//!   (docs/spec.md §15);
//! * contexts ([`MODEL_SLOTS`]): a context length learned for a route and model, and when;
//! * flags ([`MODEL_SLOTS`] each): skipping off, tails off, a usage mismatch logged, for a
//!   route and model.

use super::route::Ctx;
use crate::backend::Counted;
use crate::bound;
use crate::cache;
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
    /// The stored count of the prompt hashed to `key`.
    pub fn stored_count(&mut self, key: u128) -> Option<Stored> {
        let slot = cache::slot_key(key, self.config().cache_entries);
        cache::decode(key, &self.host.get_shared(&slot)?)
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
        let slot = cache::slot_key(key, self.config().cache_entries);
        self.host.set_shared(&slot, &cache::encode(key, stored));
        if let Some(link) = link {
            let anchor = bound::Entry {
                tokens: counted.count,
                exact: true,
            };
            self.put_anchor(link, anchor);
        }
    }

    /// The anchor of the conversation that ended with `link`.
    pub fn anchor(&mut self, link: u128) -> Option<bound::Entry> {
        let slot = bound::slot_key(link, self.config().cache_entries);
        bound::decode(link, &self.host.get_shared(&slot)?)
    }

    /// The last message of the conversation before `before` (see [`bound::Last`]).
    pub fn last(&mut self, before: u128) -> Option<bound::Last> {
        let slot = bound::last_key(before, self.config().cache_entries);
        bound::decode_last(before, &self.host.get_shared(&slot)?)
    }

    pub fn put_last(&mut self, before: u128, last: &bound::Last) {
        let slot = bound::last_key(before, self.config().cache_entries);
        self.host
            .set_shared(&slot, &bound::encode_last(before, last));
    }

    pub fn put_anchor(&mut self, link: u128, anchor: bound::Entry) {
        let slot = bound::slot_key(link, self.config().cache_entries);
        self.host.set_shared(&slot, &bound::encode(link, anchor));
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
}
