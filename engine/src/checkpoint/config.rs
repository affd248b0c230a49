//! The Gemma 3 text model's configuration, read from a Hugging Face `config.json`.
//!
//! Both checkpoint layouts load: text-only checkpoints (`"model_type": "gemma3_text"`, fields at the
//! top level) and multimodal ones (`"model_type": "gemma3"`, text fields under `text_config`, the
//! `vision_config` ignored). Both config dialects load:
//!
//! - published checkpoints: `rope_theta`, `rope_local_base_freq`, `rope_scaling`,
//!   `sliding_window_pattern`;
//! - newer transformers saves: `layer_types` and `rope_parameters` keyed by layer type.
//!
//! The reference is transformers' `Gemma3TextConfig`: a missing field takes its default, and where
//! the two dialects meet, this module resolves them the way transformers 5 does (see
//! [`Gemma3Config::from_json_str`]). Every error names the file and the field.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// The attention kind of one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerType {
    /// Local attention over the last `sliding_window` positions (`"sliding_attention"`).
    Sliding,
    /// Global causal attention over every earlier position (`"full_attention"`).
    Full,
}

impl LayerType {
    /// The name transformers uses in `layer_types` and as a `rope_parameters` key.
    pub fn hf_name(self) -> &'static str {
        match self {
            LayerType::Sliding => "sliding_attention",
            LayerType::Full => "full_attention",
        }
    }
}

/// Rotary position embedding parameters of one layer type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeParams {
    /// The base of the inverse frequencies: `inv_freq[d] = theta^(-2d / head_dim)`.
    pub theta: f32,
    /// Linear scaling: the position is divided by `factor` before rotation; 1.0 means none.
    pub factor: f32,
}

/// The Gemma 3 text model's hyper-parameters, resolved and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma3Config {
    /// Rows of the embedding table (and of the tied output projection).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the gated MLP.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads per layer.
    pub num_attention_heads: usize,
    /// Key/value heads per layer; divides `num_attention_heads`.
    pub num_key_value_heads: usize,
    /// Width of one attention head (not derived from `hidden_size` in Gemma 3).
    pub head_dim: usize,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f32,
    /// Attention scores are scaled by `query_pre_attn_scalar^-0.5`.
    pub query_pre_attn_scalar: f32,
    /// How many positions (the query's own included) a sliding layer sees.
    pub sliding_window: usize,
    /// The attention kind of each layer; `layer_types.len() == num_hidden_layers`.
    pub layer_types: Vec<LayerType>,
    /// RoPE of full-attention (global) layers.
    pub rope_global: RopeParams,
    /// RoPE of sliding (local) layers.
    pub rope_local: RopeParams,
    /// `logits = cap * tanh(logits / cap)` when set (Gemma 2 style; null in Gemma 3).
    pub final_logit_softcapping: Option<f32>,
    /// `scores = cap * tanh(scores / cap)` when set (Gemma 2 style; null in Gemma 3).
    pub attn_logit_softcapping: Option<f32>,
    /// The longest context the model was configured for.
    pub max_position_embeddings: usize,
    /// Beginning-of-sequence token, if the config names one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens (`eos_token_id` may be an int or a list in the file).
    pub eos_token_ids: Vec<u32>,
    /// Padding token, if the config names one.
    pub pad_token_id: Option<u32>,
    /// True for a `"gemma3"` (vision + text) checkpoint whose text model sits under `text_config`.
    pub multimodal: bool,
}

/// Why a `config.json` could not be turned into a [`Gemma3Config`].
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read model config {}: {source}", path.display())]
    Io {
        /// The config file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid JSON.
    #[error("model config {} is not valid JSON (field: whole document): {source}", path.display())]
    Json {
        /// The config file.
        path: PathBuf,
        /// The parser's error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// `model_type` is missing or names a model other than Gemma 3.
    #[error(
        "model config {}: field `model_type` is {found}; expected \"gemma3_text\" or \"gemma3\" \
         (this is another architecture, which tandem does not run)",
        path.display()
    )]
    Architecture {
        /// The config file.
        path: PathBuf,
        /// What the field held, or "missing".
        found: String,
    },
    /// A field holds a JSON value of the wrong type.
    #[error(
        "model config {}: field `{field}` has the wrong type: expected {expected}, found {found}",
        path.display()
    )]
    WrongType {
        /// The config file.
        path: PathBuf,
        /// The field, dotted from the document root (`text_config.hidden_size`).
        field: String,
        /// The JSON type the field must have.
        expected: &'static str,
        /// What the field held.
        found: String,
    },
    /// A field has the right type but a value the model cannot have.
    #[error(
        "model config {}: field `{field}` is invalid: expected {expected}, found {found}",
        path.display()
    )]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// The field, dotted from the document root.
        field: String,
        /// What the value must be.
        expected: String,
        /// What the field held.
        found: String,
    },
    /// The query heads cannot be shared evenly among the key/value heads.
    #[error(
        "model config {}: field `{heads_field}` ({heads}) is not a multiple of field `{kv_field}` \
         ({kv_heads}): heads do not divide; expected num_attention_heads % num_key_value_heads == 0",
        path.display()
    )]
    HeadsDoNotDivide {
        /// The config file.
        path: PathBuf,
        /// The query-heads field, dotted from the document root.
        heads_field: String,
        /// The key/value-heads field, dotted from the document root.
        kv_field: String,
        /// Query heads.
        heads: usize,
        /// Key/value heads.
        kv_heads: usize,
    },
    /// A valid setting the engine does not implement.
    #[error("model config {}: field `{field}` = {found} is not supported: {reason}", path.display())]
    Unsupported {
        /// The config file.
        path: PathBuf,
        /// The field, dotted from the document root.
        field: String,
        /// What the field held.
        found: String,
        /// What is supported instead.
        reason: String,
    },
}

