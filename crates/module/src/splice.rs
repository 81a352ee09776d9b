//! A rewrite written over the body Envoy holds, in place. Envoy's ABI can only drain a body
//! from its front and append at its end, and hands out its slices to write in place; a
//! rewrite changes a few bytes in the body's head (`body[keep..end]` becomes `tail`, no
//! longer than what it replaces when a cap is replaced). So the head is written where it
//! ends, and the bytes it saves are drained from the front:
//!
//! ```text
//! before   [ kept ........ | old caps  | rest ]
//! written  [ by | kept ........ | tail | rest ]     (kept moved right by `by`)
//! drained       [ kept ........ | tail | rest ]
//! ```
//!
//! No byte is allocated or copied into Envoy, and no slice is freed or made: the kept part is
//! moved within Envoy's slices. When the tail does not fit (a cap inserted where there was
//! none) the body is replaced whole.

use crate::envoy::{Body, Envoy};
use incontext_core::rewrite::Edit;

/// A body as Envoy's slices, in order, addressed as one run of bytes.
pub(crate) struct Chunks<'a, 'b> {
    chunks: &'a mut [&'b mut [u8]],
    /// Where each slice starts in the run.
    starts: Vec<usize>,
    len: usize,
}

impl<'a, 'b> Chunks<'a, 'b> {
    pub(crate) fn new(chunks: &'a mut [&'b mut [u8]]) -> Self {
        let mut starts = Vec::with_capacity(chunks.len());
        let mut len = 0;
        for c in chunks.iter() {
            starts.push(len);
            len += c.len();
        }
        Chunks {
            chunks,
            starts,
            len,
        }
    }

    /// The slice holding byte `end - 1`, and `end`'s offset in it (at least 1).
    fn before(&self, end: usize) -> (usize, usize) {
        let i = self.starts.partition_point(|&s| s < end).saturating_sub(1);
        (i, end - self.starts.get(i).copied().unwrap_or_default())
    }

    /// Copies `[from, from + n)` to `[to, to + n)`, `to > from`, from the back (the ranges
    /// may overlap).
    fn move_right(&mut self, from: usize, to: usize, n: usize) {
        let mut left = n;
        while left > 0 {
            let (si, so) = self.before(from + left);
            let (di, d_off) = self.before(to + left);
            let step = so.min(d_off).min(left);
            if si == di {
                if let Some(c) = self.chunks.get_mut(si) {
                    c.copy_within(so - step..so, d_off - step);
                }
            } else if let Some((src, dst)) = split_pair(self.chunks, si, di) {
                if let (Some(d), Some(s)) =
                    (dst.get_mut(d_off - step..d_off), src.get(so - step..so))
                {
                    d.copy_from_slice(s);
                }
            }
            left -= step;
        }
    }

    /// Copies `[from, from + n)` to `[to, to + n)`, `to < from`, from the front.
    fn move_left(&mut self, from: usize, to: usize, n: usize) {
        let mut done = 0;
        while done < n {
            let (si, so) = self.before(from + done + 1);
            let (di, d_off) = self.before(to + done + 1);
            let (so, d_off) = (so - 1, d_off - 1);
            let src_room = self.chunks.get(si).map_or(0, |c| c.len()) - so;
            let dst_room = self.chunks.get(di).map_or(0, |c| c.len()) - d_off;
            let step = src_room.min(dst_room).min(n - done).max(1);
            if si == di {
                if let Some(c) = self.chunks.get_mut(si) {
                    c.copy_within(so..so + step, d_off);
                }
            } else if let Some((dst, src)) = split_pair(self.chunks, di, si) {
                if let (Some(d), Some(s)) =
                    (dst.get_mut(d_off..d_off + step), src.get(so..so + step))
                {
                    d.copy_from_slice(s);
                }
            }
            done += step;
        }
    }

    /// Writes `bytes` at `at`.
    fn write(&mut self, at: usize, bytes: &[u8]) {
        let mut done = 0;
        while done < bytes.len() {
            let (i, off) = self.before(at + done + 1);
            let off = off - 1;
            let Some(c) = self.chunks.get_mut(i) else {
                return;
            };
            let step = (c.len() - off).min(bytes.len() - done);
            if let (Some(d), Some(s)) = (c.get_mut(off..off + step), bytes.get(done..done + step)) {
                d.copy_from_slice(s);
            }
            done += step;
        }
    }

    /// The bytes at `[from, to)`.
    fn read(&self, from: usize, to: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(to - from);
        for piece in self.pieces(from, to) {
            out.extend_from_slice(piece);
        }
        out
    }

    /// The bytes at `[from, to)`, as the parts of the slices they lie in, in order.
    pub(crate) fn pieces(&self, from: usize, to: usize) -> impl Iterator<Item = &[u8]> {
        let first = self
            .starts
            .partition_point(|&s| s <= from)
            .saturating_sub(1);
        self.chunks
            .iter()
            .zip(&self.starts)
            .skip(first)
            .take_while(move |(_, &s)| s < to)
            .filter_map(move |(c, &s)| {
                let (a, b) = (from.max(s), to.min(s + c.len()));
                (a < b).then(|| c.get(a - s..b - s)).flatten()
            })
    }

    /// The run's length.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// Slices `a` and `b` (`a < b`) of `chunks`, both writable.
