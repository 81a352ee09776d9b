//! Learning C, the context length (docs/spec.md §1, §13): from a call that asks for it, from a
//! count that reports it, and from a counter that refused the prompt as longer than it.

use super::route::Ctx;
use super::{Metric, Reply};
use crate::backend::{self, Counted};
use crate::response::{self, WindowError};
use crate::tokenize::Failure;

/// Learns C from the reply to the context-length call (or counts its failure).
pub fn learn_from(ctx: &mut Ctx, model: &str, reply: &Reply) {
    let kind = backend::window_call(ctx.config()).kind;
    match reply.read(|b| backend::parse_window(kind, Some(model), reply.status, b)) {
        Ok(c) => ctx.learn_context(model, c),
        Err(failure) => {
            ctx.count(Metric::Failure(failure));
            log::warn!(
                "incontext: context length call failed ({}); counting without it",
                failure.as_str()
            );
        }
    }
}

/// The counter refused the prompt as longer than the context (vLLM's `count_tokens` and
/// render answer 400 with the context-length message): the prompt is known to exceed C.
pub fn refusal(
    ctx: &Ctx,
    reply: &Reply,
    counted: &Result<Counted, Failure>,
) -> Option<WindowError> {
    if !matches!((counted, reply.status), (Err(Failure::Status), Some(400))) {
        return None;
    }
    let backend = ctx.config().tokenizer.backend;
    reply
        .read(|b| Ok(response::window::parse(backend, b)))
        .ok()
        .flatten()
        .filter(|e| e.prompt_exceeds)
}

/// The context length a refusal names, learned.
pub fn learn_refused(ctx: &mut Ctx, model: &str, e: &WindowError) {
    if let (Some(c), None) = (e.context, ctx.config().context_length) {
        ctx.learn_context(model, c);
    }
}