// Gemma3TextConfig's defaults (transformers).
const DEFAULT_VOCAB_SIZE: usize = 262_208;
const DEFAULT_HIDDEN_SIZE: usize = 2304;
const DEFAULT_INTERMEDIATE_SIZE: usize = 9216;
const DEFAULT_NUM_HIDDEN_LAYERS: usize = 26;
const DEFAULT_NUM_ATTENTION_HEADS: usize = 8;
const DEFAULT_NUM_KEY_VALUE_HEADS: usize = 4;
const DEFAULT_HEAD_DIM: usize = 256;
const DEFAULT_RMS_NORM_EPS: f32 = 1e-6;
const DEFAULT_ROPE_THETA: f32 = 1_000_000.0;
const DEFAULT_ROPE_LOCAL_BASE_FREQ: f32 = 10_000.0;
const DEFAULT_QUERY_PRE_ATTN_SCALAR: f32 = 256.0;
const DEFAULT_SLIDING_WINDOW: usize = 4096;
const DEFAULT_SLIDING_WINDOW_PATTERN: usize = 6;
const DEFAULT_MAX_POSITION_EMBEDDINGS: usize = 131_072;
const DEFAULT_PAD_TOKEN_ID: u32 = 0;
const DEFAULT_EOS_TOKEN_ID: u32 = 1;
const DEFAULT_BOS_TOKEN_ID: u32 = 2;
const SUPPORTED_ACTIVATION: &str = "gelu_pytorch_tanh";

impl Gemma3Config {
    /// Reads and resolves a `config.json`.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json_str(&text, path)
    }

    /// Resolves a `config.json` held in memory; `source` is used only in error messages.
    ///
    /// Resolution follows transformers' `Gemma3TextConfig`:
    /// - `layer_types` (if present and not null) decides each layer's kind; otherwise layer `i` is
    ///   full attention when `(i + 1) % sliding_window_pattern == 0`.
    /// - Global RoPE: `rope_parameters.full_attention`, with keys from a non-null `rope_scaling`
    ///   laid over it (transformers 5 does `full_attention.update(rope_scaling)`, and transformers 4
    ///   reads only `rope_scaling`, so both let `rope_scaling` decide the scaling); its theta falls
    ///   back to `rope_theta`, then 1e6.
    /// - Local RoPE: `rope_parameters.sliding_attention`; its theta falls back to
    ///   `rope_local_base_freq`, then 1e4. `rope_scaling` never applies to local layers.
    /// - `rope_parameters` must be keyed by layer type. A flat object is rejected: transformers 5
    ///   ignores flat keys for Gemma 3 (early 5.x releases fail on them), so its meaning is not
    ///   what it appears to say.
    /// - `hidden_act` is ignored, as in transformers (Gemma 3 reads only `hidden_activation`).
    pub fn from_json_str(text: &str, source: &Path) -> Result<Self, ConfigError> {
        let root: Value = serde_json::from_str(text).map_err(|e| ConfigError::Json {
            path: source.to_path_buf(),
            source: e,
        })?;
        let root_obj = match &root {
            Value::Object(map) => map,
            other => {
                return Err(ConfigError::WrongType {
                    path: source.to_path_buf(),
                    field: "(document root)".to_string(),
                    expected: "a JSON object",
                    found: describe(other),
                })
            }
        };
        let top = Section {
            obj: root_obj,
            prefix: "",
            path: source,
        };

        let multimodal = match root_obj.get("model_type") {
            Some(Value::String(s)) if s == "gemma3_text" => false,
            Some(Value::String(s)) if s == "gemma3" => true,
            Some(other) => {
                return Err(ConfigError::Architecture {
                    path: source.to_path_buf(),
                    found: describe(other),
                })
            }
            None => {
                return Err(ConfigError::Architecture {
                    path: source.to_path_buf(),
                    found: "missing".to_string(),
                })
            }
        };

        let empty = Map::new();
        let text_sec = if multimodal {
            match root_obj.get("text_config") {
                // transformers builds a default Gemma3TextConfig when text_config is absent.
                None | Some(Value::Null) => Section {
                    obj: &empty,
                    prefix: "text_config.",
                    path: source,
                },
                Some(Value::Object(map)) => Section {
                    obj: map,
                    prefix: "text_config.",
                    path: source,
                },
                Some(other) => {
                    return Err(top.wrong_type("text_config", "a JSON object", other));
                }
            }
        } else {
            top
        };

        let mut cfg = resolve_text(&text_sec, multimodal)?;

        // Token ids: the text section's own value, else (multimodal) the top level's, else the
        // Gemma3TextConfig default. An explicit null means "none".
        cfg.bos_token_id =
            token_id(&text_sec, &top, multimodal, "bos_token_id")?.unwrap_or(Some(DEFAULT_BOS_TOKEN_ID));
        cfg.pad_token_id =
            token_id(&text_sec, &top, multimodal, "pad_token_id")?.unwrap_or(Some(DEFAULT_PAD_TOKEN_ID));
        cfg.eos_token_ids = match text_sec.eos_ids()? {
            Some(ids) => ids,
            None if multimodal => top.eos_ids()?.unwrap_or_else(|| vec![DEFAULT_EOS_TOKEN_ID]),
            None => vec![DEFAULT_EOS_TOKEN_ID],
        };
        Ok(cfg)
    }

    /// The attention kind of layer `layer`; panics if `layer >= num_hidden_layers`.
    pub fn layer_type(&self, layer: usize) -> LayerType {
        self.layer_types[layer]
    }

    /// The RoPE parameters of a layer kind.
    pub fn rope(&self, kind: LayerType) -> RopeParams {
        match kind {
            LayerType::Sliding => self.rope_local,
            LayerType::Full => self.rope_global,
        }
    }

    /// Query heads that share one key/value head (grouped-query attention).
    pub fn queries_per_kv_head(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }
}

