//! Stop strings in streamed text: text is released as soon as it can no longer be the start of a
//! stop string, and cut before the first stop string it contains.

/// Finds stop strings across pieces of streamed text.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text not yet released: the longest suffix of what came in that begins a stop string.
    held: String,
}

/// What [`StopMatcher::push`] releases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// Text that is final.
    pub text: String,
    /// Whether a stop string was found (the text ends just before it; nothing more comes).
    pub stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are dropped).
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Adds a piece of text; returns what is now final.
    pub fn push(&mut self, piece: &str) -> Released {
        self.held.push_str(piece);
        let first = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min();
        if let Some(at) = first {
            let mut text = std::mem::take(&mut self.held);
            text.truncate(at);
            return Released { text, stopped: true };
        }
        // The longest suffix that is a proper prefix of a stop string stays held; anything
        // before it cannot be part of a stop string (one starting earlier would have been
        // found whole, or would make a longer held suffix).
        let len = self.held.len();
        let keep = (1..len.min(self.longest()) + 1)
            .rev()
            .find(|&k| {
                self.held.is_char_boundary(len - k)
                    && self
                        .stops
                        .iter()
                        .any(|s| s.len() > k && s.as_bytes().starts_with(&self.held.as_bytes()[len - k..]))
            })
            .unwrap_or(0);
        let text = self.held[..len - keep].to_string();
        self.held.drain(..len - keep);
        Released { text, stopped: false }
    }

    /// Releases what is held (generation ended without a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    fn longest(&self) -> usize {
        self.stops.iter().map(String::len).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool, String) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = Vec::new();
        for p in pieces {
            let r = m.push(p);
            out.push(r.text);
            if r.stopped {
                return (out, true, String::new());
            }
        }
        (out, false, m.finish())
    }

    #[test]
    fn text_without_stops_passes_through() {
        assert_eq!(
            run(&[], &["a", "b"]),
            (vec!["a".into(), "b".into()], false, String::new())
        );
    }

    #[test]
    fn a_stop_string_across_pieces_cuts_the_text_before_it() {
        let (out, stopped, _) = run(&["END"], &["abc E", "N", "D tail"]);
        assert!(stopped);
        assert_eq!(out.concat(), "abc ");
        // "E" was held back until it could not be anything but the stop string.
        assert_eq!(out[0], "abc ");
    }

    #[test]
    fn a_false_start_is_released() {
        let (out, stopped, rest) = run(&["END"], &["xE", "Ny", "z"]);
        assert!(!stopped);
        assert_eq!(out, vec!["x".to_string(), "ENy".into(), "z".into()]);
        assert_eq!(rest, "");
    }

    #[test]
    fn held_text_comes_out_at_the_end() {
        let (out, stopped, rest) = run(&["\n\n"], &["a\n"]);
        assert!(!stopped);
        assert_eq!((out.concat(), rest), ("a".to_string(), "\n".to_string()));
    }

    #[test]
    fn the_earliest_of_several_stops_wins_and_multibyte_text_is_never_split() {
        let (out, stopped, _) = run(&["é!", "b"], &["aé", "é!b"]);
        assert!(stopped);
        assert_eq!(out.concat(), "aé");
        let (out, _, rest) = run(&["éx"], &["aé"]);
        assert_eq!((out.concat(), rest), ("a".to_string(), "é".to_string()));
    }
}
