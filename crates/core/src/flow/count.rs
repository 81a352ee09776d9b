//! The count of a request's prompt: the cache, the exact count (with the context length
//! first when nothing else reports it), and the estimate when the tokenizer fails
//! (docs/spec.md §5–§7). Where skipping is on, a bound may prove the outcome first
//! ([`super::proof`]).

use super::route::Ctx;
use super::state::{Awaited, Next, Pending, Verdict, Waiting};
use super::{context, proof, Histogram, Metric, Reply};
use crate::backend::{self, CallKind, Counted};
use crate::bound;
use crate::plan::{Count, Source};
use crate::reason::Reason;
use crate::request::{Counting, Request};
use crate::tokenize::{cache_key, check_context, Failure, Reply as Stored};

/// A request's cache key and what the cache holds under it, looked up before [`start`].
pub struct Looked {
    key: u128,
    stored: Option<Stored>,
    /// The request was validated (`Request::validate`) already.
    validated: bool,
}

/// Proves a request analyzed on guesses of where its long values end (`json::guess`), or
/// `None`: analyze it again without guesses. The analysis left unchecked only the values the
/// cache key hashes (it validates a duplicate `messages` or `tools` at once), so a count
/// stored under the key proves the guesses: it was stored for a request whose values were
/// validated, so each guessed span is a whole JSON value, and a value's skim ends where the
/// value ends. Without one, the request's own validation proves them, as it does a skim's (a
/// miss validates anyway).
pub fn prove(ctx: &mut Ctx, req: &Request, body: &[u8]) -> Option<Looked> {
    if req.counting != Counting::Tokenize {
        return None;
    }
    let key = cache_key(req, body, &ctx.route.scope, ctx.config().context_length);
    let stored = ctx.stored_count(key);
    if stored.is_some() {
        return Some(Looked {
            key,
            stored,
            validated: false,
        });
    }
    req.validate(body).is_ok().then_some(Looked {
        key,
        stored,
        validated: true,
    })
}

/// The first step of a budgeted request; `looked`, what [`prove`] found for it already.
pub fn start(ctx: &mut Ctx, req: Request, body: Vec<u8>, looked: Option<Looked>) -> Next {
    if req.counting == Counting::Tokenize {
        return cached(ctx, req, body, looked);
    }
    if let Err(reason) = req.validate(&body) {
        return Next::Conclude(Verdict::unchanged(reason));
    }
    match req.counting {
        Counting::Exact(n) => {
            let count = Count {
                tokens: n,
                source: Source::Exact,
                max_model_len: None,
            };
            Next::Conclude(Verdict::decide(ctx, &req, body, count))
        }
        Counting::Estimate | Counting::Tokenize => estimate(ctx, &req, body),
    }
}

/// A stored count decides at once; otherwise the request is validated, then proved by a
/// bound or counted.
fn cached(ctx: &mut Ctx, req: Request, body: Vec<u8>, looked: Option<Looked>) -> Next {
    let config = ctx.config();
    let configured = config.context_length;
    let Looked {
        key,
        stored,
        validated,
    } = looked.unwrap_or_else(|| {
        let key = cache_key(&req, &body, &ctx.route.scope, configured);
        Looked {
            key,
            stored: ctx.stored_count(key),
            validated: false,
        }
    });
    let body = match stored {
        Some(stored) => match hit(ctx, &req, body, stored) {
            Ok(verdict) => {
                ctx.count(Metric::CacheHits);
                return Next::Conclude(verdict);
            }
            Err(body) => body,
        },
        None => body,
    };
    // What `analyze` only skimmed must validate, or the request passes unchanged.
    if !validated {
        if let Err(reason) = req.validate(&body) {
            return Next::Conclude(Verdict::unchanged(reason));
        }
    }
    ctx.count(Metric::CacheMisses);
    let model = req.model_name(&body);
    let chain = ctx
        .route
        .skipping(&req)
        .then(|| bound::chain(&req, &body, &ctx.route.scope, configured))
        .flatten();
    let pending = Box::new(Pending {
        req,
        body,
        key,
        model,
        link: chain.as_ref().and_then(|c| c.links.last().copied()),
        sent_ms: None,
    });
    if let Some(chain) = &chain {
        proof::remember_last(ctx, &pending, chain);
    }
    match chain.and_then(|chain| proof::prove(ctx, &pending, &chain)) {
        Some(proof::Proof::Fits(p_hi)) => Next::Send(pending, p_hi),
        Some(proof::Proof::Tail(call, awaited)) => {
            ctx.count(Metric::TailCounts);
            Waiting::send(ctx, pending, &call, awaited)
                .map_or_else(|pending| whole(ctx, pending), Next::Wait)
        }
        None => whole(ctx, pending),
    }
}