/// The text fields of one JSON object (the root, or `text_config`), with the prefix that dotted
/// field names in errors carry.
#[derive(Clone, Copy)]
struct Section<'a> {
    obj: &'a Map<String, Value>,
    prefix: &'static str,
    path: &'a Path,
}

impl<'a> Section<'a> {
    fn field(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key)
    }

    fn wrong_type(&self, key: &str, expected: &'static str, found: &Value) -> ConfigError {
        ConfigError::WrongType {
            path: self.path.to_path_buf(),
            field: self.field(key),
            expected,
            found: describe(found),
        }
    }

    fn invalid(&self, key: &str, expected: impl Into<String>, found: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_path_buf(),
            field: self.field(key),
            expected: expected.into(),
            found: found.into(),
        }
    }

    fn unsupported(&self, key: &str, found: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError::Unsupported {
            path: self.path.to_path_buf(),
            field: self.field(key),
            found: found.into(),
            reason: reason.into(),
        }
    }

    /// A non-negative integer; missing takes `default`, null is an error.
    fn usize_or(&self, key: &str, default: usize) -> Result<usize, ConfigError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => value_usize(v).ok_or_else(|| self.wrong_type(key, "a non-negative integer", v)),
        }
    }

    /// A positive integer; missing takes `default`.
    fn positive_usize_or(&self, key: &str, default: usize) -> Result<usize, ConfigError> {
        let n = self.usize_or(key, default)?;
        if n == 0 {
            return Err(self.invalid(key, "a positive integer", "0"));
        }
        Ok(n)
    }

    /// A finite number, or None when missing; null is an error.
    fn opt_f32(&self, key: &str) -> Result<Option<f32>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => value_f32(v)
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, "a finite number", v)),
        }
    }

    /// A finite number, or None when missing or null.
    fn nullable_f32(&self, key: &str) -> Result<Option<f32>, ConfigError> {
        match self.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => value_f32(v)
                .map(Some)
                .ok_or_else(|| self.wrong_type(key, "a finite number or null", v)),
        }
    }

    /// A number > 0; missing takes `default`.
    fn positive_f32_or(&self, key: &str, default: f32) -> Result<f32, ConfigError> {
        let x = self.opt_f32(key)?.unwrap_or(default);
        if x <= 0.0 {
            return Err(self.invalid(key, "a number > 0", format!("{x}")));
        }
        Ok(x)
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.wrong_type(key, "a boolean", v)),
        }
    }

    fn opt_str(&self, key: &str) -> Result<Option<&'a str>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.wrong_type(key, "a string", v)),
        }
    }

    /// A token id: `Ok(None)` when missing, `Ok(Some(None))` when null.
    fn token(&self, key: &str) -> Result<Option<Option<u32>>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Null) => Ok(Some(None)),
            Some(v) => value_u32(v)
                .map(|id| Some(Some(id)))
                .ok_or_else(|| self.wrong_type(key, "a token id (integer in 0..2^32) or null", v)),
        }
    }

    /// `eos_token_id`: an int, a list of ints, or null (no ids); None when missing.
    fn eos_ids(&self) -> Result<Option<Vec<u32>>, ConfigError> {
        const KEY: &str = "eos_token_id";
        const EXPECTED: &str = "a token id, a list of token ids, or null";
        match self.get(KEY) {
            None => Ok(None),
            Some(Value::Null) => Ok(Some(Vec::new())),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| value_u32(v).ok_or_else(|| self.wrong_type(KEY, EXPECTED, v)))
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(v) => value_u32(v)
                .map(|id| Some(vec![id]))
                .ok_or_else(|| self.wrong_type(KEY, EXPECTED, v)),
        }
    }
}

fn token_id(
    text: &Section<'_>,
    top: &Section<'_>,
    multimodal: bool,
    key: &str,
) -> Result<Option<Option<u32>>, ConfigError> {
    match text.token(key)? {
        Some(id) => Ok(Some(id)),
        None if multimodal => top.token(key),
        None => Ok(None),
    }
}

