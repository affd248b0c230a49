//! What `run`, `logits` and `chat` share: choosing the backend and loading the model.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{bail, Context as _};
use tandem_backend_api::{ComputeBackend, DeviceKind};
use tandem_engine::model::files::open_model;
use tandem_engine::model::{CacheShape, Gemma3Model};
use tandem_engine::runtime::session::Session;
use tandem_engine::tokenizer::Tokenizer;

use crate::Context;

/// Flags every model command takes.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelArgs {
    /// A GGUF file or a Hugging Face model directory (config.json, safetensors,
    /// tokenizer.json); default: the cached default model (scripts/fetch-model.sh).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Backend: cpu, vulkan, wgpu, npu, or auto (the first available of vulkan, wgpu, cpu).
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Longest sequence (prompt + generated) in tokens; default: the model's, at most 4096.
    #[arg(long)]
    pub context: Option<usize>,
    /// Most prompt tokens processed in one step.
    #[arg(long, default_value_t = 128)]
    pub chunk: usize,
}

/// Creates the backend named by `--backend`, degrading along the list for `auto`.
pub fn backend(ctx: &Context, name: &str) -> anyhow::Result<Box<dyn ComputeBackend>> {
    let discovery = ctx.search.discover();
    for p in &discovery.problems {
        eprintln!("warning: {p}");
    }
    // The built-in `auto` order passes over software GPUs (lavapipe, llvmpipe, SwiftShader):
    // they run the GPU kernels on the CPU, slower than the CPU backend itself. A configured
    // `[placement] default` list is taken as written.
    let skip_software = name == "auto" && ctx.settings.placement.default.is_none();
    let candidates: Vec<&str> = match name {
        "auto" => ctx.settings.placement.default.as_ref().map_or_else(
            || vec!["vulkan", "wgpu", "cpu"],
            |v| v.iter().map(String::as_str).collect(),
        ),
        n if n.contains('+') => {
            bail!("--backend {n}: hybrid placement across backends is not implemented yet; name one backend")
        }
        n => vec![n],
    };
    let mut reasons = Vec::new();
    let mut software = None;
    for c in &candidates {
        match discovery.create(c, &ctx.settings.backend_options(c)) {
            Ok(b) if skip_software && b.info().kind == DeviceKind::SoftwareGpu => {
                reasons.push(format!("{c} runs on {}, a software GPU", b.info().device));
                software.get_or_insert(b);
            }
            Ok(b) => {
                if !reasons.is_empty() {
                    eprintln!("note: using the {c} backend ({})", reasons.join("; "));
                }
                return Ok(b);
            }
            Err(e) if name == "auto" => reasons.push(e.to_string()),
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(b) = software {
        eprintln!(
            "note: using {} on a software GPU ({})",
            b.info().name,
            reasons.join("; ")
        );
        return Ok(b);
    }
    bail!("no backend available: {}", reasons.join("; "))
}

/// A loaded model with its tokenizer.
pub struct Loaded {
    /// The session.
    pub session: Session,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
}

/// Loads `--model` onto the chosen backend, with a progress bar on a terminal.
pub fn load(ctx: &Context, args: &ModelArgs, slots: usize) -> anyhow::Result<Loaded> {
    let mut backend = backend(ctx, &args.backend)?;
    let files = open_model(args.model.as_deref())?;
    let (config, weights, tokenizer) = (files.config, files.weights, files.tokenizer);
    let context = args.context.unwrap_or(config.max_position_embeddings.min(4096));
    if context == 0 || args.chunk == 0 {
        bail!("--context and --chunk must be at least 1");
    }
    let shape = CacheShape {
        slots,
        context,
        max_step_rows: args.chunk.min(context),
    };
    let bar = if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(weights.total_bytes());
        bar.set_style(
            indicatif::ProgressStyle::with_template("loading {bar:40} {bytes}/{total_bytes} {elapsed}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Some(bar)
    } else {
        None
    };
    let mut progress = |done: u64, _total: u64| {
        if let Some(b) = &bar {
            b.set_position(done);
        }
    };
    let model = Gemma3Model::load(config, weights.as_ref(), backend.as_mut(), shape, &mut progress)
        .with_context(|| format!("loading {}", files.path.display()))?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(Loaded {
        session: Session::new(backend, model),
        tokenizer,
    })
}

/// Parses `--tokens 2,17,5`.
pub fn parse_tokens(s: &str) -> anyhow::Result<Vec<u32>> {
    s.split(',')
        .map(|t| {
            t.trim()
                .parse::<u32>()
                .with_context(|| format!("--tokens: '{t}' is not a token id"))
        })
        .collect()
}

/// Generates after `prompt` (continuing slot 0's cached sequence when `keep`), streaming the
/// decoded text to `out` as it completes; returns the new ids and the timing.
pub fn stream(
    loaded: &mut Loaded,
    prompt: &[u32],
    max_new: usize,
    sampler: &mut tandem_engine::runtime::sampler::Sampler,
    keep: bool,
    out: &mut impl std::io::Write,
) -> anyhow::Result<(Vec<u32>, tandem_engine::runtime::session::GenerationStats)> {
    let Loaded { session, tokenizer } = loaded;
    let stop = tokenizer.stop_ids().to_vec();
    let mut dec = tokenizer.stream_decoder(true);
    let (mut ids, mut failure) = (Vec::new(), None);
    let stats = session.generate(prompt, max_new, sampler, &stop, keep, |t| {
        ids.push(t);
        let piece = match dec.push(t) {
            Ok(piece) => piece,
            Err(e) => {
                failure.get_or_insert(anyhow::Error::from(e));
                None
            }
        };
        if let Some(text) = piece {
            if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                failure.get_or_insert(e.into());
            }
        }
        Ok(())
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    if let Some(text) = dec.finish()? {
        out.write_all(text.as_bytes())?;
    }
    writeln!(out)?;
    Ok((ids, stats))
}
