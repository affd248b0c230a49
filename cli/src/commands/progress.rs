//! Progress where the wait is long, on stderr and only when stderr is a terminal: a model load's
//! bytes as a bar naming the model (indicatif, as `synth` draws its own), `bench`'s tokens, a
//! long prompt's feeding (`run`, `chat`), and the engine's latest progress step
//! (`Notice::Progress`: each placement `auto` measures), all on one line drawn in place and
//! cleared when the command is done with it, so none of it stays above what the command prints.
//! Notes and warnings go to stderr whatever it is; where stderr is a file or a pipe nothing else
//! is printed.
//!
//! Throttling is the bar's: indicatif redraws at most 20 times a second however often a load
//! reports (once per tensor, thousands for a large model), and the bar appears only once a load
//! has taken [`BAR_AFTER`], so a small model that loads in a blink draws nothing; a prompt's bar
//! likewise, and it is cleared before the step that ends the prompt, whose first token is printed
//! during that step.

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

/// What the one line of a [`Progress`] shows.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Shown {
    /// An engine progress step (`Notice::Progress`), until the next step, bar or the end.
    Step,
    /// A load's bytes.
    Load,
    /// `bench`'s generated tokens.
    Tokens,
    /// A prompt's tokens fed.
    Prefill,
}

/// Progress on stderr for one command: its notices, and one transient line, a load's bar, a
/// benchmark's tokens or the engine's latest progress step. The line is the only thing drawn in
/// place: [`Progress::finish`] clears it, so nothing of it stays above what the command prints
/// next (`bench`'s table).
pub struct Progress {
    terminal: bool,
    label: String,
    start: Instant,
    /// Where the line is drawn: stderr, or a test's terminal.
    target: Box<dyn Fn() -> indicatif::ProgressDrawTarget>,
    bar: Option<(indicatif::ProgressBar, Shown)>,
    /// Tokens reported to [`Progress::tokens`] so far.
    tokens: u64,
}

impl Progress {
    /// Progress for a load labelled `label` ([`load_label`]), drawn where stderr is a terminal.
    pub fn new(label: String) -> Progress {
        Progress::drawn_on(
            label,
            std::io::stderr().is_terminal(),
            Box::new(indicatif::ProgressDrawTarget::stderr),
        )
    }

    /// Progress for a prompt's feeding ([`Progress::prefill`]), from now.
    pub fn for_prompt() -> Progress {
        Progress::new(String::new())
    }

    /// Progress drawn on `target`, which is (`terminal`) or is not a terminal.
    fn drawn_on(
        label: String,
        terminal: bool,
        target: Box<dyn Fn() -> indicatif::ProgressDrawTarget>,
    ) -> Progress {
        Progress {
            terminal,
            label,
            start: Instant::now(),
            target,
            bar: None,
            tokens: 0,
        }
    }

    /// The line, showing `shown` (styled for it, created where none is drawn).
    fn line(&mut self, shown: Shown) -> &indicatif::ProgressBar {
        let escaped = self.label.replace('{', "{{").replace('}', "}}");
        let template = match shown {
            Shown::Step => "{msg}".to_string(),
            Shown::Load => format!("{escaped} {{bar:40}} {{bytes}}/{{total_bytes}} {{elapsed}}"),
            Shown::Tokens => "bench {bar:40} {pos}/{len} tokens {elapsed}".to_string(),
            Shown::Prefill => "prompt {bar:40} {pos}/{len} tokens {elapsed}".to_string(),
        };
        let style = || {
            indicatif::ProgressStyle::with_template(&template)
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        };
        let target = &self.target;
        let (bar, was) = self.bar.get_or_insert_with(|| {
            let bar = indicatif::ProgressBar::with_draw_target(Some(0), target());
            bar.set_style(style());
            (bar, shown)
        });
        if *was != shown {
            bar.set_style(style());
            bar.reset_elapsed();
            *was = shown;
        }
        bar
    }

    /// Prints `notice`: notes and warnings as lines of their own (above the line where one is
    /// drawn), progress steps on a terminal only.
    pub fn notice(&mut self, notice: Notice) {
        if let (Notice::Progress(step), true) = (&notice, self.terminal) {
            self.line(Shown::Step).set_message(step.clone());
            return;
        }
        if let Some(text) = line(&notice, self.terminal) {
            match &self.bar {
                Some((bar, _)) => bar.suspend(|| eprintln!("{text}")),
                None => eprintln!("{text}"),
            }
        }
    }

    /// `done` of `total` bytes loaded.
    pub fn bytes(&mut self, done: u64, total: u64) {
        if !self.terminal {
            return;
        }
        let shown = self.bar.as_ref().map(|(_, s)| *s);
        if shown != Some(Shown::Load) && !bar_due(self.start, Instant::now(), done, total) {
            return;
        }
        let bar = self.line(Shown::Load);
        bar.set_length(total);
        bar.set_position(done);
    }

