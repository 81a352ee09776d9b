//! Why a request was left unchanged: the `unchanged:<reason>` header value and the
//! `incontext_unchanged_<reason>` counter.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    Method,
    Encoding,
    TooLarge,
    NotJson,
    NotObject,
    Shape,
    Model,
    NoCap,
    NoWindow,
    WindowConfig,
    Insufficient,
    Internal,
    CountOnly,
    ResponsesApi,
    ThinkingBudget,
    Stateful,
    /// A bound proves the caller's cap (or, without one, the server's default) fits.
    Fits,
    TooLong,
}

impl Reason {
    pub const ALL: [Reason; 18] = [
        Reason::Method,
        Reason::Encoding,
        Reason::TooLarge,
        Reason::NotJson,
        Reason::NotObject,
        Reason::Shape,
        Reason::Model,
        Reason::NoCap,
        Reason::NoWindow,
        Reason::WindowConfig,
        Reason::Insufficient,
        Reason::Internal,
        Reason::CountOnly,
        Reason::ResponsesApi,
        Reason::ThinkingBudget,
        Reason::Stateful,
        Reason::Fits,
        Reason::TooLong,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Method => "method",
            Reason::Encoding => "encoding",
            Reason::TooLarge => "too_large",
            Reason::NotJson => "not_json",
            Reason::NotObject => "not_object",
            Reason::Shape => "shape",
            Reason::Model => "model",
            Reason::NoCap => "no_cap",
            Reason::NoWindow => "no_window",
            Reason::WindowConfig => "window_config",
            Reason::Insufficient => "insufficient",
            Reason::Internal => "internal",
            Reason::CountOnly => "count_only",
            Reason::ResponsesApi => "responses_api",
            Reason::ThinkingBudget => "thinking_budget",
            Reason::Stateful => "stateful",
            Reason::Fits => "fits",
            Reason::TooLong => "too_long",
        }
    }

    /// Position in [`Reason::ALL`], for metric tables.
    pub fn index(self) -> usize {
        self as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_in_index_order_with_unique_names() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
        let mut names: Vec<_> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Reason::ALL.len());
    }
}
