//! `engine logits`: the logits of every position of a token sequence.

use std::io::Write;

use super::load::{load, parse_tokens, ModelArgs};
use crate::Context;

/// Flags of `engine logits`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Comma-separated token ids.
    #[arg(long)]
    tokens: String,
    /// Print `{"tokens": [...], "logits": [[...], ...]}`.
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub fn run(ctx: &Context, args: &Args) -> anyhow::Result<()> {
    let tokens = parse_tokens(&args.tokens)?;
    let mut loaded = load(ctx, &args.model, 1)?;
    let flat = loaded.session.prefill(0, &tokens, true)?;
    let vocab = loaded.session.vocab();
    let rows: Vec<&[f32]> = flat.chunks_exact(vocab).collect();
    let mut out = std::io::stdout().lock();
    if args.json {
        let doc = serde_json::json!({ "tokens": tokens, "logits": rows });
        writeln!(out, "{doc}")?;
    } else {
        for (t, row) in tokens.iter().zip(&rows) {
            let (best, val) = row
                .iter()
                .enumerate()
                .fold((0usize, f32::NEG_INFINITY), |acc, (i, v)| {
                    if *v > acc.1 {
                        (i, *v)
                    } else {
                        acc
                    }
                });
            writeln!(out, "token {t}: argmax {best} ({val:.4})")?;
        }
    }
    Ok(())
}
