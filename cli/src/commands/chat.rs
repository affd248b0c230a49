//! `engine chat`: an interactive conversation with the model's chat template, keeping the KV
//! cache between turns (only the new part of the conversation is fed each turn).
//!
//! Every flag is checked before the first prompt. Where standard input and output are a
//! terminal, lines are read with rustyline (editing, and a history kept in
//! `$XDG_STATE_HOME/tandem/chat_history`, else `~/.local/state/tandem/chat_history`, where it can
//! be written); elsewhere one turn is read per line of standard input. Lines beginning with `/`
//! are commands ([`Command`]). Where standard input is a terminal, Ctrl-C during a reply stops
//! that reply (a SIGINT handler sets a flag the generation looks at between steps) and the text
//! so far stays in the conversation; at the prompt it clears the line, and a second Ctrl-C on the
//! empty line, or Ctrl-D, ends the session.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::bail;
use rustyline::error::ReadlineError;
use rustyline::{ConditionalEventHandler, DefaultEditor, EventContext, EventHandler, KeyEvent, RepeatCount};
use tandem_engine::tokenizer::chat::{ChatTemplate, Message, Role};

use super::generate::{self, Ask, Prefill, SamplingArgs, Watch};
use super::load::{load, read_images, ModelArgs};
use super::progress::Progress;
use super::speculate::DraftArgs;
use crate::Context;

/// Flags of `engine chat`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// A system prompt.
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per reply.
    #[arg(long, default_value_t = 512)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    draft: DraftArgs,
    /// Print each turn's prompt, as the chat template renders the conversation, on stderr
    /// (one line: `prompt: ` and the text as a JSON string).
    #[arg(long)]
    show_prompt: bool,
}

/// What `/help` prints.
const HELP: &str = "\
/help          this list
/image FILE    an image for the next turn (PNG, JPEG, WebP; a model with image input: --mmproj,
               or --max-images N for a Hugging Face multimodal directory)
/clear         forget the conversation (the system prompt stays)
/exit, /quit   leave (Ctrl-D on an empty line too)
Ctrl-C stops a reply (its text so far stays in the conversation); at the prompt it clears the
line, and a second Ctrl-C on the empty line leaves. A line beginning with // is sent with one /
less; one beginning with a space is not kept in the history.";

/// A line of the chat's own instead of a user turn: `/` and a word of letters.
#[derive(Debug, PartialEq, Eq)]
enum Command<'a> {
    Help,
    Clear,
    Exit,
    /// An image for the next turn: the rest of the line, a file.
    Image(&'a str),
    /// No such command: a one-line hint, nothing sent.
    Unknown(&'a str),
}

impl<'a> Command<'a> {
    /// The command `line` (trimmed) gives, if it is one: `/` and a word of ASCII letters, what
    /// follows the word ignored. `//...` is a user turn.
    fn parse(line: &'a str) -> Option<Command<'a>> {
        let rest = line.strip_prefix('/')?;
        let word = rest.split(char::is_whitespace).next().unwrap_or("");
        if word.is_empty() || !word.bytes().all(|b| b.is_ascii_alphabetic()) {
            return None;
        }
        Some(match word {
            "help" => Command::Help,
            "clear" => Command::Clear,
            "exit" | "quit" => Command::Exit,
            "image" => Command::Image(rest[word.len()..].trim()),
            _ => Command::Unknown(&line[..word.len() + 1]),
        })
    }
}

/// The user turn a line that is no command sends: `//...` loses one `/`.
fn turn_text(line: &str) -> &str {
    if line.starts_with("//") {
        &line[1..]
    } else {
        line
    }
}

/// What reading a line gave.
enum Read {
    Line(String),
    /// Ctrl-C at the prompt; whether the line was empty.
    Interrupted {
        empty: bool,
    },
    /// End of input (Ctrl-D).
    End,
}

/// Where lines come from.
enum Lines {
    /// A terminal: rustyline, with history.
    Editor {
        editor: Box<DefaultEditor>,
        /// The history file, where one can be named.
        history: Option<PathBuf>,
        /// Whether the line was empty at the last Ctrl-C.
        empty_at_interrupt: Arc<AtomicBool>,
    },
    /// Anything else: plain lines, after a `> ` on standard output.
    Plain {
        stdin: std::io::StdinLock<'static>,
        /// Standard input is a terminal (Ctrl-D then gets a newline).
        terminal: bool,
    },
}

/// Notes, at Ctrl-C, whether the line being edited is empty, and lets rustyline interrupt.
struct NoteEmpty(Arc<AtomicBool>);

impl ConditionalEventHandler for NoteEmpty {
    fn handle(
        &self,
        _: &rustyline::Event,
        _: RepeatCount,
        _: bool,
        ctx: &EventContext<'_>,
    ) -> Option<rustyline::Cmd> {
        self.0.store(ctx.line().is_empty(), Ordering::Relaxed);
        None
    }
}

/// The history file: `$XDG_STATE_HOME/tandem/chat_history`, else
/// `~/.local/state/tandem/chat_history`.
fn history_file() -> Option<PathBuf> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".local/state"))
        })?;
    Some(state.join("tandem").join("chat_history"))
}

