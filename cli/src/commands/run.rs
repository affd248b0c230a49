//! `engine run`: generate from a prompt (or token ids), streaming text or printing JSON.

use std::io::Write;

use anyhow::bail;
use tandem_engine::SamplerConfig;

use super::generate::{self, Ask};
use super::load::{load, parse_tokens, ModelArgs};
use crate::Context;

/// Flags of `engine run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt text (BOS is added as the model's files ask).
    #[arg(long, conflicts_with = "tokens")]
    prompt: Option<String>,
    /// Comma-separated token ids instead of a prompt.
    #[arg(long)]
    tokens: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy. Default: the model's generation_config.json, else 1.
    #[arg(long)]
    temperature: Option<f32>,
    /// Keep the k most likely tokens (0: all). Default: the model's generation_config.json,
    /// else 64.
    #[arg(long)]
    top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches p (1: all). Default: the
    /// model's generation_config.json, else 0.95.
    #[arg(long)]
    top_p: Option<f32>,
    /// Drop tokens less likely than min-p times the most likely one (0: off). Default: the
    /// model's generation_config.json, else 0.
    #[arg(long)]
    min_p: Option<f32>,
    /// Repetition penalty (1: off). Default: the model's generation_config.json
    /// (`repetition_penalty`), else 1.
    #[arg(long)]
    repeat_penalty: Option<f32>,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop before this text (repeatable); the text is cut there, as `engine serve` cuts it.
    #[arg(long)]
    stop: Vec<String>,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub fn run(ctx: &Context, args: &Args) -> anyhow::Result<()> {
    let mut loaded = load(ctx, &args.model, 1)?;
    // The model's default sampling, with the flags given over it.
    let model = loaded.sampling;
    let sampler_cfg = SamplerConfig {
        temperature: args.temperature.unwrap_or(model.temperature),
        top_k: args.top_k.unwrap_or(model.top_k),
        top_p: args.top_p.unwrap_or(model.top_p),
        min_p: args.min_p.unwrap_or(model.min_p),
        repetition_penalty: args.repeat_penalty.unwrap_or(model.repetition_penalty),
        seed: args.seed,
    };
    let prompt = match (&args.prompt, &args.tokens) {
        (Some(p), None) => loaded.tokenizer.encode(p, true)?,
        (None, Some(t)) => parse_tokens(t)?,
        _ => bail!("give --prompt TEXT or --tokens IDS"),
    };
    // Without a vocabulary (a model directory without tokenizer.json) there is no text: the
    // ids are printed instead.
    let text_out = loaded.tokenizer.has_vocabulary();
    let mut stdout = std::io::stdout();
    let ask = Ask {
        prompt: prompt.clone(),
        max_tokens: args.max_tokens,
        sampling: sampler_cfg,
        stop: &args.stop,
        keep: false,
    };
    let streaming = !args.json && text_out;
    let g = generate::run(&mut loaded, ask, streaming.then_some(&mut stdout as _))?;
    let mut out = stdout.lock();
    if !args.json && !text_out {
        let ids: Vec<String> = g.ids.iter().map(u32::to_string).collect();
        writeln!(out, "{}", ids.join(","))?;
    }
    let stats = g.stats;
    if args.json {
        let text = text_out.then_some(g.text);
        let doc = serde_json::json!({
            "tokens": g.ids,
            "text": text,
            "finish_reason": stats.finish_reason,
            "prompt_tokens": prompt,
            "backend": loaded.session.backend().info().name,
            "stats": stats,
            "prefill_tokens_per_second": stats.prompt_tokens as f64 / stats.prefill_seconds.max(1e-9),
            "decode_tokens_per_second": (stats.generated_tokens.saturating_sub(1)) as f64 / stats.decode_seconds.max(1e-9),
        });
        writeln!(out, "{doc}")?;
    }
    Ok(())
}
