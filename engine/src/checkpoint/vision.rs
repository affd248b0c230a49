//! Gemma 3's vision tower (SigLIP) and multimodal projector as checkpoints store them, yielded
//! under canonical names through [`VisionWeights`]:
//! - Hugging Face ([`HfVisionWeights`]): the `vision_config` of a `"gemma3"` `config.json` with
//!   the image-token fields beside it, the tensors under `vision_tower.*` and
//!   `multi_modal_projector.*` (with or without the `model.` prefix and SigLIP's
//!   `vision_model.`);
//! - llama.cpp's mmproj GGUF files ([`MmprojWeights`], `--mmproj`): `clip.vision.*` metadata
//!   and `v.*` / `mm.*` tensors, as its `convert_hf_to_gguf.py --mmproj` writes them for
//!   `clip.projector_type = "gemma3"` (the soft-embedding norm stored as `1 + w`).
//!
//! The reference is transformers' `Gemma3Config` / `SiglipVisionConfig`: a missing field takes
//! its default there. Every error names the file and the field.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tandem_backend_api::TensorDesc;

use super::config::ConfigError;
use super::error::CheckpointError;
use super::gguf::reader::GgufFile;
use super::safetensors::SafetensorsCheckpoint;
use super::source::StoredTensor;

/// The vision tower's and projector's shapes, and the tokens that carry an image in the text.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionConfig {
    /// SigLIP's width (`vision_config.hidden_size`; 1152 in the released models).
    pub hidden: usize,
    /// Its MLP's width (`vision_config.intermediate_size`).
    pub intermediate: usize,
    /// Encoder layers (`vision_config.num_hidden_layers`).
    pub layers: usize,
    /// Attention heads (`vision_config.num_attention_heads`).
    pub heads: usize,
    /// Input image side in pixels (`vision_config.image_size`; 896).
    pub image_size: usize,
    /// Patch side in pixels (`vision_config.patch_size`; 14).
    pub patch_size: usize,
    /// Colour channels (`vision_config.num_channels`; 3).
    pub channels: usize,
    /// The layer norms' epsilon (`vision_config.layer_norm_eps`).
    pub eps: f32,
    /// Soft tokens an image becomes after the average pool (`mm_tokens_per_image`; 256).
    pub tokens_per_image: usize,
    /// The token id standing for each soft token in the text (`image_token_index`).
    pub image_token: u32,
    /// `<start_of_image>` (`boi_token_index`).
    pub boi_token: u32,
    /// `<end_of_image>` (`eoi_token_index`).
    pub eoi_token: u32,
}

impl VisionConfig {
    /// Patches along one side.
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Patches per image: the rows of the tower's step.
    pub fn patches(&self) -> usize {
        self.patches_per_side() * self.patches_per_side()
    }

    /// Soft tokens along one side of the pooled grid.
    pub fn tokens_per_side(&self) -> usize {
        (self.tokens_per_image as f64).sqrt().round() as usize
    }

    /// Values in one patch (channels x patch x patch): the patch embedding's k.
    pub fn patch_values(&self) -> usize {
        self.channels * self.patch_size * self.patch_size
    }