impl Lines {
    /// rustyline where standard input and output are a terminal, plain lines elsewhere.
    fn new() -> anyhow::Result<Lines> {
        let terminal = std::io::stdin().is_terminal();
        if !(terminal && std::io::stdout().is_terminal()) {
            return Ok(Lines::Plain {
                stdin: std::io::stdin().lock(),
                terminal,
            });
        }
        let config = rustyline::Config::builder()
            .max_history_size(1000)?
            .history_ignore_dups(true)?
            .history_ignore_space(true)
            .auto_add_history(false)
            .build();
        let mut editor = DefaultEditor::with_config(config)?;
        let empty_at_interrupt = Arc::new(AtomicBool::new(true));
        editor.bind_sequence(
            KeyEvent::ctrl('C'),
            EventHandler::Conditional(Box::new(NoteEmpty(Arc::clone(&empty_at_interrupt)))),
        );
        let history = history_file();
        if let Some(path) = &history {
            // A first session has none; an unreadable one is left alone.
            let _ = editor.load_history(path);
        }
        Ok(Lines::Editor {
            editor: Box::new(editor),
            history,
            empty_at_interrupt,
        })
    }

    /// Whether lines come from rustyline (which reads Ctrl-C as a key, not a signal).
    fn edits(&self) -> bool {
        matches!(self, Lines::Editor { .. })
    }

    /// The next line, after the prompt `> `.
    fn read(&mut self) -> anyhow::Result<Read> {
        match self {
            Lines::Editor {
                editor,
                empty_at_interrupt,
                ..
            } => match editor.readline("> ") {
                Ok(line) => Ok(Read::Line(line)),
                // rustyline has ended the line either way.
                Err(ReadlineError::Interrupted) => Ok(Read::Interrupted {
                    empty: empty_at_interrupt.load(Ordering::Relaxed),
                }),
                Err(ReadlineError::Eof) => Ok(Read::End),
                Err(e) => Err(e.into()),
            },
            Lines::Plain { stdin, terminal } => {
                let mut stdout = std::io::stdout();
                write!(stdout, "> ")?;
                stdout.flush()?;
                let mut line = String::new();
                if stdin.read_line(&mut line)? == 0 {
                    if *terminal {
                        // Ctrl-D: the shell's prompt goes on a line of its own.
                        writeln!(stdout)?;
                    }
                    return Ok(Read::End);
                }
                Ok(Read::Line(line))
            }
        }
    }

    /// Keeps `line` in the history (and its file, where one can be written).
    fn remember(&mut self, line: &str) {
        if let Lines::Editor { editor, history, .. } = self {
            let _ = editor.add_history_entry(line);
            if let Some(path) = history {
                if let Some(dir) = path.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                // Never an error: the history is a convenience.
                let _ = editor.append_history(path);
            }
        }
    }
}

