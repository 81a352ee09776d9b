//! The budget rule (docs/spec.md §2).

/// Everything the rule needs for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inputs {
    /// W: the window prompt + output must fit in.
    pub window: u64,
    /// C: the context length, used with `truncate` (when unknown, pass W: it is ≤ C).
    pub context: u64,
    /// R: minimum viable output reserve.
    pub reserve: u64,
    /// F: margin added when the count is an estimate.
    pub margin: u64,
    /// P: prompt tokens.
    pub prompt: u64,
    /// Whether P is exact (margin 0) or an estimate (margin F).
    pub exact: bool,
    /// B: the caller's smallest valid cap.
    pub cap: Option<u64>,
    /// T: `truncate_prompt_tokens` when ≥ 0.
    pub truncate: Option<u64>,
}

/// The rule's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Write this cap.
    Rewrite(u64),
    /// Not enough room: `value` < `required` (value may be negative).
    Insufficient { value: i128, required: u64 },
}

impl Inputs {
    /// The rule's inputs for a request of `config` with W and C known.
    pub fn of(
        config: &crate::config::Config,
        (window, context): (u64, u64),
        prompt: u64,
    ) -> Inputs {
        Inputs {
            window,
            context,
            reserve: config.min_output_tokens,
            margin: config.fallback_margin_tokens,
            prompt,
            exact: true,
            cap: None,
            truncate: None,
        }
    }

    /// 0 for an exact P, else F.
    pub fn margin(&self) -> u64 {
        if self.exact {
            0
        } else {
            self.margin
        }
    }

    /// W − P − margin (negative when the prompt alone is past the window).
    pub fn remaining(&self) -> i128 {
        i128::from(self.window) - i128::from(self.prompt) - i128::from(self.margin())
    }

    /// min(R, B), or R without B.
    pub fn required(&self) -> u64 {
        self.cap.map_or(self.reserve, |b| b.min(self.reserve))
    }
}

/// value = min(W − P − margin, B, C − T); rewrite iff value ≥ min(R, B) (or R without B).
pub fn evaluate(i: &Inputs) -> Verdict {
    let required = i.required();
    let mut value = i.remaining();
    if let Some(b) = i.cap {
        value = value.min(i128::from(b));
    }
    if let Some(t) = i.truncate {
        value = value.min(i128::from(i.context) - i128::from(t));
    }
    if value >= i128::from(required) {
        // value ≤ remaining ≤ W, so it fits in u64.
        Verdict::Rewrite(u64::try_from(value).unwrap_or(u64::MAX))
    } else {
        Verdict::Insufficient { value, required }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn inputs(prompt: u64, cap: Option<u64>) -> Inputs {
        Inputs {
            window: 32768,
            context: 32768,
            reserve: 4096,
            margin: 1024,
            prompt,
            exact: true,
            cap,
            truncate: None,
        }
    }

    #[test]
    fn boundary_r_and_r_minus_one() {
        assert_eq!(
            evaluate(&inputs(32768 - 4096, None)),
            Verdict::Rewrite(4096)
        );
        assert_eq!(
            evaluate(&inputs(32768 - 4095, None)),
            Verdict::Insufficient {
                value: 4095,
                required: 4096
            }
        );
    }

    #[test]
    fn never_below_r_without_cap() {
        assert!(matches!(
            evaluate(&inputs(32767, None)),
            Verdict::Insufficient { .. }
        ));
        assert!(matches!(
            evaluate(&inputs(40000, None)),
            Verdict::Insufficient { value: -7232, .. }
        ));
    }

    #[test]
    fn smaller_cap_kept_and_lowers_required() {
        assert_eq!(evaluate(&inputs(100, Some(50))), Verdict::Rewrite(50));
        // 60 tokens left, cap 50: fits
        assert_eq!(
            evaluate(&inputs(32768 - 60, Some(50))),
            Verdict::Rewrite(50)
        );
        // 49 left, cap 50: not enough for the caller's own minimum
        assert!(matches!(
            evaluate(&inputs(32768 - 49, Some(50))),
            Verdict::Insufficient { required: 50, .. }
        ));
        // huge cap clamps to remaining
        assert_eq!(
            evaluate(&inputs(1000, Some(u64::MAX))),
            Verdict::Rewrite(31768)
        );
    }

    #[test]
    fn estimate_adds_margin() {
        let mut i = inputs(1000, None);
        i.exact = false;
        assert_eq!(evaluate(&i), Verdict::Rewrite(32768 - 1000 - 1024));
    }

    #[test]
    fn truncate_limits_by_context() {
        let mut i = inputs(100, None);
        i.truncate = Some(30000);
        assert_eq!(
            evaluate(&i),
            Verdict::Insufficient {
                value: 2768,
                required: 4096
            }
        );
        i.reserve = 100;
        assert_eq!(evaluate(&i), Verdict::Rewrite(2768));
    }

    proptest! {
        #[test]
        fn properties(w in 2u64..200_000, p in 0u64..250_000, r in 1u64..50_000, f in 0u64..5_000,
                      exact: bool, cap in proptest::option::of(1u64..300_000)) {
            let i = Inputs { window: w, context: w, reserve: r, margin: f, prompt: p, exact, cap, truncate: None };
            let required = cap.map_or(r, |b| b.min(r));
            match evaluate(&i) {
                Verdict::Rewrite(v) => {
                    prop_assert!(v >= required);
                    if let Some(b) = cap { prop_assert!(v <= b); }
                    let margin = if exact { 0 } else { f };
                    prop_assert!(u128::from(p) + u128::from(margin) + u128::from(v) <= u128::from(w));
                    // monotone: one more prompt token never raises the value
                    let more = Inputs { prompt: p + 1, ..i };
                    match evaluate(&more) {
                        Verdict::Rewrite(v2) => prop_assert!(v2 <= v),
                        Verdict::Insufficient { .. } => {}
                    }
                }
                Verdict::Insufficient { value, required: req } => {
                    prop_assert_eq!(req, required);
                    prop_assert!(value < i128::from(required));
                    // monotone: more prompt never makes room
                    let more = Inputs { prompt: p + 1, ..i };
                    let more_insufficient = matches!(evaluate(&more), Verdict::Insufficient { .. });
                    prop_assert!(more_insufficient);
                }
            }
        }

        #[test]
        fn boundary_is_exact(w in 10_000u64..200_000, r in 1u64..5_000) {
            let base = Inputs { window: w, context: w, reserve: r, margin: 0, prompt: w - r, exact: true, cap: None, truncate: None };
            prop_assert_eq!(evaluate(&base), Verdict::Rewrite(r));
            let over = Inputs { prompt: w - r + 1, ..base };
            let over_insufficient = matches!(evaluate(&over), Verdict::Insufficient { .. });
            prop_assert!(over_insufficient);
        }
    }
}
