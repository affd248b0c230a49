//! Images in prompts (Gemma 3's vision, issue 58): the vision tower found beside the model (a
//! Hugging Face directory's `vision_tower.*`, or llama.cpp's mmproj GGUF), loaded on its own unit,
//! and a prompt with images turned into token ids the session runs.
//!
//! As transformers' `Gemma3Processor` does, each `<start_of_image>` of the text becomes
//! `\n\n<start_of_image>` + `tokens_per_image` soft tokens + `<end_of_image>\n\n` before the text
//! is tokenized. The soft tokens of image `k` are then given ids past the vocabulary, `vocab +
//! first + j`, where `first` is the image's place in the model's table of image rows
//! (`Gemma3Model::add_image_rows`), written with the image's projected features before the
//! prompt runs: the embedding reads them there, and the attention lets each image's rows see
//! the whole image (`Op::Attention::bidirectional_from`). A place is held until the prompt is in
//! the KV cache ([`Images::release`]).

use tandem_backend_api::ComputeBackend;
use tandem_image_input::{ImageError, PreprocessConfig};

use super::session::{Session, SessionError};
use crate::checkpoint::error::CheckpointError;
use crate::model::vision::VisionTower;
use crate::model::vision_source::VisionSource;
use crate::model::ModelError;
use crate::tokenizer::{Tokenizer, TokenizerError};

/// Images held at once when the user does not say (`--max-images`).
pub const DEFAULT_MAX_IMAGES: usize = 8;

/// What went wrong finding the vision tower or reading a prompt's images.
#[derive(Debug, thiserror::Error)]
pub enum ImagesError {
    /// Its weights are unusable.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The tower could not be built or run.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The tokenizer lacks the image tokens, or failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The tokenizer has no token for `what`.
    #[error("the tokenizer has no {what} token (id {id})")]
    MissingToken {
        /// Which token.
        what: &'static str,
        /// Its id in the vision config.
        id: u32,
    },
    /// An image did not decode or is too large.
    #[error("image {index} ({name}): {source}")]
    Image {
        /// 1-based, in prompt order.
        index: usize,
        /// Its file name or `data URL`.
        name: String,
        /// Why.
        source: ImageError,
    },
    /// More `<start_of_image>` markers than images.
    #[error("the prompt has {markers} <start_of_image> markers but {images} images were given")]
    Markers {
        /// Markers in the text.
        markers: usize,
        /// Images given.
        images: usize,
    },
    /// More images than the model was loaded to hold at once.
    #[error("{images} images in one prompt; the model was loaded to hold {held} at once (--max-images)")]
    TooMany {
        /// Images asked for.
        images: usize,
        /// Free places.
        held: usize,
    },
    /// An image's soft tokens do not fit one prefill step.
    #[error("an image's {tokens} tokens do not fit the prefill chunk of {chunk} (--chunk must be at least {tokens})")]
    Chunk {
        /// Tokens per image.
        tokens: usize,
        /// The chunk.
        chunk: usize,
    },
    /// Writing the image's rows failed.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The text holds image soft tokens of its own.
    #[error("the prompt's text holds {soft} tokens of its own (only images make them)")]
    StraySoftTokens {
        /// The soft token as text.
        soft: String,
    },
    /// The vision tower's unit could not be created.
    #[error("creating the vision tower's unit: {0}")]
    Unit(String),
    /// The model was loaded without rows for images.
    #[error("the model was loaded without room for images (load it with images enabled)")]
    NoRows,
}

/// One image of a prompt: its bytes (PNG, JPEG or WebP) and a name for messages.
#[derive(Debug, Clone)]
pub struct ImageInput {
    /// A file name, or `data URL`.
    pub name: String,
    /// The encoded image.
    pub bytes: Vec<u8>,
}

/// A prompt with its images in the image table: its ids, and the places to release once the
/// prompt is in the KV cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagePrompt {
    /// Token ids, image soft tokens past the vocabulary.
    pub ids: Vec<u32>,
    /// The image table places it holds.
    pub places: Vec<usize>,
}

/// The vision tower on its unit, the image tokens, and which places of the model's image table
/// are free.
pub struct Images {
    tower: VisionTower,
    unit: Box<dyn ComputeBackend>,
    unit_name: String,
    preprocess: PreprocessConfig,
    /// `<start_of_image>`, the soft token and `<end_of_image>` as text.
    boi: String,
    soft: String,
    eoi: String,
    soft_id: u32,
    per_image: usize,
    /// Free places of the image table (each `per_image` rows), lowest last.
    free: Vec<usize>,
    places: usize,
}