/// Ctrl-C while a reply is generated, where standard input is a terminal: SIGINT sets `stop`,
/// which the generation looks at between steps; a second one before the reply has stopped (a
/// step that takes long) ends the process. Where lines are not edited (Ctrl-C at the prompt is
/// then SIGINT too) SIGINT ends the process outside replies, as without the handler.
struct Interrupts {
    stop: Arc<AtomicBool>,
    /// SIGINT ends the process (its default action) while this is set.
    idle: Option<Arc<AtomicBool>>,
}

impl Interrupts {
    fn install(edits: bool) -> anyhow::Result<Interrupts> {
        use signal_hook::consts::SIGINT;
        let idle = if edits {
            None
        } else {
            let idle = Arc::new(AtomicBool::new(true));
            // Registered first: it runs first.
            signal_hook::flag::register_conditional_default(SIGINT, Arc::clone(&idle))?;
            Some(idle)
        };
        let stop = Arc::new(AtomicBool::new(false));
        // Before `stop` is set: only a second SIGINT finds it set.
        signal_hook::flag::register_conditional_shutdown(SIGINT, 130, Arc::clone(&stop))?;
        signal_hook::flag::register(SIGINT, Arc::clone(&stop))?;
        Ok(Interrupts { stop, idle })
    }

    /// A reply begins: Ctrl-C stops it from now on.
    fn arm(&self) -> &AtomicBool {
        self.stop.store(false, Ordering::Relaxed);
        if let Some(i) = &self.idle {
            i.store(false, Ordering::Relaxed);
        }
        &self.stop
    }

    /// The reply is over.
    fn disarm(&self) {
        self.stop.store(false, Ordering::Relaxed);
        if let Some(i) = &self.idle {
            i.store(true, Ordering::Relaxed);
        }
    }
}

