//! A cache hit decided on a body read in part: the host need not copy what a hit never reads.
//!
//! A hit on a long prompt reads the body's head and tail, the first and last bytes of each
//! long value (where `json::guess` guesses it ends), and hashes each long value whole for the
//! cache key. A host that holds the body in its own slices (Envoy's dynamic module) can hash
//! a value over those slices and leave its interior uncopied. So each thread remembers where
//! the long values lay in the last body of each length whose guesses were proved, and a host
//! may read a body of that length without the interiors ([`layout`], [`hole`]), hashing each
//! value over its own slices ([`Partial`]).
//!
//! The body is then decided here only when nothing on the way reads an uncopied byte:
//!
//! * the analysis guesses that each of those values ends where it ended in the remembered
//!   body, and guesses nothing else (this thread's table of guesses is not consulted: a
//!   guess it offers for a value of another length would read inside one); the values it
//!   jumps are exactly those, and they are the ones the key hashes (a skim, or a duplicate's
//!   validation, would read inside one);
//! * the dialect is chat, completions or Anthropic Messages, counted by the tokenizer, with no
//!   `truncate_prompt_tokens` (whose check reads every message) and `estimate_constrained`
//!   off (whose check reads into `tools`);
//! * a count is stored under the key (made with the host's digests), with its context length
//!   (else the request is counted, and the count is made from the whole body);
//! * a rewrite's new head takes no byte of an interior (it only keeps the bytes before it,
//!   which the host moves within its own slices).
//!
//! Otherwise the body comes back and the host reads it whole. The guesses are proved as on a
//! whole body (`count::prove`): the key hashes each value's own bytes (the digest the host
//! made), and a count is stored only for a request whose values were validated, so each
//! guessed span holds one whole JSON value. So a body read in part decides exactly as
//! the whole body does; the tests hold the two to the same steps with the interiors filled
//! with anything.
//!
//! The table is per thread, bounded: 32 lengths, each with at most 2 values.

use super::count;
use super::route::{Plugin, RouteId};
use super::state::Verdict;
use super::Host;
use crate::config::Config;
use crate::dialect::{Endpoint, Form};
use crate::request::{analyze_on_known, Counting, Request};
use crate::rewrite::Edit;
use crate::tokenize::cache_key_with;
pub use crate::tokenize::Known;
use std::cell::RefCell;
use std::ops::Range;

/// The bytes read at each end of a value left unread: what a guess reads there.
const EDGE: usize = crate::json::guess::EDGE;
const SLOTS: usize = 32;
/// The long values of a request: `messages` and `tools`.
const VALUES: usize = 2;

/// A request body, the interiors of some long values not read.
#[derive(Debug)]
pub struct Partial {
    /// The body's bytes; those in each value's [`hole`] are whatever the host's buffer held
    /// (nothing here reads them).
    pub body: Vec<u8>,
    /// The values whose interiors were not read, each with the digest of its bytes
    /// (`digest::digest`, made over the host's slices).
    pub values: Vec<Known>,
}

/// Of a long value at `span`, the bytes that need not be read: all but its edges.
pub fn hole(span: &Range<usize>) -> Range<usize> {
    let start = span.start.saturating_add(EDGE);
    start..span.end.saturating_sub(EDGE).max(start)
}

#[derive(Clone, Default)]
struct Slot {
    /// 0: empty.
    len: usize,
    values: [Range<usize>; VALUES],
}

thread_local! {
    static LAYOUTS: RefCell<[Slot; SLOTS]> = RefCell::new(Default::default());
}

fn slot_of(len: usize) -> usize {
    (len.wrapping_mul(0x9E37_79B9) >> 8) % SLOTS
}