    /// Reads the vision fields of a `config.json` held in memory (`path` for messages);
    /// `Ok(None)` where the model has no vision tower (`model_type` not `"gemma3"`, or no
    /// `vision_config`).
    pub fn from_json_str(text: &str, path: &Path) -> Result<Option<Self>, ConfigError> {
        let doc: Value = serde_json::from_str(text).map_err(|source| ConfigError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        if doc.get("model_type").and_then(Value::as_str) != Some("gemma3") {
            return Ok(None);
        }
        let Some(vision) = doc.get("vision_config").filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        let field = |sec: &Value, prefix: &str, key: &str, default: usize| -> Result<usize, ConfigError> {
            match sec.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v
                    .as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| ConfigError::WrongType {
                        path: path.to_path_buf(),
                        field: format!("{prefix}{key}"),
                        expected: "a non-negative integer",
                        found: v.to_string(),
                    }),
            }
        };
        let v = "vision_config.";
        // SiglipVisionConfig's defaults, then Gemma3Config's.
        let eps = match vision.get("layer_norm_eps") {
            None | Some(Value::Null) => 1e-6,
            Some(x) => x.as_f64().ok_or_else(|| ConfigError::WrongType {
                path: path.to_path_buf(),
                field: "vision_config.layer_norm_eps".into(),
                expected: "a number",
                found: x.to_string(),
            })? as f32,
        };
        let cfg = VisionConfig {
            hidden: field(vision, v, "hidden_size", 768)?,
            intermediate: field(vision, v, "intermediate_size", 3072)?,
            layers: field(vision, v, "num_hidden_layers", 12)?,
            heads: field(vision, v, "num_attention_heads", 12)?,
            image_size: field(vision, v, "image_size", 224)?,
            patch_size: field(vision, v, "patch_size", 16)?,
            channels: field(vision, v, "num_channels", 3)?,
            eps,
            tokens_per_image: field(&doc, "", "mm_tokens_per_image", 256)?,
            image_token: field(&doc, "", "image_token_index", 262_144)? as u32,
            boi_token: field(&doc, "", "boi_token_index", 255_999)? as u32,
            eoi_token: field(&doc, "", "eoi_token_index", 256_000)? as u32,
        };
        cfg.check(path)?;
        Ok(Some(cfg))
    }

    /// Reads [`VisionConfig::from_json_str`] from a file.
    pub fn from_file(path: &Path) -> Result<Option<Self>, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json_str(&text, path)
    }

    fn check(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |field: &str, expected: &str, found: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            field: field.into(),
            expected: expected.into(),
            found,
        };
        for (field, n) in [
            ("vision_config.hidden_size", self.hidden),
            ("vision_config.intermediate_size", self.intermediate),
            ("vision_config.num_hidden_layers", self.layers),
            ("vision_config.num_attention_heads", self.heads),
            ("vision_config.patch_size", self.patch_size),
            ("vision_config.num_channels", self.channels),
            ("mm_tokens_per_image", self.tokens_per_image),
        ] {
            if n == 0 {
                return Err(invalid(field, "at least 1", n.to_string()));
            }
        }
        if !self.hidden.is_multiple_of(self.heads) {
            return Err(invalid(
                "vision_config.num_attention_heads",
                &format!("a divisor of vision_config.hidden_size ({})", self.hidden),
                self.heads.to_string(),
            ));
        }
        if self.image_size == 0 || !self.image_size.is_multiple_of(self.patch_size) {
            return Err(invalid(
                "vision_config.image_size",
                &format!(
                    "a positive multiple of vision_config.patch_size ({})",
                    self.patch_size
                ),
                self.image_size.to_string(),
            ));
        }
        let side = self.tokens_per_side();
        if side * side != self.tokens_per_image || !self.patches_per_side().is_multiple_of(side) {
            return Err(invalid(
                "mm_tokens_per_image",
                &format!(
                    "a square whose side divides the {} patches per side",
                    self.patches_per_side()
                ),
                self.tokens_per_image.to_string(),
            ));
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return Err(invalid(
                "vision_config.layer_norm_eps",
                "finite and >= 0",
                self.eps.to_string(),
            ));
        }
        Ok(())
    }
}

/// A checkpoint's vision tower and projector tensors under canonical names: the tower's
/// relative to SigLIP's `vision_model` (`embeddings.patch_embedding.weight`,
/// `encoder.layers.3.self_attn.q_proj.bias`, `post_layernorm.weight`) and the projector's
/// prefixed `projector.` (`projector.mm_input_projection_weight` `[vision, text]`,
/// `projector.mm_soft_emb_norm.weight`).
pub trait VisionWeights {
    /// The tensor with canonical name `name`, checked to have `shape` (row-major).
    fn tensor(&self, name: &str, shape: &[usize]) -> Result<StoredTensor<'_>, CheckpointError>;
    /// What to add to the stored soft-embedding norm weight (Hugging Face stores `w`: 1; GGUF
    /// `1 + w`: 0).
    fn norm_offset(&self) -> f32;
}

/// Where the tower's tensors live in Hugging Face layouts (the tower's prefix, the projector's).
/// transformers 5's default save writes the tower without SigLIP's `vision_model.`.
const LAYOUTS: [(&str, &str); 4] = [
    ("model.vision_tower.vision_model.", "model.multi_modal_projector."),
    ("vision_tower.vision_model.", "multi_modal_projector."),
    ("model.vision_tower.", "model.multi_modal_projector."),
    ("vision_tower.", "multi_modal_projector."),
];

/// The vision tower's and projector's tensors of a Hugging Face checkpoint.
pub struct HfVisionWeights {
    ckpt: SafetensorsCheckpoint,
    tower: &'static str,
    projector: &'static str,
}

