//! `engine chat`: an interactive conversation with the model's chat template, keeping the KV
//! cache between turns (only the new part of the conversation is fed each turn).

use std::io::{BufRead, Write};

use tandem_engine::tokenizer::chat::{ChatTemplate, Message, Role};
use tandem_engine::SamplerConfig;

use super::generate::{self, Ask};
use super::load::{load, ModelArgs};
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
    /// Sampling temperature; 0 is greedy. Default: the model's generation_config.json, else 1
    /// (top-k, top-p, min-p and repetition penalty are always the model's: generation_config.json,
    /// else top-k 64, top-p 0.95, the others off).
    #[arg(long)]
    temperature: Option<f32>,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print each turn's prompt, as the chat template renders the conversation, on stderr
    /// (one line: `prompt: ` and the text as a JSON string).
    #[arg(long)]
    show_prompt: bool,
}

/// Runs the command: one user turn per line of standard input, until end of input or `/exit`.
pub fn run(ctx: &Context, args: &Args) -> anyhow::Result<()> {
    let mut loaded = load(ctx, &args.model, 1)?;
    let tk = &loaded.tokenizer;
    let template = ChatTemplate::new(tk.chat_template(), tk.bos_token(), tk.eos_token())?;
    // Said once, on stderr, naming the key that decided it: the replies of a base checkpoint
    // read as if chat were broken.
    if let Some(advice) = loaded.tuning.advice() {
        eprintln!("note: {advice}");
    }
    let context = loaded.session.context();
    // Room kept for a reply when old turns must go.
    let reply_room = args.max_tokens.clamp(1, context / 4 + 1);
    let mut dropped_note = false;
    // The model's default sampling, with the flags given over it.
    let sampling = SamplerConfig {
        temperature: args.temperature.unwrap_or(loaded.sampling.temperature),
        seed: args.seed,
        ..loaded.sampling
    };
    let mut messages = Vec::new();
    if let Some(s) = &args.system {
        messages.push(Message::new(Role::System, s.clone()));
    }
    // Token ids currently in the cache (slot 0).
    let mut cached: Vec<u32> = Vec::new();
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    write!(stdout, "> ")?;
    stdout.flush()?;
    for line in stdin.lock().lines() {
        let line = line?;
        let text = line.trim();
        if text == "/exit" {
            break;
        }
        if text.is_empty() {
            write!(stdout, "> ")?;
            stdout.flush()?;
            continue;
        }
        messages.push(Message::new(Role::User, text.to_string()));
        let mut rendered = template.render(&messages, true)?;
        let mut ids = loaded.tokenizer.encode(&rendered, false)?;
        // A conversation that outgrows the context loses its oldest turns (the system prompt
        // stays), with one note, instead of ending.
        let first_turn = usize::from(args.system.is_some());
        while ids.len() + reply_room > context && messages.len() >= first_turn + 3 {
            // A user turn and its reply: the roles still alternate.
            messages.drain(first_turn..first_turn + 2);
            rendered = template.render(&messages, true)?;
            ids = loaded.tokenizer.encode(&rendered, false)?;
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
            stop: &[],
            keep,
        };
        let reply = generate::run(&mut loaded, ask, Some(&mut stdout))?.ids;
        // The cache now holds the fed tokens and the reply except its last (stop) token.
        cached = if keep { ids[..common].to_vec() } else { Vec::new() };
        cached.extend_from_slice(feed);
        cached.extend_from_slice(&reply[..reply.len().saturating_sub(1)]);
        let reply_text = loaded.tokenizer.decode(&reply, true)?;
        messages.push(Message::new(Role::Assistant, reply_text));
        write!(stdout, "> ")?;
        stdout.flush()?;
    }
    Ok(())
}
