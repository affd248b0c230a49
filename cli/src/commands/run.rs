//! `engine run`: generate from a prompt (or token ids), streaming text or printing JSON.

use std::io::Write;

use anyhow::bail;

use super::generate::{self, Ask, Prefill, SamplingArgs, Watch};
use super::load::{load, load_with, parse_tokens, read_images, ModelArgs};
use super::progress::Progress;
use super::speculate::{self, DraftArgs};
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
    /// An image (PNG, JPEG or WebP) for a multimodal model, repeatable: each `<start_of_image>`
    /// of the prompt stands for the next one, and images without one go first.
    #[arg(long = "image", value_name = "FILE", conflicts_with = "tokens")]
    images: Vec<std::path::PathBuf>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    draft: DraftArgs,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub fn run(ctx: &Context, args: &Args) -> anyhow::Result<()> {
    // A sampling flag out of range is told before the model loads.
    args.sampling.check()?;
    args.draft.check()?;
    if !args.images.is_empty() && args.draft.enabled() {
        bail!("--image with a draft (--draft-model, --draft) is not supported yet");
    }
    let inputs = read_images(&args.images)?;
    let mut loaded = if inputs.is_empty() {
        load(ctx, &args.model, 1)?
    } else {
        load_with(ctx, &args.model, args.model.options_for(true), 1)?
    };
    let mut drafter = args.draft.build(ctx, &args.model)?;
    let mut spec = match drafter.as_mut() {
        Some(d) => Some(args.draft.speculator(d, &loaded)?),
        None => None,
    };
    // The model's default sampling, with the flags given over it.
    let sampler_cfg = args.sampling.config(loaded.sampling)?;
    let prompt = match (&args.prompt, &args.tokens) {
        (Some(p), None) if !inputs.is_empty() => {
            let Some(images) = loaded.images.as_mut() else {
                bail!("the model was loaded without image input (--max-images 0)");
            };
            images
                .prompt(&mut loaded.session, &loaded.tokenizer, p, &inputs, true)?
                .ids
        }
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
        stop: &args.sampling.stop,
        keep: false,
        before: &[],
    };
    let streaming = !args.json && text_out;
    // A long prompt's feeding shows on a terminal's stderr, cleared before the first token.
    let mut progress = Progress::for_prompt();
    let mut prefill = |p: Prefill| progress.prefill(p.done as u64, p.total as u64, p.next as u64);
    let watch = Watch {
        stop: None,
        prefill: Some(&mut prefill),
    };
    let g = generate::run(
        &mut loaded,
        ask,
        streaming.then_some(&mut stdout as _),
        watch,
        spec.as_mut(),
    )?;
    progress.finish();
    let mut out = stdout.lock();
    if !args.json && !text_out {
        let ids: Vec<String> = g.ids.iter().map(u32::to_string).collect();
        writeln!(out, "{}", ids.join(","))?;
    }
    let stats = g.stats;
    if let (Some(s), false) = (&g.speculation, args.json) {
        eprintln!("{}", speculate::summary(s));
    }
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
            "speculation": g.speculation.as_ref().map(speculate::json),
        });
        writeln!(out, "{doc}")?;
    }
    Ok(())
}