impl HfVisionWeights {
    /// Opens the safetensors files of a model directory, finding where the tower lives.
    pub fn open_dir(dir: &Path) -> Result<Self, CheckpointError> {
        let ckpt = SafetensorsCheckpoint::open_dir(dir)?;
        let probe = "embeddings.patch_embedding.weight";
        let (tower, projector) = LAYOUTS
            .into_iter()
            .find(|(t, _)| ckpt.contains(&format!("{t}{probe}")))
            .ok_or_else(|| CheckpointError::Layout {
                path: dir.to_path_buf(),
                message: format!(
                    "no vision tower: missing tensor {probe} (looked for {})",
                    LAYOUTS.map(|(t, _)| format!("{t}{probe}")).join(", ")
                ),
            })?;
        Ok(HfVisionWeights {
            ckpt,
            tower,
            projector,
        })
    }

    /// The directory or file, for messages.
    pub fn location(&self) -> PathBuf {
        self.ckpt.source().to_path_buf()
    }
}

impl VisionWeights for HfVisionWeights {
    fn norm_offset(&self) -> f32 {
        1.0
    }

    fn tensor(&self, name: &str, shape: &[usize]) -> Result<StoredTensor<'_>, CheckpointError> {
        let full = match name.strip_prefix("projector.") {
            Some(rest) => format!("{}{rest}", self.projector),
            None => format!("{}{name}", self.tower),
        };
        super::hf::stored(&self.ckpt, &full, shape)
    }
}

/// llama.cpp's mmproj GGUF file of a Gemma 3 vision tower.
pub struct MmprojWeights {
    file: GgufFile,
}

/// The GGUF name of canonical tensor `name` in an mmproj file.
fn mmproj_name(name: &str) -> Option<String> {
    let fixed = [
        ("embeddings.patch_embedding.weight", "v.patch_embd.weight"),
        ("embeddings.patch_embedding.bias", "v.patch_embd.bias"),
        ("embeddings.position_embedding.weight", "v.position_embd.weight"),
        ("post_layernorm.weight", "v.post_ln.weight"),
        ("post_layernorm.bias", "v.post_ln.bias"),
        ("projector.mm_soft_emb_norm.weight", "mm.soft_emb_norm.weight"),
        (
            "projector.mm_input_projection_weight",
            "mm.input_projection.weight",
        ),
    ];
    if let Some((_, g)) = fixed.iter().find(|(c, _)| *c == name) {
        return Some((*g).to_string());
    }
    let rest = name.strip_prefix("encoder.layers.")?;
    let (layer, part) = rest.split_once('.')?;
    let (module, kind) = part.rsplit_once('.')?;
    let g = match module {
        "layer_norm1" => "ln1",
        "layer_norm2" => "ln2",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.out_proj" => "attn_out",
        "mlp.fc1" => "ffn_up",
        "mlp.fc2" => "ffn_down",
        _ => return None,
    };
    Some(format!("v.blk.{layer}.{g}.{kind}"))
}

impl MmprojWeights {
    /// Opens an mmproj file and reads its vision configuration. The image-token ids are the
    /// released Gemma 3 vocabulary's (the text model's files give them).
    pub fn open(path: &Path) -> Result<(VisionConfig, Self), CheckpointError> {
        let file = GgufFile::open(path)?;
        let layout = |message: String| CheckpointError::Layout {
            path: path.to_path_buf(),
            message,
        };
        let kind = file.get_str("clip.projector_type")?;
        if kind != "gemma3" {
            return Err(layout(format!(
                "metadata clip.projector_type is \"{kind}\"; a Gemma 3 mmproj file has \"gemma3\""
            )));
        }
        if file.get("clip.has_vision_encoder").is_some() && !file.get_bool("clip.has_vision_encoder")? {
            return Err(layout(
                "metadata clip.has_vision_encoder is false: no vision tower".into(),
            ));
        }
        let u = |key: &str| -> Result<usize, CheckpointError> { Ok(file.get_u32(key)? as usize) };
        let (image_size, patch_size) = (u("clip.vision.image_size")?, u("clip.vision.patch_size")?);
        let scale = u("clip.vision.projector.scale_factor")?;
        if patch_size == 0 || scale == 0 || !(image_size / patch_size.max(1)).is_multiple_of(scale) {
            return Err(layout(format!(
                "metadata clip.vision.projector.scale_factor {scale} does not divide the {} patches per side",
                image_size / patch_size.max(1)
            )));
        }
        let side = image_size / patch_size / scale;
        let cfg = VisionConfig {
            hidden: u("clip.vision.embedding_length")?,
            intermediate: u("clip.vision.feed_forward_length")?,
            layers: u("clip.vision.block_count")?,
            heads: u("clip.vision.attention.head_count")?,
            image_size,
            patch_size,
            channels: 3,
            eps: file.get_f32("clip.vision.attention.layer_norm_epsilon")?,
            tokens_per_image: side * side,
            image_token: 262_144,
            boi_token: 255_999,
            eoi_token: 256_000,
        };
        cfg.check(path)?;
        Ok((cfg, MmprojWeights { file }))
    }

