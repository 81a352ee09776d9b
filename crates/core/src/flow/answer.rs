//! The upstream's answer to a request (docs/spec.md §13): the report headers it carries, a
//! window error translated into the client's dialect, and Anthropic's stop reason.

use super::exchange::Exchange;
use super::{Host, Metric, Plugin};
use crate::report::Report;
use crate::response;

impl Exchange {
    /// The upstream's answer head: what to do with its body.
    pub fn on_response_head(
        &mut self,
        plugin: &Plugin,
        head: &response::Head,
    ) -> response::HeadStep {
        if self.replied {
            return response::HeadStep::Pass;
        }
        let translate = plugin.config().translate_errors;
        self.response
            .on_headers(self.budget.as_ref(), translate, head)
    }

    /// A host call on the answer failed: the rest of it passes as it comes.
    pub fn on_response_host_error(&mut self) {
        self.response = response::Response::default();
    }

    /// An answer body chunk arrived; `size` is what the host buffered.
    pub fn on_response_body(&mut self, size: usize, end_of_stream: bool) -> response::BodyStep {
        self.response.on_body(size, end_of_stream)
    }

    /// Whether the filter holds part of the answer (see [`response::Response::holds`]).
    pub fn response_holds(&self) -> bool {
        self.response.holds()
    }

    /// The bytes [`response::BodyStep::Read`] asked for: what to send instead, if anything.
    /// A translated window error teaches the context length it names.
    pub fn on_response_data(
        &mut self,
        plugin: &Plugin,
        host: &mut dyn Host,
        data: &[u8],
        end_of_stream: bool,
    ) -> response::Edit {
        let out = self
            .response
            .on_data(self.budget.as_ref(), data, end_of_stream);
        let mut ctx = self.ctx(plugin, host);
        if let Some(e) = out.translated {
            ctx.count(Metric::Translated);
            log::debug!("incontext: the server's window error translated");
            if let (Some(c), None, Some(b)) =
                (e.context, ctx.config().context_length, self.budget.as_ref())
            {
                ctx.learn_context(&b.model, c);
            }
        }
        if out.window_stop {
            ctx.count(Metric::WindowStop);
        }
        if let Some(prompt) = out.usage {
            self.on_usage(&mut ctx, prompt);
        }
        out.edit
    }

    pub(super) fn report_headers(&self) -> Vec<(&'static str, String)> {
        self.report
            .as_ref()
            .map(Report::headers)
            .unwrap_or_default()
    }

    /// The headers to add to the upstream's response.
    pub fn response_headers(&self, plugin: &Plugin) -> Vec<(&'static str, String)> {
        if !plugin.config().response_headers || self.replied {
            return Vec::new();
        }
        self.report_headers()
    }
}
