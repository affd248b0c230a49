//! What `run` and `chat` share: the sampling and stop flags ([`SamplingArgs`]), and one
//! generation: the engine's generation loop (`tandem_engine::generate`, the request engine's
//! step with one sequence), heard between steps so that a long prompt's progress can be shown
//! and a reply stopped ([`Watch`]), with its events written to standard output and its errors
//! told in terms of this command's flags.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tandem_engine::runtime::sequence::Sequence;
use tandem_engine::runtime::speculative::{self, SpecStats, Speculator};
use tandem_engine::{
    Event, EventSink, FinishReason, GenerateError, GenerationStats, Loaded, Request, RequestError,
    SamplerConfig, SessionError,
};

/// The sampling and stop flags of `run` and `chat`.
#[derive(Debug, Clone, clap::Args)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy. Default: the model's generation_config.json, else 1.
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Keep the k most likely tokens (0: all). Default: the model's generation_config.json,
    /// else 64.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches p (1: all). Default: the
    /// model's generation_config.json, else 0.95.
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Drop tokens less likely than min-p times the most likely one (0: off). Default: the
    /// model's generation_config.json, else 0.
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Repetition penalty (1: off). Default: the model's generation_config.json
    /// (`repetition_penalty`), else 1.
    #[arg(long)]
    pub repeat_penalty: Option<f32>,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop before this text (repeatable); the text is cut there, as `engine serve` cuts it.
    #[arg(long)]
    pub stop: Vec<String>,
}

impl SamplingArgs {
    /// The flags given over `model`'s defaults (`Loaded::sampling`), checked: an error names the
    /// flag at fault.
    pub fn config(&self, model: SamplerConfig) -> anyhow::Result<SamplerConfig> {
        let cfg = SamplerConfig {
            temperature: self.temperature.unwrap_or(model.temperature),
            top_k: self.top_k.unwrap_or(model.top_k),
            top_p: self.top_p.unwrap_or(model.top_p),
            min_p: self.min_p.unwrap_or(model.min_p),
            repetition_penalty: self.repeat_penalty.unwrap_or(model.repetition_penalty),
            seed: self.seed,
        };
        cfg.validate()
            .map_err(|e| anyhow::anyhow!(e.with_name(flag(e.setting()))))?;
        Ok(cfg)
    }

    /// Checks the flags given before anything is loaded: each over tandem's defaults, whose
    /// ranges are those of every model's (a model's own defaults are checked as it loads).
    pub fn check(&self) -> anyhow::Result<()> {
        self.config(SamplerConfig::default()).map(drop)
    }
}

/// The flag that sets a sampling setting (`SamplerError::setting`).
fn flag(setting: &str) -> &str {
    match setting {
        "temperature" => "--temperature",
        "top_p" => "--top-p",
        "min_p" => "--min-p",
        "repetition_penalty" => "--repeat-penalty",
        other => other,
    }
}

/// What one generation asks for.
pub struct Ask<'a> {
    /// The prompt ids.
    pub prompt: Vec<u32>,
    /// Most tokens to generate (capped at the context: generation stops there anyway).
    pub max_tokens: usize,
    /// Sampling.
    pub sampling: SamplerConfig,
    /// Stop strings.
    pub stop: &'a [String],
    /// Continue the cached sequence of slot 0 instead of starting anew.
    pub keep: bool,
    /// With `keep`, the ids slot 0 holds before the prompt (a drafter reads them).
    pub before: &'a [u32],
}

/// Where a prompt's feeding stands, before a step that feeds part of it.
#[derive(Debug, Clone, Copy)]
pub struct Prefill {
    /// Prompt tokens in the cache.
    pub done: usize,
    /// Prompt tokens in all.
    pub total: usize,
    /// Prompt tokens the coming step feeds (the step that ends the prompt also gives the
    /// first token, which is printed during it).
    pub next: usize,
}

/// What a generation's caller watches and steers between steps.
#[derive(Default)]
pub struct Watch<'w> {
    /// Stops the generation before its next step once set (`chat`'s Ctrl-C); what was
    /// generated stays, and [`Generated::stopped`] says so.
    pub stop: Option<&'w AtomicBool>,
    /// Hears, before each step that feeds prompt tokens, where the prompt stands.
    pub prefill: Option<&'w mut dyn FnMut(Prefill)>,
}

/// What came out.
pub struct Generated {
    /// The generated ids (a stop token included).
    pub ids: Vec<u32>,
    /// Their text, cut before a stop string: what was written.
    pub text: String,
    /// The timing.
    pub stats: GenerationStats,
    /// Whether [`Watch::stop`] ended it (the timing's finish reason is then `length`).
    pub stopped: bool,
    /// What speculative decoding did, where it ran.
    pub speculation: Option<SpecStats>,
}

