//! `engine tokenize`: the ids the model sees for a text.

use std::io::Write;
use std::path::PathBuf;

use tandem_engine::open_model;

use crate::Context;

/// Flags of `engine tokenize`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A GGUF file or a Hugging Face model directory; default: the cached default model.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The text.
    #[arg(long)]
    prompt: String,
    /// Leave out BOS (and other special tokens the model's files add).
    #[arg(long)]
    no_special: bool,
    /// Print `{"tokens": [...]}`.
    #[arg(long)]
    json: bool,
}

/// Runs the command (no backend is needed).
pub fn run(_ctx: &Context, args: &Args) -> anyhow::Result<()> {
    let files = open_model(args.model.as_deref())?;
    let ids = files.tokenizer.encode(&args.prompt, !args.no_special)?;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::json!({ "tokens": ids }))?;
    } else {
        for id in &ids {
            let piece = files.tokenizer.decode(std::slice::from_ref(id), false)?;
            writeln!(out, "{id:>7}  {piece:?}")?;
        }
    }
    Ok(())
}
