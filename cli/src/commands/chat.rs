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
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// Runs the command: one user turn per line of standard input, until end of input or `/exit`.
pub fn run(ctx: &Context, args: &Args) -> anyhow::Result<()> {
    let mut loaded = load(ctx, &args.model, 1)?;
    let tk = &loaded.tokenizer;
    let template = ChatTemplate::new(tk.chat_template(), tk.bos_token(), tk.eos_token())?;
    let sampling = SamplerConfig {
        temperature: args.temperature,
        seed: args.seed,
        ..Default::default()
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
        let rendered = template.render(&messages, true)?;
        let ids = loaded.tokenizer.encode(&rendered, false)?;
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