/// Where the long values lay in the last body of `len` bytes whose guesses this thread
/// proved; empty: read the body whole.
pub fn layout(len: usize) -> Vec<Range<usize>> {
    LAYOUTS
        .try_with(|t| {
            let t = t.try_borrow().ok()?;
            let slot = t.get(slot_of(len)).filter(|s| s.len == len && len > 0)?;
            Some(
                slot.values
                    .iter()
                    .filter(|v| !hole(v).is_empty())
                    .cloned()
                    .collect(),
            )
        })
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Remembers the values of `req` whose end was guessed (`guessed`), proved, that the key
/// hashes, for bodies of `len` bytes: when a hit on it would read only their edges.
pub(super) fn learn(req: &Request, guessed: &[usize], len: usize, config: &Config) {
    if !edges_suffice(req, config) {
        return;
    }
    let mut values: [Range<usize>; VALUES] = Default::default();
    let hashed = [req.fields.messages, req.fields.tools];
    for (slot, idx) in values.iter_mut().zip(hashed) {
        if let Some(m) = idx.filter(|i| guessed.contains(i)) {
            if let Some(member) = req.members.get(m) {
                *slot = member.value.clone();
            }
        }
    }
    if values.iter().any(|v| !hole(v).is_empty()) {
        keep(len, values);
    }
}

fn keep(len: usize, values: [Range<usize>; VALUES]) {
    let _ = LAYOUTS.try_with(|t| {
        if let Ok(mut t) = t.try_borrow_mut() {
            if let Some(slot) = t.get_mut(slot_of(len)) {
                *slot = Slot { len, values };
            }
        }
    });
}

/// Forgets every layout this thread remembers: a test starts from an empty table.
#[cfg(test)]
pub fn forget() {
    LAYOUTS.with(|t| *t.borrow_mut() = Default::default());
}

/// Whether a hit on `req` reads no more of its `messages` and `tools` than their edges, if
/// the analysis jumped them (the module's text).
fn edges_suffice(req: &Request, config: &Config) -> bool {
    matches!(req.form, Form::Chat | Form::Completion | Form::Messages)
        && req.counting == Counting::Tokenize
        && req.truncate.is_none()
        && !config.estimate_constrained
}

/// Whether the analysis jumped each of `values`, and each is a value the key hashes.
fn jumped(req: &Request, guessed: &[usize], values: &[Known]) -> bool {
    let hashed = |i: &&usize| Some(**i) == req.fields.messages || Some(**i) == req.fields.tools;
    values.iter().all(|k| {
        guessed
            .iter()
            .filter(hashed)
            .any(|&i| req.members.get(i).is_some_and(|m| m.value == k.span))
    })
}

/// The verdict, or the body back when a rewrite's new head would take bytes from a hole.
fn unread_written(verdict: Verdict, values: &[Known]) -> Result<Verdict, Vec<u8>> {
    let touches = |edit: &Edit| {
        values.iter().any(|k| {
            let h = hole(&k.span);
            h.start < edit.end && edit.keep < h.end
        })
    };
    match verdict {
        Verdict::Rewritten { rewrite, .. } if touches(rewrite.edit()) => {
            Err(rewrite.into_parts().0)
        }
        verdict => Ok(verdict),
    }
}

/// The route and the verdict of a body read in part, a hit; `Err` with the body when it
/// must be read whole (the module's text). Nothing is counted here.
pub(super) fn decide(
    plugin: &Plugin,
    host: &mut dyn Host,
    endpoint: Endpoint,
    partial: Partial,
) -> Result<(RouteId, Verdict), Vec<u8>> {
    let Partial { body, values } = partial;
    let len = body.len();
    let spans: Vec<Range<usize>> = values.iter().map(|k| k.span.clone()).collect();
    let Some((req, guessed)) = analyze_on_known(&body, plugin.config(), endpoint, &spans) else {
        return Err(body);
    };
    if !(edges_suffice(&req, plugin.config()) && jumped(&req, &guessed, &values)) {
        return Err(body);
    }
    let route = plugin.resolve(Some(&req.model_name(&body)));
    let mut ctx = plugin.ctx(route, host);
    let configured = ctx.config().context_length;
    let key = cache_key_with(&req, &body, &ctx.route.scope, configured, &values);
    let Some(stored) = ctx.stored_count(key) else {
        return Err(body);
    };
    let verdict = unread_written(count::hit(&mut ctx, &req, body, stored)?, &values)?;
    learn(&req, &guessed, len, plugin.config());
    Ok((route, verdict))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_keeps_one_layout_a_slot() {
        forget();
        let value = |len: usize| [0..len, 0..0];
        for len in 1..=5000 {
            keep(len, value(len));
        }
        let kept = LAYOUTS.with(|t| t.borrow().iter().filter(|s| s.len > 0).count());
        assert_eq!(kept, SLOTS);
        let found = (1..=5000).filter(|&len| !layout(len).is_empty()).count();
        assert_eq!(found, SLOTS);
        // The last of each slot is the one kept.
        assert_eq!(layout(5000), vec![0..5000]);
        forget();
        assert_eq!(layout(5000), Vec::<Range<usize>>::new());
    }
}
