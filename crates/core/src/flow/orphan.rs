//! A call whose request is gone (the client left, the stream was reset), kept until its
//! reply: what the reply tells is still stored (the count, a learned context length, a
//! checked bound), so the next identical request need not ask again. It holds the cache key,
//! the model and the conversation's last link, not the body.

use super::route::{Ctx, RouteId};
use super::state::{Awaited, Sent, Waiting};
use super::{check, context, count, Host, Metric, Plugin, Reply};
use crate::backend::{self, CallKind};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    token: u32,
    kind: CallKind,
    awaited: Kept,
    key: u128,
    pub(super) model: String,
    link: Option<u128>,
    route: RouteId,
}

/// What an orphan's call was awaited for, of what still matters without its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kept {
    Context,
    Count,
    Check(u64, bool),
}

impl Orphan {
    /// What a call in flight still needs once its request is gone; a tail's count tells
    /// nothing without its request.
    pub(super) fn of(waiting: Waiting, route: RouteId) -> Option<Orphan> {
        let awaited = match waiting.awaited {
            Awaited::Context => Kept::Context,
            Awaited::Count => Kept::Count,
            Awaited::Check { bound, band } => Kept::Check(bound, band),
            Awaited::Tail(_) => return None,
        };
        let pending = *waiting.pending;
        Some(Orphan {
            token: waiting.token,
            kind: waiting.kind,
            awaited,
            key: pending.key,
            model: pending.model,
            link: pending.link,
            route,
        })
    }

    /// What a call in flight still needs once its request is gone, when the host cancelled
    /// that call with the request (a native module's stream takes its calls with it): the
    /// same call is made again through `ctx` (by what outlives the request), not counted
    /// again, and the orphan waits for its reply. `None`: nothing left to wait for, or the
    /// call could not be made.
    pub(super) fn again(ctx: &mut Ctx, waiting: Waiting, route: RouteId) -> Option<Orphan> {
        let pending = &waiting.pending;
        let call = match waiting.awaited {
            Awaited::Context => backend::window_call(ctx.config()),
            Awaited::Count | Awaited::Check { .. } => {
                backend::count_call(ctx.config(), &pending.req, &pending.body)?
            }
            Awaited::Tail(_) => return None,
        };
        let token = ctx.dispatch_again(&call)?;
        Orphan::of(Waiting { token, ..waiting }, route)
    }

    /// The token of the call it waits for.
    pub fn token(&self) -> u32 {
        self.token
    }

    /// The memory it holds, in bytes.
    pub fn held_bytes(&self) -> usize {
        std::mem::size_of::<Orphan>() + self.model.capacity()
    }

    /// The reply to its call: stored, nothing decided. `false`: not its call.
    pub fn on_reply(&self, plugin: &Plugin, host: &mut dyn Host, reply: &Reply) -> bool {
        if reply.token != self.token {
            return false;
        }
        let mut ctx = plugin.ctx(self.route, host);
        match self.awaited {
            Kept::Context => context::learn_from(&mut ctx, &self.model, reply),
            Kept::Count => match count::parse(&ctx, self.kind, reply) {
                Ok(counted) => ctx.store_count(self.key, &self.model, self.link, counted),
                Err(failure) => match context::refusal(&ctx, reply, &Err(failure)) {
                    Some(e) => context::learn_refused(&mut ctx, &self.model, &e),
                    None => ctx.count(Metric::Failure(failure)),
                },
            },
            Kept::Check(bound, band) => {
                let counted = count::parse(&ctx, self.kind, reply);
                let sent = Sent {
                    key: self.key,
                    link: self.link,
                    bound,
                    band,
                };
                check::checked(&mut ctx, &self.model, sent, counted)
            }
        }
        true
    }
}