fn resolve_text(sec: &Section<'_>, multimodal: bool) -> Result<Gemma3Config, ConfigError> {
    let vocab_size = sec.positive_usize_or("vocab_size", DEFAULT_VOCAB_SIZE)?;
    let hidden_size = sec.positive_usize_or("hidden_size", DEFAULT_HIDDEN_SIZE)?;
    let intermediate_size = sec.positive_usize_or("intermediate_size", DEFAULT_INTERMEDIATE_SIZE)?;
    let num_hidden_layers = sec.positive_usize_or("num_hidden_layers", DEFAULT_NUM_HIDDEN_LAYERS)?;
    let num_attention_heads = sec.positive_usize_or("num_attention_heads", DEFAULT_NUM_ATTENTION_HEADS)?;
    let num_key_value_heads = sec.positive_usize_or("num_key_value_heads", DEFAULT_NUM_KEY_VALUE_HEADS)?;
    if num_attention_heads % num_key_value_heads != 0 {
        return Err(ConfigError::HeadsDoNotDivide {
            path: sec.path.to_path_buf(),
            heads_field: sec.field("num_attention_heads"),
            kv_field: sec.field("num_key_value_heads"),
            heads: num_attention_heads,
            kv_heads: num_key_value_heads,
        });
    }
    let head_dim = sec.positive_usize_or("head_dim", DEFAULT_HEAD_DIM)?;
    if head_dim % 2 != 0 {
        return Err(sec.invalid(
            "head_dim",
            "an even number (RoPE rotates pairs d and d + head_dim/2)",
            head_dim.to_string(),
        ));
    }
    let rms_norm_eps = sec.positive_f32_or("rms_norm_eps", DEFAULT_RMS_NORM_EPS)?;
    let query_pre_attn_scalar =
        sec.positive_f32_or("query_pre_attn_scalar", DEFAULT_QUERY_PRE_ATTN_SCALAR)?;
    let sliding_window = sec.positive_usize_or("sliding_window", DEFAULT_SLIDING_WINDOW)?;
    let max_position_embeddings =
        sec.positive_usize_or("max_position_embeddings", DEFAULT_MAX_POSITION_EMBEDDINGS)?;

    let final_logit_softcapping = positive_or_none(sec, "final_logit_softcapping")?;
    let attn_logit_softcapping = positive_or_none(sec, "attn_logit_softcapping")?;

    if let Some(act) = sec.opt_str("hidden_activation")? {
        if act != SUPPORTED_ACTIVATION {
            return Err(sec.unsupported(
                "hidden_activation",
                format!("{act:?}"),
                format!("the only supported activation is {SUPPORTED_ACTIVATION:?}"),
            ));
        }
    }
    if sec.bool_or("attention_bias", false)? {
        return Err(sec.unsupported(
            "attention_bias",
            "true",
            "Gemma 3 projections have no bias; expected false",
        ));
    }
    match sec.get("use_bidirectional_attention") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) => {
            return Err(sec.unsupported(
                "use_bidirectional_attention",
                "true",
                "only causal (decoder) attention is supported; expected false",
            ))
        }
        Some(v) => return Err(sec.wrong_type("use_bidirectional_attention", "a boolean or null", v)),
    }
    if let Some(p) = sec.opt_f32("partial_rotary_factor")? {
        if p != 1.0 {
            return Err(sec.unsupported(
                "partial_rotary_factor",
                format!("{p}"),
                "only full-width RoPE is supported; expected 1",
            ));
        }
    }

    let layer_types = resolve_layer_types(sec, num_hidden_layers)?;
    let (rope_global, rope_local) = resolve_rope(sec)?;

    Ok(Gemma3Config {
        vocab_size,
        hidden_size,
        intermediate_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        rms_norm_eps,
        query_pre_attn_scalar,
        sliding_window,
        layer_types,
        rope_global,
        rope_local,
        final_logit_softcapping,
        attn_logit_softcapping,
        max_position_embeddings,
        bos_token_id: None,
        eos_token_ids: Vec::new(),
        pad_token_id: None,
        multimodal,
    })
}

fn positive_or_none(sec: &Section<'_>, key: &str) -> Result<Option<f32>, ConfigError> {
    let cap = sec.nullable_f32(key)?;
    if let Some(c) = cap {
        if c <= 0.0 {
            return Err(sec.invalid(key, "a number > 0 or null", format!("{c}")));
        }
    }
    Ok(cap)
}

fn resolve_layer_types(sec: &Section<'_>, layers: usize) -> Result<Vec<LayerType>, ConfigError> {
    match sec.get("layer_types") {
        None | Some(Value::Null) => {
            let pattern = sec.positive_usize_or("sliding_window_pattern", DEFAULT_SLIDING_WINDOW_PATTERN)?;
            Ok((0..layers)
                .map(|i| {
                    if (i + 1) % pattern == 0 {
                        LayerType::Full
                    } else {
                        LayerType::Sliding
                    }
                })
                .collect())
        }
        Some(Value::Array(items)) => {
            if items.len() != layers {
                return Err(sec.invalid(
                    "layer_types",
                    format!(
                        "one entry per layer: {layers} entries (field `{}`)",
                        sec.field("num_hidden_layers")
                    ),
                    format!("{} entries", items.len()),
                ));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) if s == "sliding_attention" => Ok(LayerType::Sliding),
                    Value::String(s) if s == "full_attention" => Ok(LayerType::Full),
                    Value::String(s) => Err(sec.unsupported(
                        &format!("layer_types[{i}]"),
                        format!("{s:?}"),
                        "expected \"sliding_attention\" or \"full_attention\"",
                    )),
                    other => Err(sec.wrong_type(&format!("layer_types[{i}]"), "a string", other)),
                })
                .collect()
        }
        Some(other) => Err(sec.wrong_type("layer_types", "a list of strings or null", other)),
    }
}

/// RoPE settings of one layer type as written in the file, each remembered with its field name.
#[derive(Default)]
struct RopeSpec {
    rope_type: Option<(String, String)>,
    theta: Option<(f32, String)>,
    factor: Option<(f32, String)>,
}

