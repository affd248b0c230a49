//! Step shapes rounded up to a few buckets. Every distinct pair of row count and selected-row
//! count a step has is a step shape, with programs of its own, and on a GPU the first step of a
//! shape builds them: kernels specialised for its row count, its activations. A server's steps
//! (decode rows of any number of slots, plus a prompt chunk of any length) would meet hundreds
//! of shapes, each first met while clients wait. Padded to [`bucket`]s they meet a few dozen,
//! built before the server listens (`batcher::warm_up`) or once.
//!
//! A padding row feeds a token to a slot no request holds (the sink, reset before each step,
//! so its rows sit at positions `0..`), and a padding selected row repeats a row already there;
//! their results are never read. Rows are computed independently of one another (see
//! `batcher`'s note on batching), so padding changes no token.

use crate::runtime::session::Session;
use crate::runtime::stepper::Padding;

/// `n` rounded up to the row counts steps are padded to: every count to 4, then steps of 2 to
/// 8, 4 to 32, 8 to 64, 16 to 128, 32 to 256, 64 beyond. A padded step's padding rows are at
/// most a third of its real ones; 64 slots make 16 decode shapes, not 64.
pub fn bucket(n: usize) -> usize {
    let step = match n {
        0..=4 => 1,
        5..=8 => 2,
        9..=32 => 4,
        33..=64 => 8,
        65..=128 => 16,
        129..=256 => 32,
        _ => 64,
    };
    n.div_ceil(step) * step
}

/// Whether steps are padded to [`bucket`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StepBuckets {
    /// Where the logits are computed on a device (whose first step of a shape is slow), not
    /// on the CPU (where padding is only extra work).
    #[default]
    Auto,
    /// Always.
    On,
    /// Never: every step has exactly its rows. No slot is set aside.
    Off,
}

impl std::str::FromStr for StepBuckets {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(StepBuckets::Auto),
            "on" => Ok(StepBuckets::On),
            "off" => Ok(StepBuckets::Off),
            _ => Err(format!("must be auto, on or off, not '{s}'")),
        }
    }
}

/// Pads steps with rows of the sink slot.
#[derive(Debug, Clone, Copy)]
pub struct Padder {
    /// The slot padding rows feed: no request's.
    pub sink: u32,
    /// The most padding rows a step takes (every layer's cache holds them in a fresh slot).
    room: usize,
}

impl Padder {
    /// A padder feeding `sink`, a slot of `session` that no request will hold.
    pub fn new(session: &Session, sink: u32) -> Padder {
        Padder {
            sink,
            room: session.fresh_rows(),
        }
    }

    /// Pads a step of `tokens` (of `slots`), selecting `select`: rows of the sink up to
    /// [`bucket`]`(rows)` (where the sink has room for them), then selected rows up to
    /// `bucket(selected)`: the padding rows first, then repeats of the last selected row.
    /// Returns the padding rows added. The sink must be reset before the step runs.
    pub fn pad(&self, tokens: &mut Vec<u32>, slots: &mut Vec<u32>, select: &mut Vec<u32>) -> usize {
        let rows = tokens.len();
        let extra = bucket(rows) - rows;
        let extra = if extra <= self.room { extra } else { 0 };
        // Any id of the vocabulary does; the first is.
        tokens.resize(rows + extra, 0);
        slots.resize(rows + extra, self.sink);
        let want = bucket(select.len());
        let mut next = rows as u32;
        while select.len() < want {
            let r = if (next as usize) < rows + extra {
                next += 1;
                next - 1
            } else {
                match select.last() {
                    Some(&r) => r,
                    None => break,
                }
            };
            select.push(r);
        }
        extra
    }
}

impl Padding for Padder {
    fn sink(&self) -> u32 {
        self.sink
    }

    /// [`Padder::pad`].
    fn pad(&self, tokens: &mut Vec<u32>, slots: &mut Vec<u32>, select: &mut Vec<u32>) {
        Padder::pad(self, tokens, slots, select);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_round_up_by_at_most_a_third_and_are_few() {
        for n in 1..=2048 {
            let b = bucket(n);
            assert!(b >= n && b - n <= n.div_ceil(3), "{n} -> {b}");
            assert_eq!(bucket(b), b, "{b} is not a bucket of itself");
        }
        let decode: std::collections::BTreeSet<_> = (1..=64).map(bucket).collect();
        assert_eq!(
            decode.into_iter().collect::<Vec<_>>(),
            [1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64]
        );
        assert_eq!((bucket(65), bucket(130), bucket(513)), (80, 160, 576));
    }

    #[test]
    fn padding_feeds_the_sink_and_selects_padding_rows_then_repeats() {
        let p = Padder { sink: 9, room: 100 };
        // Five decode rows, all selected: three rows of the sink, selected too.
        let (mut t, mut s, mut sel) = (vec![5; 5], vec![0, 1, 2, 3, 4], vec![0, 1, 2, 3, 4]);
        assert_eq!(p.pad(&mut t, &mut s, &mut sel), 1);
        assert_eq!(
            (t, s, sel),
            (
                vec![5, 5, 5, 5, 5, 0],
                vec![0, 1, 2, 3, 4, 9],
                vec![0, 1, 2, 3, 4, 5]
            )
        );
        // Three decode rows and a 30-row chunk whose last row is selected: 33 rows -> 40, four
        // selected rows stay four.
        let (mut t, mut s) = (vec![1; 33], [vec![0, 1, 2], vec![3; 30]].concat());
        let mut sel = vec![0, 1, 2, 32];
        assert_eq!(p.pad(&mut t, &mut s, &mut sel), 7);
        assert_eq!((t.len(), &s[33..], sel.len()), (40, &[9; 7][..], 4));
        // 24 rows need no padding rows: the last of five selected rows is repeated to make 6.
        let mut sel = vec![0, 1, 2, 3, 23];
        let (mut t, mut s) = (vec![1; 24], vec![0; 24]);
        assert_eq!(p.pad(&mut t, &mut s, &mut sel), 0);
        assert_eq!(sel, [0, 1, 2, 3, 23, 23]);
        // No room in the sink: the rows stay, the selection is still padded.
        let p = Padder { sink: 9, room: 2 };
        let (mut t, mut s, mut sel) = (vec![1; 33], vec![0; 33], vec![32; 5]);
        assert_eq!(p.pad(&mut t, &mut s, &mut sel), 0);
        assert_eq!((t.len(), sel.len()), (33, 6));
    }
}
