//! `engine perplexity`: perplexity of a text file, computed as llama.cpp's tool does: the
//! tokens are cut into chunks of `--context` tokens, each starting with BOS, and only the second
//! half of each chunk is scored (every scored token has at least half a context before it).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context as _};

use super::load::{load, ModelArgs};
use crate::Context;
use tandem_engine::Step;

/// Flags of `engine perplexity`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The text file.
    #[arg(long)]
    file: PathBuf,
    /// Tokens per chunk.
    #[arg(long = "ctx-size", default_value_t = 512)]
    ctx_size: usize,
    /// Score at most this many chunks (0: all).
    #[arg(long, default_value_t = 0)]
    chunks: usize,
    /// Print a JSON summary.
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub fn run(ctx: &Context, args: &Args) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let n_ctx = args.ctx_size;
    if n_ctx < 4 {
        bail!("--ctx-size must be at least 4");
    }
    let mut margs_context = args.model.context;
    if margs_context.is_none_or(|c| c < n_ctx) {
        margs_context = Some(n_ctx);
    }
    let model_args = ModelArgs {
        context: margs_context,
        ..args.model.clone()
    };
    let mut loaded = load(ctx, &model_args, 1)?;
    let tokens = loaded.tokenizer.encode(&text, false)?;
    let bos = loaded.tokenizer.bos_id();
    let available = tokens.len() / n_ctx;
    let n_chunks = if args.chunks == 0 {
        available
    } else {
        args.chunks.min(available)
    };
    if n_chunks == 0 {
        let n = tokens.len();
        let fix = if n >= 4 {
            format!("a text of at least {n_ctx} tokens, or --ctx-size {n} or less")
        } else {
            "a text of at least 4 tokens (the smallest --ctx-size)".to_string()
        };
        bail!(
            "{}: {n} tokens, fewer than one chunk of {n_ctx} (--ctx-size); use {fix}",
            args.file.display()
        );
    }
    let vocab = loaded.session.vocab();
    let first = n_ctx / 2;
    let (mut nll, mut nll2, mut count) = (0f64, 0f64, 0usize);
    let mut out = std::io::stdout().lock();
    let t0 = std::time::Instant::now();
    for c in 0..n_chunks {
        let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        loaded.session.reset(0);
        let mut pos = 0;
        // Rows that score nothing (before `first - 1`) go in whole steps; scored rows in steps
        // of a bounded slice of logits.
        let (whole, scoring) = (loaded.session.chunk(), loaded.session.scoring_chunk());
        while pos < n_ctx {
            let len = if pos + 1 < first {
                whole.min(first - 1 - pos)
            } else {
                scoring
            };
            let end = (pos + len).min(n_ctx);
            let piece = &chunk[pos..end];
            // Rows whose logits predict a scored token: positions first-1 ..= n_ctx-2.
            let select: Vec<u32> = (pos..end)
                .filter(|&p| p + 1 >= first && p + 1 < n_ctx)
                .map(|p| (p - pos) as u32)
                .collect();
            let sel = if select.is_empty() {
                vec![(end - pos - 1) as u32]
            } else {
                select.clone()
            };
            let slots = vec![0u32; piece.len()];
            let logits = loaded.session.step(Step::prefill(piece, &slots, &sel))?;
            for (i, &row) in select.iter().enumerate() {
                let target = chunk[pos + row as usize + 1] as usize;
                let l = &logits[i * vocab..(i + 1) * vocab];
                let max = l.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v)) as f64;
                let lse = max + l.iter().map(|v| (*v as f64 - max).exp()).sum::<f64>().ln();
                let v = lse - l[target] as f64;
                nll += v;
                nll2 += v * v;
                count += 1;
            }
            pos = end;
        }
        if !args.json {
            write!(out, "[{}]{:.4} ", c + 1, (nll / count as f64).exp())?;
            out.flush()?;
        }
    }
    let mean = nll / count as f64;
    let ppl = mean.exp();
    // Standard error of the mean NLL, propagated to the perplexity as llama.cpp does.
    let var = (nll2 / count as f64 - mean * mean).max(0.0);
    let err = ppl * (var / (count as f64 - 1.0).max(1.0)).sqrt();
    let secs = t0.elapsed().as_secs_f64();
    if args.json {
        let doc = serde_json::json!({
            "file": args.file, "chunks": n_chunks, "ctx_size": n_ctx, "scored_tokens": count,
            "perplexity": ppl, "perplexity_error": err, "seconds": secs,
            "tokens_per_second": (n_chunks * n_ctx) as f64 / secs.max(1e-9),
        });
        writeln!(out, "{doc}")?;
    } else {
        writeln!(out)?;
        writeln!(
            out,
            "Final estimate: PPL = {ppl:.4} +/- {err:.5} ({n_chunks} chunks of {n_ctx}, {secs:.1} s)"
        )?;
    }
    Ok(())
}
