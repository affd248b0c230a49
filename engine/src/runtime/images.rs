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

use std::sync::{Arc, Mutex};

use tandem_backend_api::{ComputeBackend, NodeTime};
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
    /// The image table's places (each `per_image` rows).
    pool: PlacePool,
}

/// The places of a model's image table (each one image's rows) and which are free: shared
/// between whoever encodes images and whoever runs their prompts (`engine serve`'s handlers
/// and batcher), each lock held for a moment.
#[derive(Debug, Clone)]
pub struct PlacePool {
    free: Arc<Mutex<Vec<usize>>>,
    places: usize,
}

impl PlacePool {
    fn new(places: usize) -> PlacePool {
        PlacePool {
            free: Arc::new(Mutex::new((0..places).rev().collect())),
            places,
        }
    }

    fn free(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        // A panic elsewhere leaves the list whole (pushes and pops only).
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `n` free places, or none when fewer are free.
    pub fn take(&self, n: usize) -> Result<Vec<usize>, ImagesError> {
        let mut free = self.free();
        if n > free.len() {
            return Err(ImagesError::TooMany {
                images: n,
                held: free.len(),
            });
        }
        let at = free.len() - n;
        Ok(free.split_off(at).into_iter().rev().collect())
    }

    /// Gives places back.
    pub fn release(&self, places: &[usize]) {
        let mut free = self.free();
        for &p in places {
            if p < self.places && !free.contains(&p) {
                free.push(p);
            }
        }
    }

    /// Places held until the value is dropped.
    pub fn hold(&self, places: Vec<usize>) -> HeldPlaces {
        HeldPlaces {
            pool: self.clone(),
            places,
        }
    }

    /// Places in all.
    pub fn capacity(&self) -> usize {
        self.places
    }
}

/// Places of the image table held by a request, given back when it is dropped.
#[derive(Debug)]
pub struct HeldPlaces {
    pool: PlacePool,
    places: Vec<usize>,
}

impl HeldPlaces {
    /// The places.
    pub fn places(&self) -> &[usize] {
        &self.places
    }
}

impl Drop for HeldPlaces {
    fn drop(&mut self) {
        self.pool.release(&self.places);
    }
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
        // The model's own tokens by name where its tokenizer has them (an mmproj file names no
        // ids), else the vision config's ids.
        let token = |what: &'static str, configured: u32| -> Result<(u32, String), ImagesError> {
            let id = tokenizer.token_id(what).unwrap_or(configured);
            let bytes = tokenizer
                .token_bytes(id)
                .ok_or(ImagesError::MissingToken { what, id })?;
            let text = String::from_utf8(bytes).map_err(|_| ImagesError::MissingToken { what, id })?;
            Ok((id, text))
        };
        let (_, boi) = token("<start_of_image>", cfg.boi_token)?;
        let (soft_id, soft) = token("<image_soft_token>", cfg.image_token)?;
        let (_, eoi) = token("<end_of_image>", cfg.eoi_token)?;
        let weights = source.weights()?;
        let tower = VisionTower::load(unit.as_mut(), cfg, text_hidden, weights.as_ref())?;
        let pool = PlacePool::new(rows / per_image);
        Ok(Images {
            tower,
            unit,
            unit_name: unit_name.to_string(),
            preprocess: source.preprocess.clone(),
            boi,
            soft,
            eoi,
            soft_id,
            per_image,
            pool,
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
        self.pool.capacity()
    }

    /// The image table's places, to share.
    pub fn pool(&self) -> &PlacePool {
        &self.pool
    }

    /// `<start_of_image>` as text: where an image goes in a prompt.
    pub fn marker(&self) -> &str {
        &self.boi
    }

    /// Encodes `images` with the tower, writes their soft tokens into free places of the
    /// session's image table, and tokenizes `text` with them ([`Images::tokenize`]). The places
    /// are held until [`Images::release`]; on an error none is.
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
        let places = self.place(session, images, 1)?;
        match self.tokenize(tokenizer, text, &places, add_special, session.vocab()) {
            Ok(ids) => Ok(ImagePrompt { ids, places }),
            Err(e) => {
                self.release(&places);
                Err(e)
            }
        }
    }

    /// Encodes `images` with the tower and writes each one's soft tokens into a free place of
    /// the session's image table; returns the places, held until [`Images::release`]. Every
    /// image is encoded before a place is taken: a bad one (`first` + its index in messages)
    /// fails with none held.
    pub fn place(
        &mut self,
        session: &mut Session,
        images: &[ImageInput],
        first: usize,
    ) -> Result<Vec<usize>, ImagesError> {
        let features = self.encode(images, first)?;
        let places = self.pool.take(images.len())?;
        for (f, &place) in features.iter().zip(&places) {
            if let Err(e) = session.write_image_rows(place * self.per_image, f) {
                self.release(&places);
                return Err(e.into());
            }
        }
        Ok(places)
    }

    /// Per-node device time of the last image's tower and projector, where the unit measures it
    /// (its `profile` option; `engine bench --profile --image` sets it).
    pub fn profile_last_encoding(&mut self) -> Result<Vec<NodeTime>, ImagesError> {
        Ok(self.tower.profile(self.unit.as_mut())?)
    }

    /// Each image's soft tokens (`[tokens_per_image, width]`): decoded, preprocessed and run
    /// through the tower; `first` numbers the images in messages.
    pub fn encode(&mut self, images: &[ImageInput], first: usize) -> Result<Vec<Vec<f32>>, ImagesError> {
        if images.len() > self.pool.capacity() {
            return Err(ImagesError::TooMany {
                images: images.len(),
                held: self.pool.capacity(),
            });
        }
        let mut features = Vec::with_capacity(images.len());
        for (i, image) in images.iter().enumerate() {
            let failed = |source| ImagesError::Image {
                index: first + i,
                name: image.name.clone(),
                source,
            };
            let rgb = tandem_image_input::decode(&image.bytes).map_err(failed)?;
            let pixels = tandem_image_input::preprocess(&rgb, &self.preprocess);
            features.push(self.tower.encode(self.unit.as_mut(), &pixels)?.tokens);
        }
        Ok(features)
    }

    /// Tokenizes `text` for images already in the table at `places`, in order: each
    /// `<start_of_image>` of the text stands for the next image (images without one go first,
    /// at the start of the text), expanded as Gemma 3's processor does, its soft tokens given
    /// the image's rows (ids from `vocab` on).
    pub fn tokenize(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
        places: &[usize],
        add_special: bool,
        vocab: usize,
    ) -> Result<Vec<u32>, ImagesError> {
        let markers = text.matches(self.boi.as_str()).count();
        if markers > places.len() {
            return Err(ImagesError::Markers {
                markers,
                images: places.len(),
            });
        }
        let mut full = self.boi.repeat(places.len() - markers);
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
        if runs.len() != places.len() || runs.iter().any(|r| r.1 != self.per_image) {
            return Err(ImagesError::StraySoftTokens {
                soft: self.soft.clone(),
            });
        }
        for (&(start, len), &place) in runs.iter().zip(places) {
            for (j, id) in ids[start..start + len].iter_mut().enumerate() {
                *id = (vocab + place * self.per_image + j) as u32;
            }
        }
        Ok(ids)
    }

    /// Frees image table places once their prompt is in the KV cache.
    pub fn release(&mut self, places: &[usize]) {
        self.pool.release(places);
    }
}