    /// The text model's width the projector maps to (`clip.vision.projection_dim`).
    pub fn projection_dim(&self) -> Result<usize, CheckpointError> {
        Ok(self.file.get_u32("clip.vision.projection_dim")? as usize)
    }
}

impl VisionWeights for MmprojWeights {
    fn norm_offset(&self) -> f32 {
        0.0
    }

    fn tensor(&self, name: &str, shape: &[usize]) -> Result<StoredTensor<'_>, CheckpointError> {
        let path = self.file.path();
        let gname = mmproj_name(name).ok_or_else(|| CheckpointError::Layout {
            path: path.to_path_buf(),
            message: format!("no mmproj name for tensor {name}"),
        })?;
        let t = self.file.tensor(&gname)?;
        if t.desc.shape != shape {
            return Err(CheckpointError::Layout {
                path: path.to_path_buf(),
                message: format!("tensor {gname} has shape {:?}; expected {shape:?}", t.desc.shape),
            });
        }
        Ok(StoredTensor {
            name: gname,
            file: path,
            desc: TensorDesc::new(t.desc.dtype, shape.to_vec()),
            data: t.bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Option<VisionConfig>, ConfigError> {
        VisionConfig::from_json_str(json, Path::new("config.json"))
    }

    #[test]
    fn the_released_shape_and_its_defaults() {
        let c = parse(
            r#"{"model_type": "gemma3", "mm_tokens_per_image": 256,
                "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14}}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (c.patches(), c.tokens_per_side(), c.patch_values()),
            (4096, 16, 588)
        );
        assert_eq!(
            (c.eps, c.image_token, c.boi_token, c.eoi_token),
            (1e-6, 262_144, 255_999, 256_000)
        );
    }

    #[test]
    fn mmproj_names_follow_llama_cpp() {
        assert_eq!(
            mmproj_name("encoder.layers.12.self_attn.out_proj.bias").as_deref(),
            Some("v.blk.12.attn_out.bias")
        );
        assert_eq!(
            mmproj_name("encoder.layers.0.mlp.fc1.weight").as_deref(),
            Some("v.blk.0.ffn_up.weight")
        );
        assert_eq!(mmproj_name("encoder.layers.0.mlp.gate.weight"), None);
        assert_eq!(
            mmproj_name("projector.mm_input_projection_weight").as_deref(),
            Some("mm.input_projection.weight")
        );
    }

    #[test]
    fn an_mmproj_of_another_projector_is_refused_by_name() {
        use crate::checkpoint::gguf::writer::{GgufWriteError, GgufWriter, TensorSink};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mmproj.gguf");
        let mut w = GgufWriter::new();
        w.add_metadata("clip.projector_type", "mlp".to_string()).unwrap();
        w.write_file(&path, |_, _: &mut TensorSink<'_>| Ok::<(), GgufWriteError>(()))
            .unwrap();
        let err = MmprojWeights::open(&path).err().expect("an mlp projector");
        let msg = err.to_string();
        assert!(
            msg.contains("clip.projector_type") && msg.contains("mlp"),
            "{msg}"
        );
    }

    #[test]
    fn text_models_have_none_and_bad_fields_are_named() {
        assert_eq!(parse(r#"{"model_type": "gemma3_text"}"#).unwrap(), None);
        assert_eq!(parse(r#"{"model_type": "gemma3"}"#).unwrap(), None);
        let e = parse(r#"{"model_type": "gemma3", "vision_config": {"patch_size": "14"}}"#).unwrap_err();
        assert!(e.to_string().contains("vision_config.patch_size"), "{e}");
        let e = parse(r#"{"model_type": "gemma3", "vision_config": {"image_size": 30, "patch_size": 14}}"#)
            .unwrap_err();
        assert!(e.to_string().contains("vision_config.image_size"), "{e}");
        let e = parse(
            r#"{"model_type": "gemma3", "mm_tokens_per_image": 5,
                "vision_config": {"image_size": 56, "patch_size": 14}}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("mm_tokens_per_image"), "{e}");
    }
}
