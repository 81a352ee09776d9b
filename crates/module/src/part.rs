//! A request body read from Envoy's slices in part (`incontext_core::flow::partial`): all but
//! the interiors of the long values where the last body of its length had them, each of those
//! values hashed over the slices, never copied.
//!
//! Each thread reads into the buffer the last body read in part came back in, once its
//! rewrite was written: a body of the same length is read without allocating or writing the
//! holes again. Their bytes are then what the last body had there; the core decides only when
//! nothing it does reads them (its tests fill them with anything), and the rewrite written is
//! made of Envoy's own bytes.

use crate::envoy::{Body, Envoy};
use crate::splice::Chunks;
use incontext_core::digest::digest_parts;
use incontext_core::flow::partial::{hole, Known, Partial};
use std::cell::RefCell;
use std::ops::Range;

/// The largest buffer a thread keeps for the next body read in part.
const KEEP: usize = 2 << 20;

thread_local! {
    static SPARE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A buffer of `len` bytes: the thread's spare one when it has it.
fn buffer(len: usize) -> Vec<u8> {
    let mut buffer = SPARE
        .try_with(|s| s.try_borrow_mut().map(|mut s| std::mem::take(&mut *s)))
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    buffer.resize(len, 0);
    buffer
}

/// Keeps `buffer` for the thread's next body read in part (when it is not over [`KEEP`]).
pub fn give_back(buffer: Vec<u8>) {
    if buffer.capacity() > KEEP {
        return;
    }
    let _ = SPARE.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            *s = buffer;
        }
    });
}

/// The request body Envoy holds, read but for the holes of `spans`; `None` when Envoy
/// refused, or when the spans do not fit in it (the body is then read whole).
pub fn read(envoy: &mut dyn Envoy, spans: &[Range<usize>]) -> Option<Partial> {
    let mut holes: Vec<Range<usize>> = spans.iter().map(hole).collect();
    holes.sort_by_key(|h| h.start);
    let disjoint = holes.windows(2).all(|w| match w {
        [a, b] => a.end <= b.start,
        _ => true,
    });
    if !disjoint {
        return None;
    }
    let mut read = None;
    envoy.body_chunks(Body::Request, &mut |chunks| {
        let run = Chunks::new(chunks);
        let len = run.len();
        if spans.iter().any(|s| s.start > s.end || s.end > len) {
            return;
        }
        let mut body = buffer(len);
        let mut at = 0;
        for h in holes.iter().chain([&(len..len)]) {
            if !copy(&run, at..h.start, &mut body) {
                give_back(body);
                return;
            }
            at = h.end;
        }
        let values = spans
            .iter()
            .map(|span| Known {
                span: span.clone(),
                digest: digest_parts(run.pieces(span.start, span.end)),
            })
            .collect();
        read = Some(Partial { body, values });
    });
    read
}

/// Copies the run's bytes at `range` to the same place in `out`.
fn copy(run: &Chunks, range: Range<usize>, out: &mut [u8]) -> bool {
    let mut at = range.start;
    for piece in run.pieces(range.start, range.end) {
        let Some(to) = out.get_mut(at..at + piece.len()) else {
            return false;
        };
        to.copy_from_slice(piece);
        at += piece.len();
    }
    at >= range.end
}