/// The events of one generation: ids and text collected, text also written to `out` as it
/// becomes final.
struct Collect<'a> {
    ids: Vec<u32>,
    text: String,
    finish: Option<FinishReason>,
    out: Option<&'a mut (dyn Write + Send)>,
    error: Option<std::io::Error>,
}

impl Collect<'_> {
    fn write(&mut self, text: &str) -> bool {
        self.text.push_str(text);
        let Some(out) = self.out.as_mut() else {
            return true;
        };
        match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            Ok(()) => true,
            Err(e) => {
                self.error.get_or_insert(e);
                false
            }
        }
    }
}

impl EventSink for &mut Collect<'_> {
    fn send(&mut self, event: Event) -> bool {
        match event {
            Event::Token { id, text, .. } => {
                self.ids.push(id);
                self.write(&text)
            }
            Event::Done {
                text, finish_reason, ..
            } => {
                self.finish = Some(finish_reason);
                self.write(&text)
            }
            Event::Failed { .. } => true,
        }
    }

    fn is_closed(&self) -> bool {
        self.error.is_some()
    }
}

/// Runs `ask` in slot 0 of `loaded`, writing the text to `out` as it comes (then a newline)
/// when given: `tandem_engine::generate`'s steps, with `watch` heard between them; with `spec`,
/// speculative decoding's (`runtime::speculative::generate`).
pub fn run(
    loaded: &mut Loaded,
    ask: Ask<'_>,
    out: Option<&mut (dyn Write + Send)>,
    mut watch: Watch<'_>,
    mut spec: Option<&mut Speculator<'_>>,
) -> anyhow::Result<Generated> {
    let streaming = out.is_some();
    let mut collect = Collect {
        ids: Vec::new(),
        text: String::new(),
        finish: None,
        out,
        error: None,
    };
    let session = &mut loaded.session;
    let request = Request {
        prompt: ask.prompt,
        max_tokens: ask.max_tokens.min(session.context()),
        sampling: ask.sampling,
        stop: ask.stop.to_vec(),
        sink: Box::new(&mut collect),
        arrived: Instant::now(),
        images: Vec::new(),
    };
    let chunk = session.chunk();
    let mut stopped = false;
    // The engine's generation loop, heard between steps: a stop asked (Ctrl-C) ends it, a
    // prompt being read reports its progress.
    let mut before_step = |seq: &Sequence<'_>| {
        if watch.stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            stopped = true;
            return false;
        }
        if let (true, Some(hear)) = (seq.prefilling(), watch.prefill.as_mut()) {
            let left = seq.prompt_left();
            hear(Prefill {
                done: seq.prompt_len() - left,
                total: seq.prompt_len(),
                next: left.min(chunk),
            });
        }
        true
    };
    let stepped = match spec.as_deref_mut() {
        None => tandem_engine::generate(session, &loaded.tokenizer, request, 0, ask.keep, &mut before_step),
        Some(spec) => {
            spec.before.clear();
            if ask.keep {
                spec.before.extend_from_slice(ask.before);
            }
            speculative::generate(
                session,
                &loaded.tokenizer,
                request,
                0,
                ask.keep,
                spec,
                &mut before_step,
            )
        }
    };
    if let Some(e) = collect.error.take() {
        return Err(e.into());
    }
    let stats = stepped.map_err(explain)?;
    if streaming {
        collect.write("\n");
        if let Some(e) = collect.error.take() {
            return Err(e.into());
        }
    }
    Ok(Generated {
        ids: collect.ids,
        text: collect.text,
        stats,
        stopped,
        speculation: spec.map(|s| s.stats.clone()),
    })
}

/// The engine's error, told with the flag that changes it.
fn explain(e: GenerateError) -> anyhow::Error {
    match &e {
        GenerateError::Request(RequestError::PromptTooLong { .. })
        | GenerateError::Session(SessionError::ContextFull { .. }) => {
            anyhow::anyhow!("{e} (--context sets the context)")
        }
        GenerateError::Request(RequestError::Sampling(s)) => anyhow::anyhow!(s.with_name(flag(s.setting()))),
        GenerateError::Request(RequestError::MaxTokens { value, context }) => {
            anyhow::anyhow!("--max-tokens must be between 1 and the context ({context}), got {value}")
        }
        GenerateError::Request(RequestError::StopWithoutText) => {
            anyhow::anyhow!("--stop needs a tokenizer, and this model has none (no tokenizer.json)")
        }
        _ => anyhow::anyhow!(e),
    }
}
