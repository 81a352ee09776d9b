//! Whether a byte string occurs in a text: memchr's `memmem`, vectorised natively and with
//! wasm `simd128` (the module's build), its search prepared once per needle.

use memchr::memmem::Finder;
use std::sync::OnceLock;

/// Whether `needle` occurs in `hay` (the search prepared for this call; a [`Needle`] prepares it
/// once).
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(hay, needle).is_some()
}

/// A needle known at compile time; the search is prepared on first use.
pub struct Needle {
    bytes: &'static [u8],
    finder: OnceLock<Finder<'static>>,
}

impl Needle {
    pub const fn new(bytes: &'static [u8]) -> Needle {
        Needle {
            bytes,
            finder: OnceLock::new(),
        }
    }

    /// Whether the needle occurs in `hay`.
    pub fn is_in(&self, hay: &[u8]) -> bool {
        self.finder
            .get_or_init(|| Finder::new(self.bytes))
            .find(hay)
            .is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    static REASONING: Needle = Needle::new(b"reasoning_content");

    #[test]
    fn finds_and_misses() {
        let text = b"x".repeat(100);
        assert!(!REASONING.is_in(&text));
        for at in [0, 1, 15, 16, 17, 40, 83] {
            let mut t = text.clone();
            t[at..at + 17].copy_from_slice(b"reasoning_content");
            assert!(REASONING.is_in(&t), "at {at}");
        }
        assert!(Needle::new(b"").is_in(b""));
        assert!(!Needle::new(b"abcd").is_in(b"abc"));
        assert!(Needle::new(b"d").is_in(b"abcd"));
        assert!(contains(b"abcd", b"bc") && !contains(b"abcd", b"cb"));
    }

    proptest! {
        #[test]
        fn agrees_with_windows(
            hay in prop::collection::vec(prop::sample::select(b"ab".to_vec()), 0..200),
            needle in prop::collection::vec(prop::sample::select(b"ab".to_vec()), 1..6),
        ) {
            let leaked: &'static [u8] = Box::leak(needle.clone().into_boxed_slice());
            prop_assert_eq!(
                Needle::new(leaked).is_in(&hay),
                hay.windows(needle.len()).any(|w| w == needle.as_slice())
            );
        }
    }
}
