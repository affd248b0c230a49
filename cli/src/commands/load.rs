//! What `run`, `logits`, `chat` and `bench` share: the model flags, and loading the model with
//! progress on a terminal ([`super::progress`]) and the engine's notices on stderr.

use std::cell::RefCell;
use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Context as _;
use tandem_engine::{KvCacheType, Loaded, ModelOptions, Notice, Settings};

use super::progress::{self, Progress};
use crate::Context;

/// Flags every model command takes.
#[derive(Debug, Clone, clap::Args)]
pub struct ModelArgs {
    /// A GGUF file or a Hugging Face model directory (config.json, safetensors,
    /// tokenizer.json); default: the cached default model (scripts/fetch-model.sh).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Backend: cpu, vulkan, wgpu, npu, auto (the config's [placement], else the first available
    /// of vulkan, wgpu, cpu), or A+B: attention on A, everything else on B.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Longest sequence (prompt + generated) in tokens; default: the model's, at most 4096.
    #[arg(long)]
    pub context: Option<usize>,
    /// Most prompt tokens processed in one step (512: on the H100 a 512-token prompt prefilled
    /// 2.4x faster on Vulkan in one step than in four of 128; `engine serve` interleaves other
    /// streams' decode steps between chunks, so a smaller chunk lowers their latency).
    #[arg(long, default_value_t = 512)]
    pub chunk: usize,
    /// KV cache element type: f32, or f16 (half the cache memory; no faster on the H100).
    #[arg(long, default_value = "f32", value_parser = parse_kv_cache)]
    pub kv_cache: KvCacheType,
    /// Layers 0..N on the backend chosen (a GPU) with the embedding and the output head, the
    /// rest on the CPU: llama.cpp's -ngl, counted from the first layer. At most the model's
    /// layer count.
    #[arg(long, value_name = "N")]
    pub gpu_layers: Option<usize>,
    /// Arithmetic of the backends that offer a choice, over the config's `precision`: fast
    /// (8-bit activations: the CPU's q8_0 decode products with AVX-512 VNNI, the CPU's default
    /// as it passes the KL rule; the GPUs' integer-dot decode products, which fail it, so exact
    /// is their default) or exact (16-bit activations). See docs/precision.md.
    #[arg(long, value_parser = ["exact", "fast"])]
    pub precision: Option<String>,
    /// llama.cpp's mmproj GGUF holding the vision tower, for a GGUF model: turns image input on.
    /// A Hugging Face directory of a multimodal model carries its own tower.
    #[arg(long, value_name = "FILE")]
    pub mmproj: Option<PathBuf>,
    /// Images held at once (0: image input off). Default: 8 where image input is on (--mmproj,
    /// --image, chat's /image), else 0.
    #[arg(long, value_name = "N")]
    pub max_images: Option<usize>,
}

fn parse_kv_cache(s: &str) -> Result<KvCacheType, String> {
    s.parse()
        .map_err(|_| format!("--kv-cache must be f32 or f16, not '{s}'"))
}

impl ModelArgs {
    /// `settings` with these flags' backend options over the config's: `--precision` on every
    /// backend that reads `precision`.
    pub fn settings(&self, settings: &Settings) -> Settings {
        let mut s = settings.clone();
        if let Some(p) = &self.precision {
            for (name, keys) in tandem_engine::runtime::settings::BACKEND_OPTIONS {
                if keys.contains(&"precision") {
                    s.set_backend_option(name, "precision", p);
                }
            }
        }
        s
    }

    /// The engine's options for these flags; `images`: the command takes images even without
    /// --mmproj (the model's own tower).
    pub fn options_for(&self, images: bool) -> ModelOptions {
        let on = images || self.mmproj.is_some();
        let default_images = if on {
            tandem_engine::runtime::images::DEFAULT_MAX_IMAGES
        } else {
            0
        };
        ModelOptions {
            images: self.max_images.unwrap_or(default_images),
            mmproj: self.mmproj.clone(),
            ..self.options()
        }
    }

    /// The engine's options for these flags (image input only with --mmproj or --max-images).
    pub fn options(&self) -> ModelOptions {
        let images = match (&self.mmproj, self.max_images) {
            (_, Some(n)) => n,
            (Some(_), None) => tandem_engine::runtime::images::DEFAULT_MAX_IMAGES,
            (None, None) => 0,
        };
        ModelOptions {
            model: self.model.clone(),
            backend: self.backend.clone(),
            context: self.context,
            chunk: self.chunk,
            kv_cache: self.kv_cache,
            gpu_layers: self.gpu_layers,
            images,
            mmproj: self.mmproj.clone(),
        }
    }
}

/// Prints a notice from the engine on stderr (a progress step only where stderr is a terminal).
pub fn print_notice(notice: Notice) {
    if let Some(text) = progress::line(&notice, std::io::stderr().is_terminal()) {
        eprintln!("{text}");
    }
}

/// Loads `--model` onto the chosen backend, with progress on a terminal ([`Progress`]).
pub fn load(ctx: &Context, args: &ModelArgs, slots: usize) -> anyhow::Result<Loaded> {
    load_with(ctx, args, args.options(), slots)
}

/// [`load`] with the engine's options given (image input asked for by the command).
pub fn load_with(
    ctx: &Context,
    args: &ModelArgs,
    options: ModelOptions,
    slots: usize,
) -> anyhow::Result<Loaded> {
    load_with_settings(ctx, args, &args.settings(&ctx.settings), options, slots)
}

/// [`load_with`] under `settings` (the command's own, e.g. with `profile` set on the backends).
pub fn load_with_settings(
    ctx: &Context,
    args: &ModelArgs,
    settings: &tandem_engine::Settings,
    options: ModelOptions,
    slots: usize,
) -> anyhow::Result<Loaded> {
    // The engine calls one of the two at a time, never one inside the other.
    let progress = RefCell::new(Progress::new(progress::load_label(args.model.as_deref())));
    let loaded = tandem_engine::load(
        &ctx.search,
        settings,
        &options,
        slots,
        &mut |n| progress.borrow_mut().notice(n),
        &mut |done, total| progress.borrow_mut().bytes(done, total),
    );
    progress.borrow_mut().finish();
    Ok(loaded?)
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

/// Reads image files for a prompt, naming the file that cannot be read.
pub fn read_images(paths: &[PathBuf]) -> anyhow::Result<Vec<tandem_engine::runtime::images::ImageInput>> {
    paths
        .iter()
        .map(|p| {
            let bytes = std::fs::read(p).with_context(|| format!("reading the image {}", p.display()))?;
            Ok(tandem_engine::runtime::images::ImageInput {
                name: p.display().to_string(),
                bytes,
            })
        })
        .collect()
}
