//! The values the strategies and the exchange pass each other: a request held or sent
//! ([`Pending`]), a call in flight and what it awaits ([`Waiting`], [`Awaited`]), what a
//! strategy asks of the exchange ([`Next`]) and how a request ends ([`Verdict`]). Below every
//! strategy: it names none of them.

use super::route::Ctx;
use super::Rewrite;
use crate::backend::{self, CallKind};
use crate::plan::Source;
use crate::reason::Reason;
use crate::request::Request;
use crate::response::Budget;

/// How far below the exact cap a cap written from a bound may be (docs/spec.md §15a).
pub const BAND_SLACK: u64 = 64;

/// A request held, or sent on a bound, with what its calls need.
#[derive(Debug)]
pub struct Pending {
    pub req: Request,
    pub body: Vec<u8>,
    /// The prompt's cache key.
    pub key: u128,
    pub model: String,
    /// The last link of the conversation's chain, when skipping is on (docs/spec.md §15).
    pub link: Option<u128>,
    /// When the call on the request's path went out.
    pub sent_ms: Option<u64>,
}

/// What a call in flight was sent for: what its reply continues with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Awaited {
    /// The context length, then the whole prompt's count.
    Context,
    /// The whole prompt's count, then the decision.
    Count,
    /// The count of the conversation's new messages alone, and what it must meet.
    Tail(TailNeeds),
    /// The count of a request sent on this bound (`band`: with a cap written from it), after
    /// its stream ended.
    Check { bound: u64, band: bool },
}

/// What a tail's count must meet: P_hi = `base` + the count; the request skips its count
/// when W − P_hi ≥ `fits`, and has its cap written from P_hi when W − P_hi ≥ `band`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TailNeeds {
    pub base: u64,
    pub fits: Option<u64>,
    pub band: Option<u64>,
    pub w: u64,
}

/// One call in flight.
#[derive(Debug)]
pub struct Waiting {
    pub token: u32,
    pub kind: CallKind,
    pub awaited: Awaited,
    pub pending: Box<Pending>,
}

impl Waiting {
    /// Sends `call` for `pending`; the pending request back when it could not be sent.
    pub fn send(
        ctx: &mut Ctx,
        mut pending: Box<Pending>,
        call: &backend::Call,
        awaited: Awaited,
    ) -> Result<Waiting, Box<Pending>> {
        if matches!(awaited, Awaited::Count | Awaited::Tail(_)) {
            pending.sent_ms = ctx.now_ms();
        }
        match ctx.dispatch(call) {
            Some(token) => Ok(Waiting {
                token,
                kind: call.kind,
                awaited,
                pending,
            }),
            None => Err(pending),
        }
    }
}

/// What a check needs of a request sent on a bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    pub key: u128,
    pub link: Option<u128>,
    pub bound: u64,
    /// A cap was written from the bound: it must be within [`BAND_SLACK`] of the count.
    pub band: bool,
}

impl Sent {
    /// What checking `pending`, sent on `bound`, needs.
    pub fn of(pending: &Pending, bound: u64, band: bool) -> Sent {
        Sent {
            key: pending.key,
            link: pending.link,
            bound,
            band,
        }
    }
}

/// What a strategy asks of the exchange.
pub enum Next {
    /// A call is out.
    Wait(Waiting),
    /// A bound proves the outcome: the request goes on unchanged, checked after its stream.
    Send(Box<Pending>, u64),
    /// A cap written from the bound P_hi: the request goes on rewritten, checked after its
    /// stream.
    Band(Box<Pending>, u64, Verdict),
    /// No bound proves the outcome: the whole prompt is counted.
    Whole(Box<Pending>),
    Conclude(Verdict),
}

/// How a request ends.
#[derive(Debug)]
pub enum Verdict {
    Unchanged {
        reason: Reason,
        count: Option<(u64, Source)>,
        budget: Option<Budget>,
    },
    Rewritten {
        prompt: u64,
        source: Source,
        value: u64,
        rewrite: Rewrite,
        budget: Budget,
    },
    Rejected {
        prompt: u64,
        source: Source,
        body: Vec<u8>,
        budget: Budget,
    },
}
