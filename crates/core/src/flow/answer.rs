//! The upstream's answer to a request (docs/spec.md §13): the report headers it carries, a
//! window error translated into the client's dialect, Anthropic's stop reason, and the
//! prompt its usage reports.

use super::route::Ctx;
use super::Metric;
use crate::report::Report;
use crate::response::{self, Budget};

/// What the answer's bytes told, taken in: a translated window error teaches the context
/// length it names, and the counters count what was edited. The prompt the answer's usage
/// reported, when it did.
pub fn told(ctx: &mut Ctx, budget: Option<&Budget>, out: &response::Data) -> Option<u64> {
    if let Some(e) = &out.translated {
        ctx.count(Metric::Translated);
        log::debug!("incontext: the server's window error translated");
        if let (Some(c), None, Some(b)) = (e.context, ctx.config().context_length, budget) {
            ctx.learn_context(&b.model, c);
        }
    }
    if out.window_stop {
        ctx.count(Metric::WindowStop);
    }
    out.usage
}

/// The answer reported its prompt for a request not sent on a bound: an exact count it
/// differs from is counted and logged (once per route and model).
pub fn usage(ctx: &mut Ctx, budget: Option<&Budget>, prompt: u64) {
    let Some(budget) = budget else {
        return;
    };
    let counted = budget.prompt.filter(|_| budget.exact);
    if counted.is_some_and(|p| p != prompt) {
        ctx.count(Metric::UsageMismatch);
        if ctx.set_flag(super::store::Flag::UsageMismatch, &budget.model) {
            log::warn!(
                "incontext: usage {prompt} != count {}: the tokenizer route does not count as the server",
                counted.unwrap_or(0)
            );
        }
    }
}

/// The report headers.
pub fn headers(report: Option<&Report>) -> Vec<(&'static str, String)> {
    report.map(Report::headers).unwrap_or_default()
}