impl RopeSpec {
    /// Reads one RoPE object (`rope_scaling`, `rope_parameters.full_attention`, ...); `key` is its
    /// field name relative to the section.
    fn parse(sec: &Section<'_>, key: &str, value: &Value) -> Result<Self, ConfigError> {
        let obj = match value {
            Value::Object(obj) => obj,
            other => return Err(sec.wrong_type(key, "a JSON object", other)),
        };
        let sub = |k: &str| format!("{key}.{k}");
        let mut spec = RopeSpec::default();
        // "rope_type" wins over the older "type" key, as in transformers.
        for type_key in ["type", "rope_type"] {
            match obj.get(type_key) {
                None => {}
                Some(Value::String(s)) => spec.rope_type = Some((s.clone(), sub(type_key))),
                Some(v) => return Err(sec.wrong_type(&sub(type_key), "a string", v)),
            }
        }
        if let Some(v) = obj.get("rope_theta") {
            let theta =
                value_f32(v).ok_or_else(|| sec.wrong_type(&sub("rope_theta"), "a finite number", v))?;
            spec.theta = Some((theta, sub("rope_theta")));
        }
        match obj.get("factor") {
            None | Some(Value::Null) => {}
            Some(v) => {
                let factor =
                    value_f32(v).ok_or_else(|| sec.wrong_type(&sub("factor"), "a finite number", v))?;
                spec.factor = Some((factor, sub("factor")));
            }
        }
        if let Some(v) = obj.get("partial_rotary_factor") {
            let p = value_f32(v)
                .ok_or_else(|| sec.wrong_type(&sub("partial_rotary_factor"), "a finite number", v))?;
            if p != 1.0 {
                return Err(sec.unsupported(
                    &sub("partial_rotary_factor"),
                    format!("{p}"),
                    "only full-width RoPE is supported; expected 1",
                ));
            }
        }
        Ok(spec)
    }

    /// Lays `over`'s keys on top of this one's (Python's `dict.update`).
    fn update(&mut self, over: RopeSpec) {
        if over.rope_type.is_some() {
            self.rope_type = over.rope_type;
        }
        if over.theta.is_some() {
            self.theta = over.theta;
        }
        if over.factor.is_some() {
            self.factor = over.factor;
        }
    }

    fn resolve(self, sec: &Section<'_>, default_theta: (f32, String)) -> Result<RopeParams, ConfigError> {
        let (theta, theta_field) = self.theta.unwrap_or(default_theta);
        if theta <= 0.0 {
            return Err(sec.invalid(&theta_field, "a RoPE base > 0", format!("{theta}")));
        }
        let factor = match &self.rope_type {
            None => 1.0,
            Some((t, _)) if t == "default" => 1.0,
            Some((t, type_field)) if t == "linear" => match self.factor {
                Some((f, field)) => {
                    if f <= 0.0 {
                        return Err(sec.invalid(&field, "a linear RoPE factor > 0", format!("{f}")));
                    }
                    f
                }
                None => {
                    return Err(sec.invalid(
                        type_field,
                        "a `factor` beside rope_type \"linear\"",
                        "no factor",
                    ))
                }
            },
            Some((t, type_field)) => {
                return Err(sec.unsupported(
                    type_field,
                    format!("{t:?}"),
                    "supported RoPE types are \"default\" and \"linear\"",
                ))
            }
        };
        Ok(RopeParams { theta, factor })
    }
}

fn resolve_rope(sec: &Section<'_>) -> Result<(RopeParams, RopeParams), ConfigError> {
    let rope_theta = sec.opt_f32("rope_theta")?;
    let local_base = sec.opt_f32("rope_local_base_freq")?;

    let mut full = RopeSpec::default();
    let mut sliding = RopeSpec::default();
    match sec.get("rope_parameters") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (key, value) in map {
                let field = format!("rope_parameters.{key}");
                match key.as_str() {
                    "full_attention" => full = RopeSpec::parse(sec, &field, value)?,
                    "sliding_attention" => sliding = RopeSpec::parse(sec, &field, value)?,
                    _ => {
                        return Err(sec.unsupported(
                            &field,
                            describe(value),
                            "rope_parameters must be keyed by layer type (\"full_attention\", \
                             \"sliding_attention\"); transformers 5 ignores a flat rope_parameters \
                             object for Gemma 3, so nest these keys under \"full_attention\"",
                        ))
                    }
                }
            }
        }
        Some(other) => {
            return Err(sec.wrong_type(
                "rope_parameters",
                "a JSON object keyed by layer type, or null",
                other,
            ))
        }
    }
    match sec.get("rope_scaling") {
        None | Some(Value::Null) => {}
        Some(value) => full.update(RopeSpec::parse(sec, "rope_scaling", value)?),
    }

    // Field names are relative to the section; `resolve` adds the `text_config.` prefix.
    let global_default = (rope_theta.unwrap_or(DEFAULT_ROPE_THETA), "rope_theta".to_string());
    let local_default = (
        local_base.unwrap_or(DEFAULT_ROPE_LOCAL_BASE_FREQ),
        "rope_local_base_freq".to_string(),
    );
    let rope_global = full.resolve(sec, global_default)?;
    let rope_local = sliding.resolve(sec, local_default)?;
    Ok((rope_global, rope_local))
}

fn value_usize(v: &Value) -> Option<usize> {
    v.as_u64().and_then(|n| usize::try_from(n).ok())
}

