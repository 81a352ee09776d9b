//! Where every request's path ends: one [`Verdict`], concluded once, sets the report, the
//! outcome counter and what the answer side needs (the [`Budget`]) together ([`Concluded`]).
//! A rewrite or a local reply is counted when the host applied it (`Exchange::applied`), so
//! one request counts one outcome whatever the host does.

use super::context;
use super::route::Ctx;
use super::state::{Pending, Verdict};
use super::{Action, LocalReply, Metric, Rewrite, Step};
use crate::config::OnInsufficient;
use crate::dialect::Form;
use crate::plan::{decide, Count, Inputs, Outcome, Source};
use crate::reason::Reason;
use crate::report::Report;
use crate::request::Request;
use crate::response::{Budget, Dialect, WindowError};

/// What concluding a request sets, together.
#[derive(Debug)]
pub struct Concluded {
    pub report: Report,
    /// What the request side knew, for the answer.
    pub budget: Option<Budget>,
    /// The outcome counter a rewrite or a local reply counts once the host applied it.
    pub applying: Option<Metric>,
    /// The report goes out with a local reply.
    pub replied: bool,
    pub step: Step,
}

impl Verdict {
    /// Unchanged before anything was counted.
    pub fn unchanged(reason: Reason) -> Verdict {
        Verdict::Unchanged {
            reason,
            count: None,
            budget: None,
        }
    }

    /// Decides with a count (docs/spec.md §2).
    pub fn decide(ctx: &mut Ctx, req: &Request, body: Vec<u8>, count: Count) -> Verdict {
        let config = ctx.config();
        // A count without its own context length (an estimate, token ids, a counter that
        // reports none) uses the one learned for this model and route, when none is set.
        let learned = match (config.context_length, count.max_model_len) {
            (None, None) => ctx.context(&req.model_name(&body)),
            _ => None,
        };
        let config = ctx.config();
        let decision = decide(req, &body, config, count, learned);
        // P is the server's count (a bound is an upper bound of it, and an estimate a guess).
        let exact = matches!(count.source, Source::Exact | Source::Cache);
        let written = match decision.outcome {
            Outcome::Rewrite { value, .. } => Some(value),
            _ => None,
        };
        let context = match &decision.inputs {
            Some(inputs) => Some(inputs.context),
            None => crate::plan::window(config, count.max_model_len.or(learned))
                .ok()
                .map(|(_, c)| c),
        };
        let caller = req.cap.map(|c| c.value);
        // Anthropic: the window, not the caller, set the cap: it is all the window left.
        let window_cap = match (written, &decision.inputs) {
            (Some(v), Some(inputs)) if req.form == Form::Messages => {
                let all_left = i128::from(v) == inputs.remaining();
                (all_left && caller.is_none_or(|b| v < b)).then_some(v)
            }
            _ => None,
        };
        let budget = Budget {
            dialect: Dialect::of(req.form),
            backend: config.tokenizer.backend,
            model: req.model_name(&body),
            prompt: Some(decision.prompt),
            exact,
            too_long: exact && context.is_some_and(|c| decision.prompt >= c),
            context,
            cap: written.or(caller),
            window_cap,
            // The answer's usage checks the count, or the bound a cap was written from (docs/spec.md
            // §15a).
            usage: matches!(count.source, Source::Exact | Source::Cache | Source::Bound),
        };
        let (prompt, source) = (decision.prompt, decision.source);
        match decision.outcome {
            Outcome::Rewrite { edit, value } => Verdict::Rewritten {
                prompt,
                source,
                value,
                rewrite: Rewrite { body, edit },
                budget,
            },
            Outcome::Unchanged(reason) => {
                if reason == Reason::WindowConfig && ctx.route.first_window_warning() {
                    log::error!(
                        "incontext: the learned context length leaves fallback_margin_tokens + min_output_tokens >= the window; requests for that model pass unchanged"
                    );
                }
                Verdict::Unchanged {
                    reason,
                    count: Some((prompt, source)),
                    budget: Some(budget),
                }
            }
            Outcome::Reject { body } => Verdict::Rejected {
                prompt,
                source,
                body,
                budget,
            },
        }
    }