/// Runs the command: one user turn per line, until end of input, `/exit` or `/quit`.
pub fn run(ctx: &Context, args: &Args) -> anyhow::Result<()> {
    // Every flag is checked before the first prompt, those that need no model before it loads.
    args.sampling.check()?;
    args.draft.check()?;
    let mut loaded = load(ctx, &args.model, 1)?;
    let mut drafter = args.draft.build(ctx, &args.model)?;
    let mut spec = match drafter.as_mut() {
        Some(d) => Some(args.draft.speculator(d, &loaded)?),
        None => None,
    };
    let tk = &loaded.tokenizer;
    if !tk.has_vocabulary() {
        bail!("chat needs the model's tokenizer, and this model has none (no tokenizer.json)");
    }
    let template = ChatTemplate::new(tk.chat_template(), tk.bos_token(), tk.eos_token())?;
    // Said once, on stderr, naming the key that decided it: the replies of a base checkpoint
    // read as if chat were broken.
    if let Some(advice) = loaded.tuning.advice() {
        eprintln!("note: {advice}");
    }
    let context = loaded.session.context();
    if args.max_tokens == 0 {
        bail!("--max-tokens must be between 1 and the context ({context}), got 0");
    }
    // The model's default sampling, with the flags given over it.
    let sampling = args.sampling.config(loaded.sampling)?;
    let mut messages = Vec::new();
    if let Some(s) = &args.system {
        messages.push(Message::new(Role::System, s.clone()));
        // With an empty user turn, it must leave room for a reply.
        let mut alone = messages.clone();
        alone.push(Message::new(Role::User, String::new()));
        let n = loaded
            .tokenizer
            .encode(&template.render(&alone, true)?, false)?
            .len();
        if n >= context {
            bail!(
                "--system takes {n} tokens with the chat template, and the context holds {context} \
                 (prompt and reply together; --context sets it)"
            );
        }
    }
    // The messages every conversation starts with (after /clear too).
    let first_turn = messages.len();
    // Room kept for a reply when old turns must go.
    let reply_room = args.max_tokens.clamp(1, context / 4 + 1);
    let mut dropped_note = false;
    let mut lines = Lines::new()?;
    let interrupts = if std::io::stdin().is_terminal() {
        Some(Interrupts::install(lines.edits())?)
    } else {
        None
    };
    // Token ids currently in the cache (slot 0).
    let mut cached: Vec<u32> = Vec::new();
    // The image table places of each message's images (their `<start_of_image>` markers lead
    // its text), and those given for the next turn.
    let mut turn_images: Vec<Vec<usize>> = vec![Vec::new(); messages.len()];
    let mut pending: Vec<usize> = Vec::new();
    let mut stdout = std::io::stdout();
    // Whether the last read ended in Ctrl-C.
    let mut interrupted = false;
    loop {
        let line = match lines.read()? {
            Read::End => break,
            Read::Interrupted { empty } => {
                if empty && interrupted {
                    break;
                }
                if empty {
                    eprintln!("(Ctrl-C again or Ctrl-D leaves; /help lists the commands)");
                }
                interrupted = true;
                continue;
            }
            Read::Line(line) => line,
        };
        interrupted = false;
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        // (A line beginning with a space is not kept.)
        lines.remember(line.trim_end());
        match Command::parse(text) {
            Some(Command::Exit) => break,
            Some(Command::Help) => {
                writeln!(stdout, "{HELP}")?;
                continue;
            }
            Some(Command::Image(path)) => {
                let Some(images) = loaded.images.as_mut() else {
                    eprintln!(
                        "this chat takes no images: start it with --mmproj FILE, or --max-images N \
                         for a Hugging Face multimodal directory"
                    );
                    continue;
                };
                if path.is_empty() {
                    eprintln!("/image needs a file: /image photo.png");
                    continue;
                }
                let input = match read_images(&[PathBuf::from(path)]) {
                    Ok(i) => i,
                    Err(e) => {
                        eprintln!("{e:#}");
                        continue;
                    }
                };
                match images.place(&mut loaded.session, &input, pending.len() + 1) {
                    Ok(p) => {
                        pending.extend(p);
                        eprintln!("({} image(s) for the next turn)", pending.len());
                    }
                    Err(e) => eprintln!("{e}"),
                }
                continue;
            }
            Some(Command::Clear) => {
                if let Some(images) = loaded.images.as_mut() {
                    images.release(&pending);
                    images.release(&turn_images.concat());
                }
                pending.clear();
                turn_images.truncate(first_turn);
                messages.truncate(first_turn);
                cached.clear();
                loaded.session.reset(0);
                dropped_note = false;
                eprintln!("(the conversation is cleared)");
                continue;
            }
            Some(Command::Unknown(word)) => {
                eprintln!("{word}: no such command (/help lists them)");
                continue;
            }
            None => {}
        }
        // The turn's images lead its text, one marker each.
        let marker = loaded.images.as_ref().map_or("", |i| i.marker());
        let user = Message::new(Role::User, marker.repeat(pending.len()) + turn_text(text));
        // A turn that does not fit the context even alone is refused, and the conversation goes
        // on without it.
        let mut alone = messages[..first_turn].to_vec();
        alone.push(user.clone());
        let n = match encode(&loaded, &template.render(&alone, true)?, &pending) {
            Ok(ids) => ids.len(),
            Err(e) => {
                eprintln!("not sent: {e:#}");
                continue;
            }
        };
        if n >= context {
            eprintln!(
                "not sent: the turn takes {n} tokens with the chat template, and the context holds \
                 {context} (prompt and reply together; --context sets it)"
            );
            continue;
        }
        messages.push(user);
        turn_images.push(std::mem::take(&mut pending));
        let mut rendered = template.render(&messages, true)?;
        let mut ids = encode(&loaded, &rendered, &turn_images.concat())?;
        // A conversation that outgrows the context loses its oldest turns (the system prompt
        // stays), with one note, instead of ending.
        while ids.len() + reply_room > context && messages.len() >= first_turn + 3 {
            // A user turn and its reply: the roles still alternate.
            messages.drain(first_turn..first_turn + 2);
            let gone: Vec<Vec<usize>> = turn_images.drain(first_turn..first_turn + 2).collect();
            if let Some(images) = loaded.images.as_mut() {
                images.release(&gone.concat());
            }
            rendered = template.render(&messages, true)?;
            ids = encode(&loaded, &rendered, &turn_images.concat())?;
            if !dropped_note {
                eprintln!(
                    "note: the conversation outgrew the context ({context} tokens, --context sets \
                     it): its oldest turns are dropped"
                );
                dropped_note = true;
            }
        }
        if args.show_prompt {
            eprintln!("prompt: {}", serde_json::Value::from(rendered.as_str()));
        }
        let common = cached.iter().zip(&ids).take_while(|(a, b)| a == b).count();
        let keep = common > 0 && common < ids.len() && loaded.session.truncate(0, common);
        let feed = if keep { &ids[common..] } else { &ids[..] };
        let ask = Ask {
            prompt: feed.to_vec(),
            max_tokens: args.max_tokens,
            sampling,
            stop: &args.sampling.stop,
            keep,
            before: &ids[..common],
        };
        // A long turn's feeding shows on a terminal's stderr, cleared before the reply.
        let mut progress = Progress::for_prompt();
        let mut prefill = |p: Prefill| progress.prefill(p.done as u64, p.total as u64, p.next as u64);
        let watch = Watch {
            stop: interrupts.as_ref().map(Interrupts::arm),
            prefill: Some(&mut prefill),
        };
        let g = generate::run(&mut loaded, ask, Some(&mut stdout), watch, spec.as_mut());
        if let Some(i) = &interrupts {
            i.disarm();
        }
        let g = g?;
        if g.stopped && g.ids.is_empty() {
            // Stopped before the reply began: the turn is forgotten, and so is what the cache
            // holds of it (its images go back to the next turn).
            messages.pop();
            pending = turn_images.pop().unwrap_or_default();
            cached.clear();
            continue;
        }
        // The cache now holds the fed tokens and the reply except its last token (a stop
        // token, or one sampled but not fed).
        let reply = &g.ids;
        cached = if keep { ids[..common].to_vec() } else { Vec::new() };
        cached.extend_from_slice(feed);
        cached.extend_from_slice(&reply[..reply.len().saturating_sub(1)]);
        // The reply as it was shown: cut before a stop string, or where Ctrl-C stopped it.
        messages.push(Message::new(Role::Assistant, g.text));
        turn_images.push(Vec::new());
    }
    Ok(())
}

