//! Progress where the wait is long, on stderr and only when stderr is a terminal: a model load's
//! bytes as a bar naming the model (indicatif, as `bench` and `synth` draw theirs), and the
//! engine's progress steps (`Notice::Progress`: each placement `auto` measures) a line each.
//! Notes and warnings go to stderr whatever it is; where stderr is a file or a pipe nothing else
//! is printed.
//!
//! Throttling is the bar's: indicatif redraws at most 20 times a second however often a load
//! reports (once per tensor, thousands for a large model), and the bar appears only once a load
//! has taken [`BAR_AFTER`], so a small model that loads in a blink draws nothing.

use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

use tandem_engine::Notice;

/// How long a load runs before its bar appears.
pub const BAR_AFTER: Duration = Duration::from_millis(300);

/// The line `notice` gets on stderr, when stderr is (`terminal`) or is not a terminal: notes and
/// warnings always, progress steps on a terminal only.
pub fn line(notice: &Notice, terminal: bool) -> Option<String> {
    match notice {
        Notice::Progress(_) if !terminal => None,
        n => Some(n.to_string()),
    }
}

/// What a load's bar says it loads: the model's file or directory name, or the default model.
pub fn load_label(model: Option<&Path>) -> String {
    let name = model.and_then(|m| m.file_name()).map_or_else(
        || "the default model".to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    format!("loading {name}")
}

/// Whether a load that started at `start` and has `done` of `total` bytes at `now` shows its
/// bar: once it has run [`BAR_AFTER`] and is not finished.
pub fn bar_due(start: Instant, now: Instant, done: u64, total: u64) -> bool {
    done < total && now.saturating_duration_since(start) >= BAR_AFTER
}

/// Progress on stderr for one command: its notices, and a load's bar.
pub struct Progress {
    terminal: bool,
    label: String,
    start: Instant,
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    /// Progress for a load labelled `label` ([`load_label`]), drawn where stderr is a terminal.
    pub fn new(label: String) -> Progress {
        Progress {
            terminal: std::io::stderr().is_terminal(),
            label,
            start: Instant::now(),
            bar: None,
        }
    }

    /// Prints `notice` (progress steps on a terminal only), above the bar where one is drawn.
    pub fn notice(&mut self, notice: Notice) {
        if let Some(text) = line(&notice, self.terminal) {
            match &self.bar {
                Some(bar) => bar.suspend(|| eprintln!("{text}")),
                None => eprintln!("{text}"),
            }
        }
    }

    /// `done` of `total` bytes loaded.
    pub fn bytes(&mut self, done: u64, total: u64) {
        if !self.terminal {
            return;
        }
        if self.bar.is_none() && !bar_due(self.start, Instant::now(), done, total) {
            return;
        }
        let label = &self.label;
        let bar = self.bar.get_or_insert_with(|| {
            let bar = indicatif::ProgressBar::new(total);
            let template = format!(
                "{} {{bar:40}} {{bytes}}/{{total_bytes}} {{elapsed}}",
                label.replace('{', "{{").replace('}', "}}")
            );
            bar.set_style(
                indicatif::ProgressStyle::with_template(&template)
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        });
        bar.set_length(total);
        bar.set_position(done);
    }

    /// Clears the bar.
    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_steps_reach_a_terminal_only_and_notes_always() {
        let step = Notice::Progress("auto: measuring vulkan (1 of 3: ...)".into());
        let note = Notice::Note("using the cpu backend".into());
        assert_eq!(line(&step, false), None);
        assert_eq!(
            line(&step, true).as_deref(),
            Some("auto: measuring vulkan (1 of 3: ...)")
        );
        assert_eq!(line(&note, false).as_deref(), Some("note: using the cpu backend"));
        assert_eq!(line(&note, true).as_deref(), Some("note: using the cpu backend"));
    }

    #[test]
    fn the_bar_names_the_model_and_waits_for_a_long_load() {
        assert_eq!(
            load_label(Some(Path::new("/m/gemma-3-4b.gguf"))),
            "loading gemma-3-4b.gguf"
        );
        assert_eq!(
            load_label(Some(Path::new("models/gemma-3-1b/"))),
            "loading gemma-3-1b"
        );
        assert_eq!(load_label(None), "loading the default model");
        let t0 = Instant::now();
        let later = t0 + BAR_AFTER;
        assert!(!bar_due(t0, t0, 10, 100), "a load just begun");
        assert!(!bar_due(t0, t0 + BAR_AFTER / 2, 10, 100));
        assert!(bar_due(t0, later, 10, 100));
        assert!(!bar_due(t0, later, 100, 100), "a finished load");
    }
}
