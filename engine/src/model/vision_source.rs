//! Where a model's vision tower is (issue 58): a Hugging Face directory's `vision_config` and
//! `vision_tower.*` weights, or llama.cpp's mmproj GGUF beside a GGUF model; with the image
//! processor settings that go with it.

use std::path::{Path, PathBuf};

use tandem_image_input::PreprocessConfig;

use super::error::ModelError;
use crate::checkpoint::error::CheckpointError;
use crate::checkpoint::vision::{HfVisionWeights, MmprojWeights, VisionConfig, VisionWeights};

/// Where the vision tower's weights are.
#[derive(Debug, Clone)]
enum WeightsAt {
    /// A Hugging Face directory's `vision_tower.*` and `multi_modal_projector.*`.
    Hf(PathBuf),
    /// llama.cpp's mmproj GGUF.
    Mmproj(PathBuf),
}

/// A vision tower found for a model, not loaded: its shapes, its preprocessing and where its
/// weights are.
#[derive(Debug, Clone)]
pub struct VisionSource {
    /// Its shapes and the image tokens.
    pub config: VisionConfig,
    /// How an image becomes its pixel values.
    pub preprocess: PreprocessConfig,
    weights: WeightsAt,
}

impl VisionSource {
    /// The vision tower of the model at `model` (a Hugging Face directory with a
    /// `vision_config`), or the mmproj file `mmproj` where one is given.
    pub fn find(model: &Path, mmproj: Option<&Path>) -> Result<VisionSource, ModelError> {
        if let Some(file) = mmproj {
            let (config, _) = MmprojWeights::open(file)?;
            let preprocess = PreprocessConfig {
                size: config.image_size as u32,
                ..PreprocessConfig::default()
            };
            return Ok(VisionSource {
                config,
                preprocess,
                weights: WeightsAt::Mmproj(file.to_path_buf()),
            });
        }
        let no_tower = || ModelError::Layout {
            path: model.to_path_buf(),
            message: "the model has no vision tower (give --mmproj FILE, llama.cpp's mmproj GGUF for it)"
                .into(),
        };
        if !model.is_dir() {
            return Err(no_tower());
        }
        let config = VisionConfig::from_file(&model.join("config.json"))?.ok_or_else(no_tower)?;
        let preprocess = preprocess_config(model, &config)?;
        Ok(VisionSource {
            config,
            preprocess,
            weights: WeightsAt::Hf(model.to_path_buf()),
        })
    }

    /// Opens its weights.
    pub fn weights(&self) -> Result<Box<dyn VisionWeights>, CheckpointError> {
        Ok(match &self.weights {
            WeightsAt::Hf(dir) => Box::new(HfVisionWeights::open_dir(dir)?),
            WeightsAt::Mmproj(file) => Box::new(MmprojWeights::open(file)?.1),
        })
    }

    /// Where its weights are, for reports: the mmproj file, or the model directory.
    pub fn origin(&self) -> String {
        match &self.weights {
            WeightsAt::Hf(dir) => format!("{} (the model's own tower)", dir.display()),
            WeightsAt::Mmproj(file) => format!("{} (mmproj)", file.display()),
        }
    }

    /// Rows of the model's image table for `images` images held at once.
    pub fn rows(&self, images: usize) -> usize {
        images * self.config.tokens_per_image
    }
}

/// The directory's image processor settings: `preprocessor_config.json`, else the
/// `image_processor` of `processor_config.json`, else Gemma 3's at the tower's size.
fn preprocess_config(dir: &Path, config: &VisionConfig) -> Result<PreprocessConfig, ModelError> {
    let bad = |path: PathBuf| {
        move |e: tandem_image_input::ImageError| ModelError::Layout {
            path,
            message: e.to_string(),
        }
    };
    let flat = dir.join("preprocessor_config.json");
    if let Ok(text) = std::fs::read_to_string(&flat) {
        return PreprocessConfig::from_preprocessor_json(&text).map_err(bad(flat));
    }
    let nested = dir.join("processor_config.json");
    if let Ok(text) = std::fs::read_to_string(&nested) {
        let inner = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("image_processor").map(|p| p.to_string()));
        if let Some(inner) = inner {
            return PreprocessConfig::from_preprocessor_json(&inner).map_err(bad(nested));
        }
    }
    Ok(PreprocessConfig {
        size: config.image_size as u32,
        ..PreprocessConfig::default()
    })
}