    /// `add` more of `total` tokens generated (`bench`).
    pub fn tokens(&mut self, add: u64, total: u64) {
        self.tokens += add;
        if !self.terminal {
            return;
        }
        let done = self.tokens;
        let bar = self.line(Shown::Tokens);
        bar.set_length(total);
        bar.set_position(done);
    }

    /// Before a step that feeds `next` more of a prompt's `total` tokens, `done` of them fed: the
    /// line shows them once the prompt has taken [`BAR_AFTER`] (a prompt fed in one step never
    /// draws), and is cleared before the step that ends the prompt.
    pub fn prefill(&mut self, done: u64, total: u64, next: u64) {
        if !self.terminal {
            return;
        }
        if done + next >= total {
            self.finish();
            return;
        }
        let shown = self.bar.as_ref().map(|(_, s)| *s);
        if shown != Some(Shown::Prefill) && !bar_due(self.start, Instant::now(), done, total) {
            return;
        }
        let bar = self.line(Shown::Prefill);
        bar.set_length(total);
        bar.set_position(done);
    }

    /// Clears the line.
    pub fn finish(&mut self) {
        if let Some((b, _)) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    /// Clears the line (indicatif would leave it).
    fn drop(&mut self) {
        self.finish();
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

    /// A terminal that keeps what is on its screen.
    #[derive(Debug, Default)]
    struct Screen {
        lines: Vec<String>,
        row: usize,
    }

    #[derive(Debug, Clone, Default)]
    struct Term(std::sync::Arc<std::sync::Mutex<Screen>>);

    impl Term {
        fn text(&self) -> String {
            self.0.lock().unwrap().lines.join("\n").trim().to_string()
        }
        fn with<T>(&self, f: impl FnOnce(&mut Screen) -> T) -> T {
            let mut s = self.0.lock().unwrap();
            let row = s.row;
            if s.lines.len() <= row {
                s.lines.resize(row + 1, String::new());
            }
            f(&mut s)
        }
    }

    impl indicatif::TermLike for Term {
        fn width(&self) -> u16 {
            100
        }
        fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
            self.with(|s| s.row = s.row.saturating_sub(n));
            Ok(())
        }
        fn move_cursor_down(&self, n: usize) -> std::io::Result<()> {
            self.with(|s| s.row += n);
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, line: &str) -> std::io::Result<()> {
            self.write_str(line)?;
            self.with(|s| s.row += 1);
            Ok(())
        }
        fn write_str(&self, text: &str) -> std::io::Result<()> {
            self.with(|s| {
                let row = s.row;
                s.lines[row].push_str(text)
            });
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            self.with(|s| {
                let row = s.row;
                s.lines[row].clear()
            });
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_line_shows_the_latest_step_and_the_tokens_and_is_cleared_at_the_end() {
        let term = Term::default();
        let t = term.clone();
        let mut p = Progress::drawn_on(
            "loading m.gguf".into(),
            true,
            Box::new(move || indicatif::ProgressDrawTarget::term_like(Box::new(t.clone()))),
        );
        p.notice(Notice::Progress("auto: measuring cpu (1 of 2)".into()));
        assert_eq!(term.text(), "auto: measuring cpu (1 of 2)");
        p.notice(Notice::Progress("auto: measuring vulkan (2 of 2)".into()));
        assert_eq!(term.text(), "auto: measuring vulkan (2 of 2)");
        p.tokens(3, 10);
        assert!(term.text().starts_with("bench ") && term.text().contains("3/10 tokens"));
        p.finish();
        assert_eq!(term.text(), "", "the line is cleared before the table prints");
    }

    #[test]
    fn a_long_prompt_shows_its_tokens_and_is_cleared_before_its_last_step() {
        let term = Term::default();
        let t = term.clone();
        let target = move || indicatif::ProgressDrawTarget::term_like(Box::new(t.clone()));
        let mut p = Progress::drawn_on(String::new(), true, Box::new(target.clone()));
        // Quick so far: nothing drawn.
        p.prefill(0, 2048, 512);
        p.prefill(512, 2048, 512);
        assert_eq!(term.text(), "");
        // Slow: drawn from the next step on.
        p.start -= BAR_AFTER;
        p.prefill(1024, 2048, 512);
        assert!(
            term.text().starts_with("prompt ") && term.text().contains("1024/2048 tokens"),
            "{}",
            term.text()
        );
        // The step that ends the prompt prints its first token: the line goes first.
        p.prefill(1536, 2048, 512);
        assert_eq!(term.text(), "");
        // A prompt of one step never draws, however slow the start; nor on a file or pipe.
        p.start -= BAR_AFTER;
        p.prefill(0, 300, 300);
        assert_eq!(term.text(), "");
        let mut piped = Progress::drawn_on(String::new(), false, Box::new(target));
        piped.start -= BAR_AFTER;
        piped.prefill(512, 2048, 512);
        assert_eq!(term.text(), "");
    }
}
