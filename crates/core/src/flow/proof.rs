//! Proving a request's outcome without counting it (docs/spec.md §15): a bound P_hi from the
//! count of a prefix of the conversation plus the bytes of what it added, or, where those
//! bytes do not prove it, plus the server's count of the new messages alone.

use super::count;
use super::exchange::{Awaited, Next, Pending};
use super::route::Ctx;
use super::store::Flag;
use super::Metric;
use crate::backend::{self, Counted};
use crate::bound;
use crate::dialect::Form;
use crate::tokenize::Failure;

/// What a bound found for a request.
pub enum Proof {
    /// The bound proves the outcome: P_hi.
    Fits(u64),
    /// Counting the new messages alone may prove it: the call, and what its count must meet.
    Tail(backend::Call, Awaited),
}

/// P_hi when a bound from a counted prefix of this conversation proves the outcome: the
/// caller's cap fits (W − P_hi ≥ B), or, without a cap, the server's own default of the rest
/// of the window does (W = C, W − P_hi ≥ R). Only where writing the cap back would change
/// nothing: one cap member, of the field the rewrite writes, with a thinking budget that needs
/// no lowering. Where the bytes of the new messages do not prove it, a count of those
/// messages alone may: the call that asks it.
pub fn prove(ctx: &mut Ctx, pending: &Pending, chain: &bound::Chain) -> Option<Proof> {
    let req = &pending.req;
    let learned = match ctx.config().context_length {
        None => Some(ctx.context(&pending.model)?),
        Some(_) => None,
    };
    let config = ctx.config();
    let (w, c) = crate::plan::window(config, learned).ok()?;
    let need = match req.cap {
        Some(cap) => {
            let same_field = req.target().1 == cap.field.name();
            let budget_ok = req.form != Form::Messages
                || matches!(
                    crate::dialect::messages::thinking_budget(req, &pending.body, cap.value),
                    Ok(None)
                );
            if req.cap_members.len() != 1 || !same_field || !budget_ok {
                return None;
            }
            cap.value
        }
        None if req.form == Form::Chat && w == c => config.min_output_tokens,
        None => return None,
    };
    if ctx.flagged(Flag::SkipOff, &pending.model) {
        return None;
    }
    let n = chain.links.len();
    for k in (n.saturating_sub(bound::MAX_PROBES).max(1)..=n).rev() {
        let Some(anchor) = chain.links.get(k - 1).and_then(|link| ctx.anchor(*link)) else {
            continue;
        };
        let body = &pending.body;
        let bounds = bound::bounds(req.form, body, chain, k, anchor.tokens)?;
        if bounds.p_hi.checked_add(need)? <= w {
            return Some(Proof::Fits(bounds.p_hi));
        }
        let tail = bounds.tail?;
        if !tail.may_prove(need, w) || ctx.flagged(Flag::TailOff, &pending.model) {
            return None;
        }
        let messages = bound::tail_array(body, tail.items)?;
        let call = backend::tail_call(ctx.config(), req, body, &messages)?;
        let awaited = Awaited::Tail {
            base: tail.base,
            need,
            w,
        };
        return Some(Proof::Tail(call, awaited));
    }
    None
}

/// The tail's count: the request skips its count when it proves the outcome, and is counted
/// whole otherwise. A server that refuses to count a tail alone (its template wants a whole
/// conversation) is not asked again for this route and model.
pub fn tail_counted(
    ctx: &mut Ctx,
    pending: Box<Pending>,
    (base, need, w): (u64, u64, u64),
    counted: Result<Counted, Failure>,
) -> Next {
    match counted {
        Ok(c) => {
            let p_hi = base.saturating_add(c.count);
            if p_hi.saturating_add(need) <= w {
                return Next::Send(pending, p_hi);
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
    count::whole(ctx, pending)
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