fn split_pair<'a>(
    chunks: &'a mut [&mut [u8]],
    a: usize,
    b: usize,
) -> Option<(&'a mut [u8], &'a mut [u8])> {
    let (low, high) = chunks.split_at_mut(b);
    Some((&mut **low.get_mut(a)?, &mut **high.first_mut()?))
}

/// How a rewrite was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// In place: the body is now `len` bytes.
    InPlace { len: usize },
    /// It does not fit in place (or the body is not what the edit was made on): untouched.
    NotInPlace,
    /// Envoy refused a call: the body is as it came.
    Failed,
}

/// Writes `edit` over `body` in place (see the module's text).
pub fn in_place(envoy: &mut dyn Envoy, body: Body, edit: &Edit) -> Written {
    let (keep, end, tail) = (edit.keep, edit.end, edit.tail.as_slice());
    let Some(by) = end
        .checked_sub(keep)
        .and_then(|n| n.checked_sub(tail.len()))
    else {
        return Written::NotInPlace;
    };
    // What the writes cover, to put back if the drain is refused.
    let mut saved = None;
    let mut len = 0;
    let seen = envoy.body_chunks(body, &mut |chunks| {
        let mut run = Chunks::new(chunks);
        len = run.len;
        if end > run.len {
            return;
        }
        saved = Some(run.read(keep, end));
        // A value replaced by one as long (a 5-digit cap by a 5-digit one: most rewrites)
        // moves nothing.
        if by > 0 {
            run.move_right(0, by, keep);
        }
        run.write(keep + by, tail);
    });
    let Some(saved) = saved else {
        return if seen {
            Written::NotInPlace
        } else {
            Written::Failed
        };
    };
    if by == 0 || envoy.drain_body(body, by) {
        return Written::InPlace { len: len - by };
    }
    // Put the body back as it came.
    envoy.body_chunks(body, &mut |chunks| {
        let mut run = Chunks::new(chunks);
        run.move_left(by, 0, keep);
        run.write(keep, &saved);
    });
    Written::Failed
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The body cut at `cuts` (offsets, any order, repeats make empty slices).
    fn chunked(body: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        cuts.sort_unstable();
        let mut out = Vec::new();
        let mut at = 0;
        for c in cuts.into_iter().chain([body.len()]) {
            out.push(body[at..c].to_vec());
            at = c;
        }
        out
    }

    fn run<T>(chunks: &mut [Vec<u8>], f: impl FnOnce(&mut Chunks) -> T) -> T {
        let mut slices: Vec<&mut [u8]> = chunks.iter_mut().map(|c| c.as_mut_slice()).collect();
        f(&mut Chunks::new(&mut slices))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        /// Moving right then draining, or moving left, over any cut of the body: the same bytes
        /// as one contiguous copy.
        #[test]
        fn moves_agree_with_one_slice(
            body in prop::collection::vec(any::<u8>(), 1..200),
            cuts in prop::collection::vec(any::<usize>(), 0..8),
            a in any::<usize>(), b in any::<usize>(), n in any::<usize>(),
        ) {
            let len = body.len();
            let (from, to) = (a % len, b % len);
            let n = n % (len - from.max(to) + 1);
            let mut chunks = chunked(&body, &cuts);
            let mut want = body.clone();
            want.copy_within(from..from + n, to);
            run(&mut chunks, |c| match from.cmp(&to) {
                std::cmp::Ordering::Less => c.move_right(from, to, n),
                std::cmp::Ordering::Greater => c.move_left(from, to, n),
                std::cmp::Ordering::Equal => {}
            });
            prop_assert_eq!(chunks.concat(), want);
        }

        #[test]
        fn pieces_are_the_bytes_of_their_range(
            body in prop::collection::vec(any::<u8>(), 1..200),
            cuts in prop::collection::vec(any::<usize>(), 0..8),
            a in any::<usize>(), b in any::<usize>(),
        ) {
            let len = body.len() + 1;
            let (a, b) = (a % len, b % len);
            let (from, to) = (a.min(b), a.max(b));
            let mut chunks = chunked(&body, &cuts);
            let got: Vec<u8> =
                run(&mut chunks, |c| c.pieces(from, to).flatten().copied().collect());
            prop_assert_eq!(got, &body[from..to]);
        }

        #[test]
        fn writes_and_reads_agree_with_one_slice(
            body in prop::collection::vec(any::<u8>(), 1..200),
            cuts in prop::collection::vec(any::<usize>(), 0..8),
            at in any::<usize>(), bytes in prop::collection::vec(any::<u8>(), 0..50),
        ) {
            let at = at % body.len();
            let bytes = &bytes[..bytes.len().min(body.len() - at)];
            let mut chunks = chunked(&body, &cuts);
            let mut want = body.clone();
            want[at..at + bytes.len()].copy_from_slice(bytes);
            let read = run(&mut chunks, |c| {
                let before = c.read(at, at + bytes.len());
                c.write(at, bytes);
                before
            });
            prop_assert_eq!(read, &body[at..at + bytes.len()]);
            prop_assert_eq!(chunks.concat(), want);
        }
    }
}
