//! The check of a request sent on a bound (docs/spec.md §15): once its stream ended it is
//! counted, off its path, and the count is held against the bound. A count above it turns
//! skipping off for the route and model.

use super::route::Ctx;
use super::state::{Awaited, Pending, Sent, Waiting, BAND_SLACK};
use super::store::Flag;
use super::Metric;
use crate::backend::{self, Counted};
use crate::tokenize::Failure;

/// Sends the count of a request sent on `bound`; `None` when it cannot be sent.
pub fn start(ctx: &mut Ctx, pending: Box<Pending>, bound: u64, band: bool) -> Option<Waiting> {
    let call = backend::count_call(ctx.config(), &pending.req, &pending.body)?;
    let awaited = Awaited::Check { bound, band };
    let waiting = Waiting::send(ctx, pending, &call, awaited).ok()?;
    ctx.count(Metric::BoundChecks);
    Some(waiting)
}

/// The count of a request sent on a bound: stored, and held against its bound. A count above
/// the bound, or, under a cap written from the bound, more than [`BAND_SLACK`] below it, turns
/// skipping off for the route and model.
pub fn checked(ctx: &mut Ctx, model: &str, sent: Sent, counted: Result<Counted, Failure>) {
    let counted = match counted {
        Ok(c) => c,
        Err(failure) => {
            ctx.count(Metric::Failure(failure));
            return;
        }
    };
    ctx.store_count(sent.key, model, sent.link, counted);
    let bound = sent.bound;
    let loose = sent.band && bound.saturating_sub(counted.count) > BAND_SLACK;
    if counted.count <= bound && !loose {
        return;
    }
    ctx.count(Metric::BoundViolations);
    if ctx.set_flag(Flag::SkipOff, model) {
        log::warn!(
            "incontext: a count broke its bound (count {}, bound {bound}); skipping is off for this route",
            counted.count
        );
    }
}