/// The decision on a stored count (the caller counts the hit), or the body back when the
/// count's context length is not the one configured (then the request is counted again).
pub fn hit(
    ctx: &mut Ctx,
    req: &Request,
    body: Vec<u8>,
    stored: Stored,
) -> Result<Verdict, Vec<u8>> {
    // A count stored without the context length it came with (0) has none to check.
    let window = Some(stored.max_model_len).filter(|c| *c > 0);
    let configured = ctx.config().context_length;
    if window.is_some_and(|c| check_context(c, configured).is_err()) {
        return Err(body);
    }
    // The server's context length may have changed since the count was stored.
    let window = match (window, configured) {
        (Some(c), None) => ctx.fresh_context(&req.model_name(&body)).or(Some(c)),
        _ => window,
    };
    let count = Count {
        tokens: stored.count,
        source: Source::Cache,
        max_model_len: window,
    };
    Ok(Verdict::decide(ctx, req, body, count))
}

/// Counts the whole prompt: the context length first when nothing reports it.
pub fn whole(ctx: &mut Ctx, pending: Box<Pending>) -> Next {
    let config = ctx.config();
    let needs_context = !backend::count_reports_window(config, pending.req.form)
        && config.context_length.is_none()
        && ctx.fresh_context(&pending.model).is_none();
    if needs_context {
        let call = backend::window_call(ctx.config());
        // No context length now: count anyway (a configured window_tokens may do).
        return Waiting::send(ctx, pending, &call, Awaited::Context)
            .map_or_else(|pending| count(ctx, pending), Next::Wait);
    }
    count(ctx, pending)
}

/// Sends the whole prompt's count.
fn count(ctx: &mut Ctx, pending: Box<Pending>) -> Next {
    let Some(call) = backend::count_call(ctx.config(), &pending.req, &pending.body) else {
        // A field the payload needs does not parse (the server would refuse it too).
        return estimate(ctx, &pending.req, pending.body);
    };
    ctx.count(Metric::CountCalls);
    Waiting::send(ctx, pending, &call, Awaited::Count).map_or_else(
        |pending| failed(ctx, Failure::Dispatch, pending),
        Next::Wait,
    )
}

/// The context length arrived: learned, then the whole prompt is counted.
pub fn on_context(ctx: &mut Ctx, pending: Box<Pending>, reply: &Reply) -> Next {
    context::learn_from(ctx, &pending.model, reply);
    count(ctx, pending)
}

/// The whole prompt's count arrived: stored and decided, the refusal of a prompt longer than
/// the context read, or the estimate when the tokenizer failed.
pub fn on_count(ctx: &mut Ctx, pending: Box<Pending>, kind: CallKind, reply: &Reply) -> Next {
    let counted = on_path(ctx, &pending, kind, reply);
    match context::refusal(ctx, reply, &counted) {
        Some(e) => Next::Conclude(Verdict::too_long(ctx, pending, &e)),
        None => match counted {
            Ok(counted) => exact(ctx, pending, counted),
            Err(failure) => failed(ctx, failure, pending),
        },
    }
}

/// A count reply, parsed.
pub fn parse(ctx: &Ctx, kind: CallKind, reply: &Reply) -> Result<Counted, Failure> {
    reply.read(|b| backend::parse_count(ctx.config(), kind, reply.status, b))
}

/// The reply to a count on the request's path, parsed; its duration recorded.
pub fn on_path(
    ctx: &mut Ctx,
    pending: &Pending,
    kind: CallKind,
    reply: &Reply,
) -> Result<Counted, Failure> {
    if let (Some(sent), Some(now)) = (pending.sent_ms, ctx.now_ms()) {
        ctx.record(Histogram::CountMs, now.saturating_sub(sent));
    }
    parse(ctx, kind, reply)
}

/// An exact count: stored, then decided.
fn exact(ctx: &mut Ctx, pending: Box<Pending>, counted: Counted) -> Next {
    ctx.store_count(pending.key, &pending.model, pending.link, counted);
    let Pending { req, body, .. } = *pending;
    let count = Count {
        tokens: counted.count,
        source: Source::Exact,
        max_model_len: counted.window,
    };
    Next::Conclude(Verdict::decide(ctx, &req, body, count))
}

fn failed(ctx: &mut Ctx, failure: Failure, pending: Box<Pending>) -> Next {
    ctx.count(Metric::Failure(failure));
    log::warn!(
        "incontext: tokenizer failure ({}); using the estimate",
        failure.as_str()
    );
    let Pending { req, body, .. } = *pending;
    estimate(ctx, &req, body)
}

fn estimate(ctx: &mut Ctx, req: &Request, body: Vec<u8>) -> Next {
    ctx.count(Metric::Estimates);
    Next::Conclude(match req.estimate(&body) {
        Some(tokens) => {
            let count = Count {
                tokens,
                source: Source::Estimate,
                max_model_len: None,
            };
            Verdict::decide(ctx, req, body, count)
        }
        None => Verdict::unchanged(Reason::Internal),
    })
}
