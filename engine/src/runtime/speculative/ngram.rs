//! Drafts by lookup in the text so far (no model): the tokens that followed the latest earlier
//! occurrence of the sequence's last `n` tokens, for `n` from [`NgramDrafter::max_n`] down to
//! [`NgramDrafter::min_n`]. It pays where the output copies its input (editing, code,
//! summarising, a passage continued or rewritten) and proposes nothing elsewhere.

use super::{Draft, Drafter};
use crate::runtime::session::SessionError;

/// The n-gram drafter.
#[derive(Debug, Clone)]
pub struct NgramDrafter {
    /// The longest n-gram looked up first.
    pub max_n: usize,
    /// The shortest one tried.
    pub min_n: usize,
}

impl Default for NgramDrafter {
    /// 4-grams down to 2-grams: a single token repeats too often to predict what follows it.
    fn default() -> Self {
        NgramDrafter { max_n: 4, min_n: 2 }
    }
}

impl NgramDrafter {
    /// The continuation after the latest earlier occurrence of `history`'s last `n` tokens, at
    /// most `k` tokens; empty where there is none.
    fn lookup(history: &[u32], n: usize, k: usize, out: &mut Vec<u32>) {
        let len = history.len();
        if n == 0 || len <= n {
            return;
        }
        let tail = &history[len - n..];
        // The match starting at `start` ends before the tail does; the latest one first.
        for start in (0..len - n).rev() {
            if &history[start..start + n] == tail {
                let from = start + n;
                out.extend(history[from..].iter().take(k));
                return;
            }
        }
    }
}

impl Drafter for NgramDrafter {
    fn propose(&mut self, history: &[u32], k: usize, out: &mut Draft) -> Result<(), SessionError> {
        out.clear();
        for n in (self.min_n..=self.max_n).rev() {
            Self::lookup(history, n, k, &mut out.tokens);
            if !out.tokens.is_empty() {
                break;
            }
        }
        Ok(())
    }

    fn name(&self) -> String {
        format!("ngram ({}..{}-grams)", self.min_n, self.max_n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn propose(history: &[u32], k: usize) -> Vec<u32> {
        let mut d = Draft::default();
        NgramDrafter::default().propose(history, k, &mut d).unwrap();
        assert!(d.dists.is_empty(), "lookup drafts are deterministic");
        d.tokens
    }

    #[test]
    fn the_latest_occurrence_of_the_longest_n_gram_wins() {
        // "1 2 3" occurs at 0 (then 4 5) and at 5 (then 9 9); the tail is "1 2 3".
        let h = [1, 2, 3, 4, 5, 1, 2, 3, 9, 9, 7, 1, 2, 3];
        assert_eq!(propose(&h, 4), [9, 9, 7, 1]);
        assert_eq!(propose(&h, 1), [9]);
    }

    #[test]
    fn shorter_n_grams_are_tried_when_longer_ones_do_not_occur() {
        // The 4- and 3-gram ending "8 2 3" do not occur earlier; "2 3" does (then 4).
        let h = [1, 2, 3, 4, 8, 2, 3];
        assert_eq!(propose(&h, 3), [4, 8, 2]);
    }

    #[test]
    fn nothing_is_proposed_without_a_match() {
        assert!(propose(&[1, 2, 3, 4, 5], 4).is_empty());
        assert!(propose(&[7], 4).is_empty());
        assert!(propose(&[], 4).is_empty());
    }

    #[test]
    fn a_continuation_stops_at_the_end_of_the_text() {
        // "5 6" occurs at 0, followed by 5 6: two tokens, whatever k.
        assert_eq!(propose(&[5, 6, 5, 6], 8), [5, 6]);
    }
}