fn value_u32(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

fn value_f32(v: &Value) -> Option<f32> {
    let x = v.as_f64()? as f32;
    x.is_finite().then_some(x)
}

/// A short description of a JSON value for error messages.
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => {
            let mut shown: String = s.chars().take(60).collect();
            if shown.len() < s.len() {
                shown.push('…');
            }
            format!("string {shown:?}")
        }
        Value::Array(a) => format!("a list of {} items", a.len()),
        Value::Object(o) => format!("an object with {} keys", o.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Gemma3Config, ConfigError> {
        Gemma3Config::from_json_str(json, Path::new("/models/test/config.json"))
    }

    fn err(json: &str) -> String {
        match parse(json) {
            Ok(cfg) => panic!("expected an error, got {cfg:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn assert_names(msg: &str, field: &str) {
        assert!(msg.contains("/models/test/config.json"), "no file in: {msg}");
        assert!(
            msg.contains(&format!("`{field}`")),
            "no field `{field}` in: {msg}"
        );
    }

    /// google/gemma-3-1b-it's config.json (published dialect, text only).
    const GEMMA3_1B: &str = r#"{
        "architectures": ["Gemma3ForCausalLM"],
        "attention_bias": false, "attention_dropout": 0.0, "attn_logit_softcapping": null,
        "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": [1, 106],
        "final_logit_softcapping": null, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 1152, "initializer_range": 0.02, "intermediate_size": 6912,
        "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
        "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0,
        "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
        "rope_scaling": null, "rope_theta": 1000000, "sliding_window": 512,
        "sliding_window_pattern": 6, "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
        "use_cache": true, "vocab_size": 262144
    }"#;

    /// google/gemma-3-4b-it's config.json (published dialect, multimodal), trimmed.
    const GEMMA3_4B: &str = r#"{
        "architectures": ["Gemma3ForConditionalGeneration"],
        "boi_token_index": 255999, "eoi_token_index": 256000, "eos_token_id": [1, 106],
        "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
        "model_type": "gemma3",
        "text_config": {
            "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
            "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024
        },
        "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model", "patch_size": 14}
    }"#;

    #[test]
    fn published_text_only_1b() {
        let c = parse(GEMMA3_1B).unwrap();
        assert!(!c.multimodal);
        assert_eq!(c.vocab_size, 262_144);
        assert_eq!(c.hidden_size, 1152);
        assert_eq!(c.intermediate_size, 6912);
        assert_eq!(
            (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
            (4, 1, 256)
        );
        assert_eq!(c.queries_per_kv_head(), 4);
        assert_eq!(c.sliding_window, 512);
        assert_eq!(c.max_position_embeddings, 32768);
        assert_eq!(c.layer_types.len(), 26);
        for (i, t) in c.layer_types.iter().enumerate() {
            let full = (i + 1) % 6 == 0;
            assert_eq!(*t == LayerType::Full, full, "layer {i}");
        }
        assert_eq!(
            c.rope_global,
            RopeParams {
                theta: 1e6,
                factor: 1.0
            }
        );
        assert_eq!(
            c.rope_local,
            RopeParams {
                theta: 1e4,
                factor: 1.0
            }
        );
        assert_eq!(c.rope(c.layer_type(5)), c.rope_global);
        assert_eq!(c.rope(c.layer_type(0)), c.rope_local);
        assert_eq!(c.final_logit_softcapping, None);
        assert_eq!(c.attn_logit_softcapping, None);
        assert_eq!(c.bos_token_id, Some(2));
        assert_eq!(c.eos_token_ids, vec![1, 106]);
        assert_eq!(c.pad_token_id, Some(0));
        assert_eq!(c.rms_norm_eps, 1e-6);
        assert_eq!(c.query_pre_attn_scalar, 256.0);
    }

    #[test]
    fn published_multimodal_4b_nests_text_config() {
        let c = parse(GEMMA3_4B).unwrap();
        assert!(c.multimodal);
        assert_eq!(c.hidden_size, 2560);
        assert_eq!(c.intermediate_size, 10240);
        assert_eq!(c.num_hidden_layers, 34);
        assert_eq!(c.layer_types.len(), 34);
        assert_eq!(c.sliding_window, 1024);
        // Missing text_config fields take Gemma3TextConfig defaults.
        assert_eq!(c.vocab_size, 262_208);
        assert_eq!((c.num_attention_heads, c.num_key_value_heads), (8, 4));
        // Scaling applies to global layers only.
        assert_eq!(
            c.rope_global,
            RopeParams {
                theta: 1e6,
                factor: 8.0
            }
        );
        assert_eq!(
            c.rope_local,
            RopeParams {
                theta: 1e4,
                factor: 1.0
            }
        );
        // eos from the top level when text_config has none.
        assert_eq!(c.eos_token_ids, vec![1, 106]);
        assert_eq!(c.bos_token_id, Some(2));
    }

    #[test]
    fn newer_dialect_layer_types_and_rope_parameters() {
        let c = parse(
            r#"{
            "model_type": "gemma3_text", "num_hidden_layers": 4,
            "layer_types": ["sliding_attention", "full_attention", "full_attention", "sliding_attention"],
            "sliding_window_pattern": 2,
            "rope_theta": 5.0, "rope_local_base_freq": 7.0,
            "rope_scaling": null,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}
            }
        }"#,
        )
        .unwrap();
        // layer_types wins over sliding_window_pattern.
        assert_eq!(
            c.layer_types,
            vec![
                LayerType::Sliding,
                LayerType::Full,
                LayerType::Full,
                LayerType::Sliding
            ]
        );
        // rope_parameters' thetas win over rope_theta / rope_local_base_freq.
        assert_eq!(
            c.rope_global,
            RopeParams {
                theta: 1e6,
                factor: 8.0
            }
        );
        assert_eq!(
            c.rope_local,
            RopeParams {
                theta: 1e4,
                factor: 1.0
            }
        );
    }

    #[test]
    fn rope_parameters_missing_pieces_fall_back_to_published_fields() {
        let c = parse(
            r#"{"model_type": "gemma3_text", "rope_theta": 2e6, "rope_local_base_freq": 2e4,
                "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 4}}}"#,
        )
        .unwrap();
        assert_eq!(
            c.rope_global,
            RopeParams {
                theta: 2e6,
                factor: 4.0
            }
        );
        assert_eq!(
            c.rope_local,
            RopeParams {
                theta: 2e4,
                factor: 1.0
            }
        );
    }

    #[test]
    fn rope_scaling_is_laid_over_rope_parameters_full_attention() {
        // transformers 5: rope_parameters["full_attention"].update(rope_scaling).
        let c = parse(
            r#"{"model_type": "gemma3_text",
                "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 3e6}}}"#,
        )
        .unwrap();
        assert_eq!(
            c.rope_global,
            RopeParams {
                theta: 3e6,
                factor: 8.0
            }
        );
    }

    #[test]
    fn rope_scaling_accepts_type_key_and_default_type() {
        let c = parse(r#"{"model_type": "gemma3_text", "rope_scaling": {"type": "linear", "factor": 2}}"#)
            .unwrap();
        assert_eq!(c.rope_global.factor, 2.0);
        let c =
            parse(r#"{"model_type": "gemma3_text", "rope_scaling": {"rope_type": "default", "factor": 8}}"#)
                .unwrap();
        assert_eq!(c.rope_global.factor, 1.0);
    }

    #[test]
    fn defaults_when_fields_missing() {
        let c = parse(r#"{"model_type": "gemma3_text"}"#).unwrap();
        assert_eq!(c.vocab_size, 262_208);
        assert_eq!(c.hidden_size, 2304);
        assert_eq!(c.intermediate_size, 9216);
        assert_eq!(c.num_hidden_layers, 26);
        assert_eq!(
            (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
            (8, 4, 256)
        );
        assert_eq!(c.rms_norm_eps, 1e-6);
        assert_eq!(c.query_pre_attn_scalar, 256.0);
        assert_eq!(c.sliding_window, 4096);
        assert_eq!(c.max_position_embeddings, 131_072);
        assert_eq!(
            c.rope_global,
            RopeParams {
                theta: 1e6,
                factor: 1.0
            }
        );
        assert_eq!(
            c.rope_local,
            RopeParams {
                theta: 1e4,
                factor: 1.0
            }
        );
        let full: Vec<usize> = (0..26).filter(|&i| c.layer_types[i] == LayerType::Full).collect();
        assert_eq!(full, vec![5, 11, 17, 23]);
        assert_eq!((c.bos_token_id, c.pad_token_id), (Some(2), Some(0)));
        assert_eq!(c.eos_token_ids, vec![1]);
        assert!(!c.multimodal);
    }

    #[test]
    fn multimodal_without_text_config_takes_defaults() {
        let c = parse(r#"{"model_type": "gemma3", "vision_config": {}}"#).unwrap();
        assert!(c.multimodal);
        assert_eq!(c.hidden_size, 2304);
    }

    #[test]
    fn token_ids_int_list_and_null() {
        let c = parse(
            r#"{"model_type": "gemma3_text", "eos_token_id": 106, "bos_token_id": null, "pad_token_id": 7}"#,
        )
        .unwrap();
        assert_eq!(c.eos_token_ids, vec![106]);
        assert_eq!(c.bos_token_id, None);
        assert_eq!(c.pad_token_id, Some(7));
        let c = parse(r#"{"model_type": "gemma3_text", "eos_token_id": null}"#).unwrap();
        assert!(c.eos_token_ids.is_empty());
        // text_config's own value wins over the top level's.
        let c = parse(
            r#"{"model_type": "gemma3", "eos_token_id": [1, 106], "text_config": {"eos_token_id": 5}}"#,
        )
        .unwrap();
        assert_eq!(c.eos_token_ids, vec![5]);
    }

    #[test]
    fn softcapping_is_honoured_when_set() {
        let c = parse(
            r#"{"model_type": "gemma3_text", "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50}"#,
        )
        .unwrap();
        assert_eq!(c.final_logit_softcapping, Some(30.0));
        assert_eq!(c.attn_logit_softcapping, Some(50.0));
    }

    #[test]
    fn hidden_act_is_ignored_like_transformers() {
        let c = parse(r#"{"model_type": "gemma3_text", "hidden_act": "gelu"}"#);
        assert!(c.is_ok());
    }

    #[test]
    fn from_file_reads_and_names_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, GEMMA3_1B).unwrap();
        let c = Gemma3Config::from_file(&path).unwrap();
        assert_eq!(c.hidden_size, 1152);

        let missing = dir.path().join("nope.json");
        let msg = Gemma3Config::from_file(&missing).unwrap_err().to_string();
        assert!(msg.contains(&missing.display().to_string()), "{msg}");
    }

    #[test]
    fn error_other_architecture() {
        let msg = err(r#"{"model_type": "llama", "hidden_size": 64}"#);
        assert_names(&msg, "model_type");
        assert!(
            msg.contains("\"llama\"") && msg.contains("another architecture"),
            "{msg}"
        );
    }

    #[test]
    fn error_missing_model_type() {
        let msg = err(r#"{"hidden_size": 64}"#);
        assert_names(&msg, "model_type");
        assert!(msg.contains("missing"), "{msg}");
    }

    #[test]
    fn error_not_json() {
        let msg = err(r#"{"model_type": "gemma3_text",,}"#);
        assert!(
            msg.contains("/models/test/config.json") && msg.contains("not valid JSON"),
            "{msg}"
        );
    }

    #[test]
    fn error_wrong_json_type() {
        let msg = err(r#"{"model_type": "gemma3_text", "hidden_size": "64"}"#);
        assert_names(&msg, "hidden_size");
        assert!(
            msg.contains("non-negative integer") && msg.contains("\"64\""),
            "{msg}"
        );
        let msg = err(r#"{"model_type": "gemma3_text", "hidden_size": 64.5}"#);
        assert_names(&msg, "hidden_size");
        let msg = err(r#"{"model_type": "gemma3_text", "rms_norm_eps": "tiny"}"#);
        assert_names(&msg, "rms_norm_eps");
        let msg = err(r#"{"model_type": "gemma3_text", "eos_token_id": [1, "x"]}"#);
        assert_names(&msg, "eos_token_id");
    }

    #[test]
    fn error_wrong_type_in_text_config_names_nested_field() {
        let msg = err(r#"{"model_type": "gemma3", "text_config": {"hidden_size": "64"}}"#);
        assert_names(&msg, "text_config.hidden_size");
        let msg = err(r#"{"model_type": "gemma3", "text_config": [1]}"#);
        assert_names(&msg, "text_config");
    }

    #[test]
    fn error_zero_sizes() {
        for field in [
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ] {
            let msg = err(&format!(r#"{{"model_type": "gemma3_text", "{field}": 0}}"#));
            assert_names(&msg, field);
            assert!(msg.contains("positive integer"), "{msg}");
        }
    }

    #[test]
    fn error_heads_do_not_divide() {
        let msg = err(r#"{"model_type": "gemma3_text", "num_attention_heads": 6, "num_key_value_heads": 4}"#);
        assert_names(&msg, "num_attention_heads");
        assert_names(&msg, "num_key_value_heads");
        assert!(msg.contains("heads do not divide"), "{msg}");
    }

    #[test]
    fn error_eps_not_positive() {
        let msg = err(r#"{"model_type": "gemma3_text", "rms_norm_eps": 0}"#);
        assert_names(&msg, "rms_norm_eps");
        let msg = err(r#"{"model_type": "gemma3_text", "rms_norm_eps": -1e-6}"#);
        assert_names(&msg, "rms_norm_eps");
        assert!(msg.contains("> 0"), "{msg}");
    }

    #[test]
    fn error_sliding_window_zero_or_null() {
        let msg = err(r#"{"model_type": "gemma3_text", "sliding_window": 0}"#);
        assert_names(&msg, "sliding_window");
        let msg = err(r#"{"model_type": "gemma3_text", "sliding_window": null}"#);
        assert_names(&msg, "sliding_window");
    }

    #[test]
    fn error_sliding_window_pattern_zero() {
        let msg = err(r#"{"model_type": "gemma3_text", "sliding_window_pattern": 0}"#);
        assert_names(&msg, "sliding_window_pattern");
    }

    #[test]
    fn error_odd_head_dim() {
        let msg = err(r#"{"model_type": "gemma3_text", "head_dim": 255}"#);
        assert_names(&msg, "head_dim");
    }

    #[test]
    fn error_layer_types_length() {
        let msg = err(
            r#"{"model_type": "gemma3", "text_config": {"num_hidden_layers": 3,
                "layer_types": ["sliding_attention", "full_attention"]}}"#,
        );
        assert_names(&msg, "text_config.layer_types");
        assert!(
            msg.contains("3 entries") && msg.contains("found 2 entries"),
            "{msg}"
        );
    }

    #[test]
    fn error_unknown_layer_type() {
        let msg = err(r#"{"model_type": "gemma3_text", "num_hidden_layers": 2,
                "layer_types": ["sliding_attention", "chunked_attention"]}"#);
        assert_names(&msg, "layer_types[1]");
        assert!(msg.contains("chunked_attention"), "{msg}");
    }

    #[test]
    fn error_unsupported_rope_type() {
        let msg = err(r#"{"model_type": "gemma3_text", "rope_scaling": {"rope_type": "yarn", "factor": 8}}"#);
        assert_names(&msg, "rope_scaling.rope_type");
        assert!(msg.contains("\"yarn\""), "{msg}");
        let msg = err(r#"{"model_type": "gemma3", "text_config": {"rope_parameters":
                {"sliding_attention": {"rope_type": "dynamic", "factor": 2}}}}"#);
        assert_names(&msg, "text_config.rope_parameters.sliding_attention.rope_type");
    }

    #[test]
    fn error_linear_rope_without_factor() {
        let msg = err(r#"{"model_type": "gemma3_text", "rope_scaling": {"rope_type": "linear"}}"#);
        assert_names(&msg, "rope_scaling.rope_type");
        assert!(msg.contains("factor"), "{msg}");
    }

    #[test]
    fn error_flat_rope_parameters() {
        let msg = err(r#"{"model_type": "gemma3_text",
                "rope_parameters": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}"#);
        assert!(
            msg.contains("/models/test/config.json") && msg.contains("`rope_parameters."),
            "{msg}"
        );
        assert!(msg.contains("full_attention"), "{msg}");
    }

    #[test]
    fn error_bad_rope_theta() {
        let msg = err(r#"{"model_type": "gemma3_text", "rope_theta": 0}"#);
        assert_names(&msg, "rope_theta");
        let msg = err(r#"{"model_type": "gemma3", "text_config": {"rope_local_base_freq": -5}}"#);
        assert_names(&msg, "text_config.rope_local_base_freq");
        let msg = err(
            r#"{"model_type": "gemma3_text", "rope_parameters": {"full_attention": {"rope_theta": "big"}}}"#,
        );
        assert_names(&msg, "rope_parameters.full_attention.rope_theta");
    }

    #[test]
    fn error_unsupported_activation() {
        let msg = err(r#"{"model_type": "gemma3_text", "hidden_activation": "gelu"}"#);
        assert_names(&msg, "hidden_activation");
        assert!(msg.contains("gelu_pytorch_tanh"), "{msg}");
    }

    #[test]
    fn error_attention_bias() {
        let msg = err(r#"{"model_type": "gemma3_text", "attention_bias": true}"#);
        assert_names(&msg, "attention_bias");
        assert!(msg.contains("not supported"), "{msg}");
    }

    #[test]
    fn error_bidirectional_attention() {
        let msg = err(r#"{"model_type": "gemma3_text", "use_bidirectional_attention": true}"#);
        assert_names(&msg, "use_bidirectional_attention");
    }

    #[test]
    fn error_negative_softcap() {
        let msg = err(r#"{"model_type": "gemma3_text", "final_logit_softcapping": -1}"#);
        assert_names(&msg, "final_logit_softcapping");
    }
}