    /// A bound P_hi proved the outcome: unchanged, `fits`. P_hi is an upper bound: an
    /// answer's window error is read with the estimate.
    pub fn fits(ctx: &mut Ctx, pending: &Pending, p_hi: u64) -> Verdict {
        let context = match ctx.config().context_length {
            Some(c) => Some(c),
            None => ctx.context(&pending.model),
        };
        let budget = Budget {
            dialect: Dialect::of(pending.req.form),
            backend: ctx.config().tokenizer.backend,
            model: pending.model.clone(),
            prompt: pending.req.estimate(&pending.body),
            exact: false,
            too_long: false,
            context,
            cap: pending.req.cap.map(|c| c.value),
            window_cap: None,
            // The answer's usage checks the bound and anchors the next turn.
            usage: true,
        };
        Verdict::Unchanged {
            reason: Reason::Fits,
            count: Some((p_hi, Source::Bound)),
            budget: Some(budget),
        }
    }

    /// The counter refused the prompt as longer than the context (docs/spec.md §13): reject
    /// mode answers the dialect's error itself; otherwise the request goes on unchanged and
    /// the server's answer is translated.
    pub fn too_long(ctx: &mut Ctx, pending: Box<Pending>, e: &WindowError) -> Verdict {
        context::learn_refused(ctx, &pending.model, e);
        let config = ctx.config();
        let Pending { req, body, .. } = *pending;
        // P: the server's exact count where it gave one, else the larger of its lower bound
        // and the estimate; the source says which.
        let (prompt, source) = match (e.prompt, req.estimate(&body)) {
            (Some(a), _) if e.prompt_exact => (a, Source::Exact),
            (Some(a), Some(b)) if b > a => (b, Source::Estimate),
            (Some(a), _) => (a, Source::AtLeast),
            (None, b) => (b.unwrap_or(0), Source::Estimate),
        };
        let windows = crate::plan::window(config, e.context).ok();
        let caller = req.cap.map(|c| c.value);
        let budget = Budget {
            dialect: Dialect::of(req.form),
            backend: config.tokenizer.backend,
            model: req.model_name(&body),
            prompt: Some(prompt),
            exact: e.prompt_exact,
            too_long: true,
            context: windows.map(|(_, c)| c),
            cap: caller,
            window_cap: None,
            usage: false,
        };
        let reject = config.on_insufficient == OnInsufficient::Reject;
        match windows {
            Some((w, c)) if reject => {
                let inputs = Inputs {
                    cap: caller,
                    ..Inputs::of(config, (w, c), prompt)
                };
                Verdict::Rejected {
                    prompt,
                    source,
                    body: req
                        .form
                        .reject_body(w, prompt, inputs.remaining(), inputs.required()),
                    budget,
                }
            }
            _ => Verdict::Unchanged {
                reason: Reason::TooLong,
                count: Some((prompt, source)),
                budget: Some(budget),
            },
        }
    }

    /// The report, the counter (for a rewrite or a local reply, once the host applied it),
    /// the budget and the step of a request ending with this verdict.
    pub fn conclude(self, ctx: &mut Ctx) -> Concluded {
        let report = |action, reason, count: Option<(u64, Source)>, max_tokens| Report {
            action,
            reason,
            prompt: count.map(|c| c.0),
            source: count.map(|c| c.1),
            max_tokens,
        };
        match self {
            Verdict::Unchanged {
                reason,
                count,
                budget,
            } => {
                ctx.count(Metric::Unchanged(reason));
                log::debug!("incontext: unchanged ({})", reason.as_str());
                Concluded {
                    report: report("unchanged", Some(reason), count, None),
                    budget,
                    applying: None,
                    replied: false,
                    step: Step::Done(Action::Continue),
                }
            }
            Verdict::Rewritten {
                prompt,
                source,
                value,
                rewrite,
                budget,
            } => {
                log::debug!(
                    "incontext: rewritten prompt={prompt} source={} max_tokens={value}",
                    source.as_str()
                );
                let count = Some((prompt, source));
                Concluded {
                    report: report("rewritten", None, count, Some(value)),
                    budget: Some(budget),
                    applying: Some(Metric::Rewritten),
                    replied: false,
                    step: Step::Done(Action::Rewrite(rewrite)),
                }
            }
            Verdict::Rejected {
                prompt,
                source,
                body,
                budget,
            } => {
                log::debug!("incontext: rejected prompt={prompt}");
                let report = report("rejected", None, Some((prompt, source)), None);
                let mut headers = vec![("content-type", "application/json".to_string())];
                if ctx.config().response_headers {
                    headers.extend(report.headers());
                }
                Concluded {
                    report,
                    budget: Some(budget),
                    applying: Some(Metric::Rejected),
                    replied: true,
                    step: Step::Done(Action::Reply(LocalReply {
                        status: 400,
                        headers,
                        body,
                    })),
                }
            }
        }
    }
}
