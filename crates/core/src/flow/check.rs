//! The check of a request sent on a bound (docs/spec.md §15): once its stream ended it is
//! counted, off its path, and the count is held against the bound. A count above it turns
//! skipping off for the route and model.

use super::count;
use super::exchange::{Awaited, Pending, Waiting};
use super::route::Ctx;
use super::store::Flag;
use super::Metric;
use crate::backend::{self, Counted};
use crate::tokenize::Failure;

/// Sends the count of a request sent on `bound`; `None` when it cannot be sent.
pub fn start(ctx: &mut Ctx, pending: Box<Pending>, bound: u64) -> Option<Waiting> {
    let call = backend::count_call(ctx.config(), &pending.req, &pending.body)?;
    let awaited = Awaited::Check { bound };
    match count::send(ctx, pending, &call, awaited) {
        Ok(super::exchange::Next::Wait(waiting)) => {
            ctx.count(Metric::BoundChecks);
            Some(waiting)
        }
        _ => None,
    }
}

/// The count of a request sent on a bound: stored, and held against its bound.
pub fn checked(
    ctx: &mut Ctx,
    model: &str,
    key: u128,
    link: Option<u128>,
    bound: u64,
    counted: Result<Counted, Failure>,
) {
    let counted = match counted {
        Ok(c) => c,
        Err(failure) => {
            ctx.count(Metric::Failure(failure));
            return;
        }
    };
    ctx.store_count(key, model, link, counted);
    if counted.count <= bound {
        return;
    }
    ctx.count(Metric::BoundViolations);
    if ctx.set_flag(Flag::SkipOff, model) {
        log::warn!(
            "incontext: a count exceeded its bound ({} > {bound}); counting every request of this route from now on",
            counted.count
        );
    }
}
