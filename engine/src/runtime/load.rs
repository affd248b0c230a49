//! Loading a model onto the chosen backend as a [`Session`] with its tokenizer, and generating
//! text from it: what `engine run`, `chat`, `logits` and `bench` (and a server) share.

use std::io::Write;
use std::path::PathBuf;

use super::notice::Notice;
use super::placement::{choose_backend, PlacementError};
use super::plugins::PluginSearch;
use super::sampler::Sampler;
use super::session::{GenerationStats, Session, SessionError};
use super::settings::Settings;
use crate::model::files::open_model;
use crate::model::{CacheShape, Gemma3Model, LoadProgress, ModelError};
use crate::tokenizer::{Tokenizer, TokenizerError};

/// What to load and how to size it.
#[derive(Debug, Clone)]
pub struct ModelOptions {
    /// A GGUF file or a Hugging Face model directory; `None`: the cached default model.
    pub model: Option<PathBuf>,
    /// The backend: `cpu`, `vulkan`, `wgpu`, `npu`, or `auto` (see [`choose_backend`]).
    pub backend: String,
    /// Longest sequence (prompt + generated) in tokens; `None`: the model's, at most 4096.
    pub context: Option<usize>,
    /// Most prompt tokens processed in one step.
    pub chunk: usize,
}

/// Why a model could not be loaded onto a backend.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// No backend.
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// The model's files are unusable.
    #[error(transparent)]
    Model(Box<ModelError>),
    /// A zero context or chunk.
    #[error("--context and --chunk must be at least 1")]
    ZeroSize,
    /// The weights could not be uploaded.
    #[error("loading {}", path.display())]
    Upload {
        /// The model file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<ModelError>,
    },
}

impl From<ModelError> for LoadError {
    fn from(e: ModelError) -> Self {
        LoadError::Model(Box::new(e))
    }
}

/// Why generation stopped early.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The session failed.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// A generated id could not be decoded.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The output could not be written.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A loaded model with its tokenizer.
pub struct Loaded {
    /// The session.
    pub session: Session,
    /// The tokenizer.
    pub tokenizer: Tokenizer,
}

/// Loads `options.model` onto the backend `options.backend` names, with KV caches for `slots`
/// sequences; `progress` hears of every uploaded tensor, `notices` of backends passed over.
pub fn load(
    search: &PluginSearch,
    settings: &Settings,
    options: &ModelOptions,
    slots: usize,
    notices: &mut dyn FnMut(Notice),
    progress: &mut dyn LoadProgress,
) -> Result<Loaded, LoadError> {
    let mut backend = choose_backend(search, settings, &options.backend, notices)?;
    let files = open_model(options.model.as_deref())?;
    let (config, weights, tokenizer) = (files.config, files.weights, files.tokenizer);
    let context = options
        .context
        .unwrap_or(config.max_position_embeddings.min(4096));
    if context == 0 || options.chunk == 0 {
        return Err(LoadError::ZeroSize);
    }
    let shape = CacheShape {
        slots,
        context,
        max_step_rows: options.chunk.min(context),
    };
    let model =
        Gemma3Model::load(config, weights.as_ref(), backend.as_mut(), shape, progress).map_err(|source| {
            LoadError::Upload {
                path: files.path.clone(),
                source: Box::new(source),
            }
        })?;
    Ok(Loaded {
        session: Session::new(backend, model),
        tokenizer,
    })
}

impl Loaded {
    /// Generates after `prompt` (continuing slot 0's cached sequence when `keep`), writing the
    /// decoded text to `out` as it completes, then a newline; returns the new ids and the timing.
    pub fn stream(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        sampler: &mut Sampler,
        keep: bool,
        out: &mut dyn Write,
    ) -> Result<(Vec<u32>, GenerationStats), GenerateError> {
        let Loaded { session, tokenizer } = self;
        let stop = tokenizer.stop_ids().to_vec();
        let mut dec = tokenizer.stream_decoder(true);
        let (mut ids, mut failure) = (Vec::new(), None);
        let stats = session.generate(prompt, max_new, sampler, &stop, keep, |t| {
            ids.push(t);
            let piece = match dec.push(t) {
                Ok(piece) => piece,
                Err(e) => {
                    failure.get_or_insert(GenerateError::from(e));
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
}
