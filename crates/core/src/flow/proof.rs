//! Proving a request's outcome without counting it (docs/spec.md §15): a bound P_hi from the
//! count of a prefix of the conversation plus the bytes of what it added, or, where those
//! bytes do not prove it, plus the server's count of the new messages alone.

use super::route::Ctx;
use super::state::{Awaited, Next, Pending, TailNeeds, Verdict, BAND_SLACK};
use super::store::Flag;
use super::Metric;
use crate::backend::{self, Counted};
use crate::bound;
use crate::dialect::Form;
use crate::plan::{Count, Source};
use crate::tokenize::Failure;

/// What a bound found for a request.
pub enum Proof {
    /// The bound proves the caller's cap fits: P_hi.
    Fits(u64),
    /// Counting the new messages alone may prove it: the call, and what its count must meet.
    Tail(backend::Call, Awaited),
}

/// The allowance of a bound built from exact counts beyond the seam, at most: what the server
/// may render less than the prefix and the tail counted apart (measured: 3 for Qwen3's
/// template), with room to spare.
const SEAM_BELOW: u64 = 32;

/// What the bound must leave for the request's outcome to be known: `fits`, the output the
/// caller's cap (or, without one, the server's default) needs; `band`, the output the rule
/// requires for a rewrite, where a cap may be written from the bound.
#[derive(Debug, Clone, Copy)]
struct Needs {
    fits: Option<u64>,
    band: Option<u64>,
}

/// What a request must leave (see [`Needs`]), with W and C. `fits` only where writing the
/// cap back would change nothing: one valid cap member, of the field the rewrite writes,
/// with a thinking budget that needs no lowering; or none at all where the server itself
/// takes the rest of the window (W = C). `band` wherever there is a valid cap, or none where
/// the rule writes one (chat and Responses).
fn needs(ctx: &mut Ctx, pending: &Pending) -> Option<(Needs, u64)> {
    let req = &pending.req;
    let learned = match ctx.config().context_length {
        None => Some(ctx.context(&pending.model)?),
        Some(_) => None,
    };
    let config = ctx.config();
    let (w, c) = crate::plan::window(config, learned).ok()?;
    let reserve = config.min_output_tokens;
    let fits = match req.cap {
        Some(cap) => {
            let same_field = req.target().1 == cap.field.name();
            let budget_ok = req.form != Form::Messages
                || matches!(
                    crate::dialect::messages::thinking_budget(req, &pending.body, cap.value),
                    Ok(None)
                );
            (req.cap_members.len() == 1 && same_field && budget_ok).then_some(cap.value)
        }
        None if req.cap_members.is_empty()
            && matches!(req.form, Form::Chat | Form::Responses)
            && w == c =>
        {
            Some(reserve)
        }
        None => None,
    };
    // Without a cap the rule rewrites when W − P ≥ R, writing W − P.
    let uncapped = req.cap_members.is_empty() && matches!(req.form, Form::Chat | Form::Responses);
    let band = match req.cap {
        Some(cap) => Some(cap.value.min(reserve)),
        None => uncapped.then_some(reserve),
    };
    (fits.is_some() || band.is_some()).then_some((Needs { fits, band }, w))
}

/// P_hi when a bound from a counted prefix of this conversation proves the outcome (the
/// caller's cap fits: W − P_hi ≥ B; without a cap, W = C and W − P_hi ≥ R). Where the bytes
/// of the new messages do not prove it, a count of those messages alone may: the call that
/// asks it. That count may also let a cap be written from the bound, where the prefix's
/// count is exact (docs/spec.md §15a).
pub fn prove(ctx: &mut Ctx, pending: &Pending, chain: &bound::Chain) -> Option<Proof> {
    let req = &pending.req;
    let (needs, w) = needs(ctx, pending)?;
    if ctx.flagged(Flag::SkipOff, &pending.model) {
        return None;
    }
    let n = chain.links.len();
    for k in (n.saturating_sub(bound::MAX_PROBES).max(1)..=n).rev() {
        let Some((anchor, prefix_tokens, left_out)) = prefix(ctx, pending, chain, k) else {
            continue;
        };
        let body = &pending.body;
        let bounds = bound::bounds(req.form, body, chain, k, prefix_tokens)?;
        let p_hi = bounds.p_hi;
        if needs
            .fits
            .is_some_and(|need| p_hi.saturating_add(need) <= w)
        {
            return Some(Proof::Fits(p_hi));
        }
        let tail = bounds.tail?;
        // A message sent again with blocks left out renders to fewer tokens than the anchor
        // holds, by as many as those blocks had: no cap is written from such a bound, unless
        // the newest messages carry those very blocks, counted without them (one seam more).
        let moved = left_out
            .as_deref()
            .map(|left| crate::reshape::moved_tail(req.form, body, tail.items, left));
        let base = match moved {
            Some(Some(_)) => tail.base.checked_add(crate::reshape::RESHAPE)?,
            _ => tail.base,
        };
        let seam = base.saturating_sub(anchor.tokens);
        let band = needs.band.filter(|_| {
            anchor.exact
                && !matches!(moved, Some(None))
                && seam.saturating_add(SEAM_BELOW) <= BAND_SLACK
        });
        let fits = needs.fits;
        let worth = |need: Option<u64>| need.is_some_and(|need| tail.may_prove(need, w));
        if !(worth(fits) || worth(band)) || ctx.flagged(Flag::TailOff, &pending.model) {
            return None;
        }
        let messages = match moved {
            Some(Some(messages)) => messages,
            _ => bound::tail_array(body, tail.items)?,
        };
        let call = backend::tail_call(ctx.config(), req, body, &messages)?;
        let awaited = Awaited::Tail(TailNeeds {
            base,
            fits,
            band,
            w,
        });
        return Some(Proof::Tail(call, awaited));
    }
    ctx.count_evicted_anchor();
    None
}

