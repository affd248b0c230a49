//! The speculative decoding flags of `run` and `chat` ([`DraftArgs`]), and the drafter they
//! ask for: n-gram lookup, or a draft model loaded on its own backend.

use std::path::PathBuf;

use anyhow::Context as _;
use tandem_engine::runtime::speculative::draft::ModelDrafter;
use tandem_engine::runtime::speculative::ngram::NgramDrafter;
use tandem_engine::runtime::speculative::{
    DraftSetup, Drafter, SpecStats, Speculator, Target, MAX_DRAFT_TOKENS,
};
use tandem_engine::Loaded;

use super::load::{load, ModelArgs};
use crate::Context;

/// Speculative decoding's flags.
#[derive(Debug, Clone, clap::Args)]
pub struct DraftArgs {
    /// Speculative decoding's draft: `ngram` (lookup in the prompt and the text so far: pays
    /// where the output copies its input), or `model` (--draft-model; given alone, it implies
    /// this). Off by default.
    #[arg(long, value_parser = ["ngram", "model"])]
    pub draft: Option<String>,
    /// The draft model: a GGUF file or a model directory with the target's vocabulary, or
    /// `default` for the cached default model (Gemma 3 270M, which drafts for every Gemma 3).
    #[arg(long, value_name = "MODEL")]
    pub draft_model: Option<PathBuf>,
    /// The draft model's backend (as --backend takes it). Where it shares no unit with the
    /// target's, the draft runs ahead: it drafts the next block while the target verifies.
    #[arg(long, default_value = "cpu", value_name = "BACKEND")]
    pub draft_backend: String,
    /// The most draft tokens per block (1-16); the number adapts to the measured acceptance
    /// up to it.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub draft_tokens: usize,
    /// Always draft --draft-tokens tokens: no adaptation, no pause when speculation does not
    /// pay (for measuring one depth).
    #[arg(long)]
    pub draft_fixed: bool,
    /// Run the draft model ahead of the target on another thread: auto (where it shares no
    /// unit with the target), on, off.
    #[arg(long, default_value = "auto", value_parser = ["auto", "on", "off"])]
    pub draft_overlap: String,
}

/// The drafter the flags ask for.
pub enum Built {
    /// Lookup.
    Ngram(NgramDrafter),
    /// A draft model (boxed: a whole session).
    Model(Box<ModelDrafter>),
}

impl Built {
    /// The drafter.
    pub fn drafter(&mut self) -> &mut dyn Drafter {
        match self {
            Built::Ngram(d) => d,
            Built::Model(d) => d.as_mut(),
        }
    }
}

impl DraftArgs {
    /// Whether speculation is asked for.
    pub fn enabled(&self) -> bool {
        self.draft.is_some() || self.draft_model.is_some()
    }

    /// The draft model's flag and file, as an error names them.
    fn named(&self) -> String {
        match &self.draft_model {
            Some(p) => format!("--draft-model {}", p.display()),
            None => "--draft".into(),
        }
    }

    /// Checks the flags that need no model.
    pub fn check(&self) -> anyhow::Result<()> {
        if !self.enabled() {
            return Ok(());
        }
        if self.draft_tokens == 0 || self.draft_tokens > MAX_DRAFT_TOKENS {
            anyhow::bail!(
                "--draft-tokens must be between 1 and {MAX_DRAFT_TOKENS}, got {}",
                self.draft_tokens
            );
        }
        match (self.draft.as_deref(), &self.draft_model) {
            (Some("ngram"), Some(_)) => {
                anyhow::bail!("--draft ngram takes no --draft-model (a model draft is --draft model)")
            }
            (Some("model"), None) => anyhow::bail!("--draft model needs --draft-model MODEL"),
            _ => Ok(()),
        }
    }

    /// Builds the drafter (loading the draft model with the target's context, step size,
    /// cache type and precision), or `None` without speculation.
    pub fn build(&self, ctx: &Context, target: &ModelArgs) -> anyhow::Result<Option<Built>> {
        if !self.enabled() {
            return Ok(None);
        }
        if self.draft.as_deref() == Some("ngram") {
            return Ok(Some(Built::Ngram(NgramDrafter::default())));
        }
        let path = self.draft_model.clone().filter(|p| p.as_os_str() != "default");
        let args = ModelArgs {
            model: path,
            backend: self.draft_backend.clone(),
            gpu_layers: None,
            // The draft reads no images.
            mmproj: None,
            max_images: None,
            ..target.clone()
        };
        let loaded = load(ctx, &args, 1).context("loading the draft model (--draft-model)")?;
        Ok(Some(Built::Model(Box::new(ModelDrafter::new(loaded.session)))))
    }

    /// `built` with the flags' settings, for `engine serve`'s batcher: a draft model of
    /// another vocabulary than the target's (`target_vocab` logits) is refused here, before
    /// the server starts.
    pub fn setup(&self, built: Built, target_vocab: usize) -> anyhow::Result<DraftSetup> {
        let drafter: Box<dyn Drafter> = match built {
            Built::Ngram(d) => Box::new(d),
            Built::Model(d) => d,
        };
        if let Some(v) = drafter.vocab() {
            let t = target_vocab;
            if v != t {
                anyhow::bail!(
                    "{}: {}",
                    self.named(),
                    tandem_engine::runtime::speculative::SpeculationError::Vocabulary { draft: v, target: t }
                );
            }
        }
        Ok(DraftSetup {
            drafter,
            max_tokens: self.draft_tokens,
            fixed: self.draft_fixed,
            overlap: match self.draft_overlap.as_str() {
                "on" => Some(true),
                "off" => Some(false),
                _ => None,
            },
        })
    }

    /// Speculation over `built` for `target`'s session: the flags' depth and overlap; a draft
    /// model of another vocabulary is refused here.
    pub fn speculator<'d>(&self, built: &'d mut Built, target: &Loaded) -> anyhow::Result<Speculator<'d>> {
        let is_model = matches!(built, Built::Model(_));
        let target = Target::of(&target.session);
        let named = self.named();
        let mut spec = Speculator::new(built.drafter(), self.draft_tokens, &target)
            .map_err(|e| anyhow::anyhow!("{named}: {e}"))?;
        match self.draft_overlap.as_str() {
            "on" => spec.set_overlap(is_model),
            "off" => spec.set_overlap(false),
            _ => {}
        }
        Ok(if self.draft_fixed {
            spec.fixed(self.draft_tokens)
        } else {
            spec
        })
    }
}

/// One line saying what speculation did (stderr after `run`).
pub fn summary(s: &SpecStats) -> String {
    format!(
        "speculation ({}{}): {} of {} draft tokens kept ({:.1}%), {:.2} tokens per target step over {} steps",
        s.drafter,
        if s.overlap { ", running ahead" } else { "" },
        s.accepted,
        s.drafted,
        100.0 * s.acceptance(),
        s.tokens_per_step(),
        s.target_steps,
    )
}

/// The `speculation` object of `run --json`: the counts, with the acceptance and the tokens per
/// target step worked out.
pub fn json(s: &SpecStats) -> serde_json::Value {
    let mut v = serde_json::to_value(s).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("acceptance".into(), s.acceptance().into());
        o.insert("tokens_per_target_step".into(), s.tokens_per_step().into());
    }
    v
}