impl Images {
    /// Loads `source`'s tower on `unit` (named `unit_name`) for a session whose model holds an
    /// image table ([`Session::image_rows`]) and runs prompt chunks of `chunk` tokens.
    pub fn open(
        source: &VisionSource,
        mut unit: Box<dyn ComputeBackend>,
        unit_name: &str,
        session: &Session,
        text_hidden: usize,
        tokenizer: &Tokenizer,
    ) -> Result<Images, ImagesError> {
        let cfg = &source.config;
        let per_image = cfg.tokens_per_image;
        let rows = session.image_rows();
        if rows < per_image || per_image == 0 {
            return Err(ImagesError::NoRows);
        }
        if session.chunk() < per_image {
            return Err(ImagesError::Chunk {
                tokens: per_image,
                chunk: session.chunk(),
            });
        }
        let text = |what: &'static str, id: u32| -> Result<String, ImagesError> {
            let bytes = tokenizer
                .token_bytes(id)
                .ok_or(ImagesError::MissingToken { what, id })?;
            String::from_utf8(bytes).map_err(|_| ImagesError::MissingToken { what, id })
        };
        let (boi, soft, eoi) = (
            text("<start_of_image>", cfg.boi_token)?,
            text("<image_soft_token>", cfg.image_token)?,
            text("<end_of_image>", cfg.eoi_token)?,
        );
        let weights = source.weights()?;
        let tower = VisionTower::load(unit.as_mut(), cfg, text_hidden, weights.as_ref())?;
        let places = rows / per_image;
        Ok(Images {
            tower,
            unit,
            unit_name: unit_name.to_string(),
            preprocess: source.preprocess.clone(),
            boi,
            soft,
            eoi,
            soft_id: cfg.image_token,
            per_image,
            free: (0..places).rev().collect(),
            places,
        })
    }

    /// The unit the tower runs on.
    pub fn unit_name(&self) -> &str {
        &self.unit_name
    }

    /// Soft tokens per image.
    pub fn tokens_per_image(&self) -> usize {
        self.per_image
    }

    /// Images held at once.
    pub fn capacity(&self) -> usize {
        self.places
    }

    /// `<start_of_image>` as text: where an image goes in a prompt.
    pub fn marker(&self) -> &str {
        &self.boi
    }

    /// Encodes `images` with the tower, writes their soft tokens into free places of the
    /// session's image table, and tokenizes `text` with them: each `<start_of_image>` of the
    /// text stands for the next image (images without one go first, at the start of the text).
    pub fn prompt(
        &mut self,
        session: &mut Session,
        tokenizer: &Tokenizer,
        text: &str,
        images: &[ImageInput],
        add_special: bool,
    ) -> Result<ImagePrompt, ImagesError> {
        let markers = text.matches(self.boi.as_str()).count();
        if markers > images.len() {
            return Err(ImagesError::Markers {
                markers,
                images: images.len(),
            });
        }
        if images.len() > self.free.len() {
            return Err(ImagesError::TooMany {
                images: images.len(),
                held: self.free.len(),
            });
        }
        let mut full = self.boi.repeat(images.len() - markers);
        full.push_str(text);
        let sequence = format!(
            "\n\n{}{}{}\n\n",
            self.boi,
            self.soft.repeat(self.per_image),
            self.eoi
        );
        let full = full.replace(self.boi.as_str(), &sequence);
        let mut ids = tokenizer.encode(&full, add_special)?;
        // Runs of soft tokens: one of `per_image` per image, else the text held soft tokens of
        // its own.
        let runs: Vec<(usize, usize)> = ids
            .chunk_by(|a, b| (*a == self.soft_id) == (*b == self.soft_id))
            .scan(0usize, |at, run| {
                let start = *at;
                *at += run.len();
                Some((start, run.len(), run[0] == self.soft_id))
            })
            .filter(|r| r.2)
            .map(|r| (r.0, r.1))
            .collect();
        if runs.len() != images.len() || runs.iter().any(|r| r.1 != self.per_image) {
            return Err(ImagesError::StraySoftTokens {
                soft: self.soft.clone(),
            });
        }
        // Each image's features first: a bad image fails before any place is taken.
        let mut features = Vec::with_capacity(images.len());
        for (i, image) in images.iter().enumerate() {
            let failed = |source| ImagesError::Image {
                index: i + 1,
                name: image.name.clone(),
                source,
            };
            let rgb = tandem_image_input::decode(&image.bytes).map_err(failed)?;
            let pixels = tandem_image_input::preprocess(&rgb, &self.preprocess);
            features.push(self.tower.encode(self.unit.as_mut(), &pixels)?.tokens);
        }
        let mut places = Vec::with_capacity(images.len());
        for f in &features {
            let Some(place) = self.free.pop() else {
                break;
            };
            places.push(place);
            if let Err(e) = session.write_image_rows(place * self.per_image, f) {
                self.release(&places);
                return Err(e.into());
            }
        }
        // The soft tokens, run by run, to their image's rows.
        let vocab = session.vocab() as u32;
        for (&(start, len), &place) in runs.iter().zip(&places) {
            for (j, id) in ids[start..start + len].iter_mut().enumerate() {
                *id = vocab + (place * self.per_image + j) as u32;
            }
        }
        Ok(ImagePrompt { ids, places })
    }

    /// Frees image table places once their prompt is in the KV cache.
    pub fn release(&mut self, places: &[usize]) {
        for &p in places {
            if p < self.places && !self.free.contains(&p) {
                self.free.push(p);
            }
        }
    }
}

/// Whether `id` is an image row's (past the vocabulary of `vocab`).
pub fn is_image_row(id: u32, vocab: usize) -> bool {
    id as usize >= vocab
}