/// The anchor that bounds the first `k` messages of the conversation, and the tokens they
/// are bounded by: the anchor of those very messages; else, where message `k − 1` is the
/// last message of an earlier conversation sent again with text blocks left out, that
/// conversation's anchor and RESHAPE more (docs/spec.md §15b), with the texts left out.
fn prefix(
    ctx: &mut Ctx,
    pending: &Pending,
    chain: &bound::Chain,
    k: usize,
) -> Option<(bound::Entry, u64, Option<Vec<u64>>)> {
    if let Some(anchor) = chain
        .links
        .get(k.checked_sub(1)?)
        .and_then(|l| ctx.anchor(*l))
    {
        return Some((anchor, anchor.tokens, None));
    }
    let before = *chain.links.get(k.checked_sub(2)?)?;
    let last = ctx.last(before)?;
    let left = crate::reshape::left_out(pending.req.form, &pending.body, chain, k, &last)?;
    let anchor = ctx.anchor(last.link)?;
    Some((
        anchor,
        anchor.tokens.checked_add(crate::reshape::RESHAPE)?,
        Some(left),
    ))
}

/// Keeps the request's last message under the link before it, for a later turn that sends
/// it again with text blocks left out (see [`prefix`]).
pub fn remember_last(ctx: &mut Ctx, pending: &Pending, chain: &bound::Chain) {
    if let Some((before, last)) = crate::reshape::last(pending.req.form, &pending.body, chain) {
        ctx.put_last(before, &last);
    }
}

/// The tail's count: the request skips its count when it proves the outcome, has its cap
/// written from the bound where the bound leaves what the rule requires, and is counted whole
/// otherwise. A server that refuses to count a tail alone (its template wants a whole
/// conversation) is not asked again for this route and model.
pub fn tail_counted(
    ctx: &mut Ctx,
    pending: Box<Pending>,
    needs: TailNeeds,
    counted: Result<Counted, Failure>,
) -> Next {
    match counted {
        Ok(c) => {
            let p_hi = needs.base.saturating_add(c.count);
            let leaves =
                |need: Option<u64>| need.is_some_and(|need| p_hi.saturating_add(need) <= needs.w);
            if leaves(needs.fits) {
                return Next::Send(pending, p_hi);
            }
            if leaves(needs.band) {
                return band(ctx, pending, p_hi, needs.w);
            }
        }
        Err(failure) => {
            ctx.count(Metric::Failure(failure));
            let refused = matches!(
                failure,
                Failure::Status | Failure::BadJson | Failure::Contract
            );
            if refused && ctx.set_flag(Flag::TailOff, &pending.model) {
                log::warn!(
                    "incontext: the tokenizer did not count a conversation's new messages alone ({}); counting whole prompts for this route from now on",
                    failure.as_str()
                );
            }
        }
    }
    Next::Whole(pending)
}

/// The cap written from P_hi: the rule's own decision with P_hi for P. P_hi ≥ P, so the cap
/// is never above the exact one, and W − P_hi ≥ what the rule requires, so the exact count
/// would rewrite too. Where the decision is anything but a rewrite (a thinking budget to
/// lower, say), the whole prompt is counted.
fn band(ctx: &mut Ctx, pending: Box<Pending>, p_hi: u64, w: u64) -> Next {
    let count = Count {
        tokens: p_hi,
        source: Source::Bound,
        max_model_len: None,
    };
    let room = w.saturating_sub(p_hi);
    let value = (pending.req.cap).map_or(room, |cap| cap.value.min(room));
    match needs_no_budget(&pending, value)
        .then(|| Verdict::decide(ctx, &pending.req, pending.body.clone(), count))
    {
        Some(verdict @ Verdict::Rewritten { .. }) => Next::Band(pending, p_hi, verdict),
        _ => Next::Whole(pending),
    }
}

/// An Anthropic thinking budget stays as it is under the cap `value`.
fn needs_no_budget(pending: &Pending, value: u64) -> bool {
    let req = &pending.req;
    req.form != Form::Messages
        || matches!(
            crate::dialect::messages::thinking_budget(req, &pending.body, value),
            Ok(None)
        )
}

/// A request sent on P_hi anchors its conversation at once with the bound (the exact count
/// replaces it once the check or the answer reports it).
pub fn anchor_bound(ctx: &mut Ctx, link: Option<u128>, p_hi: u64) {
    let Some(link) = link else {
        return;
    };
    if ctx.anchor(link).is_none() {
        let anchor = bound::Entry {
            tokens: p_hi,
            exact: false,
        };
        ctx.put_anchor(link, anchor);
    }
}