/// The conversation's text as token ids, with its images (the table places of its markers, in
/// order) where there are any.
fn encode(loaded: &tandem_engine::Loaded, text: &str, places: &[usize]) -> anyhow::Result<Vec<u32>> {
    Ok(match &loaded.images {
        Some(images) if !places.is_empty() => {
            images.tokenize(&loaded.tokenizer, text, places, false, loaded.session.vocab())?
        }
        _ => loaded.tokenizer.encode(text, false)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_a_slash_and_a_word_and_double_slashes_are_turns() {
        assert_eq!(Command::parse("/help"), Some(Command::Help));
        assert_eq!(Command::parse("/clear"), Some(Command::Clear));
        assert_eq!(Command::parse("/exit"), Some(Command::Exit));
        assert_eq!(Command::parse("/quit now"), Some(Command::Exit));
        assert_eq!(Command::parse("/hlep me"), Some(Command::Unknown("/hlep")));
        for turn in ["hello", "//help", "/ help", "/usr/bin?", "/3", "/"] {
            assert_eq!(Command::parse(turn), None, "{turn}");
        }
        assert_eq!(turn_text("//help"), "/help");
        assert_eq!(turn_text("/usr/bin?"), "/usr/bin?");
        assert_eq!(turn_text("hello"), "hello");
    }
}
