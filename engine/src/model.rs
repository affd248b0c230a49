//! The Gemma 3 text model on a backend: weights uploaded once (Q|K|V and gate|up fused into one
//! matrix each), KV caches sized at load, and the step graph built once per shape.

use std::path::{Path, PathBuf};

use tandem_backend_api::{
    BackendError, BufferId, ComputeBackend, DType, Graph, GraphBuilder, KvCacheRef, Op, TensorDesc, Usage,
    ValueId, WeightRef,
};

use crate::config::{Gemma3Config, LayerType};
use crate::safetensors_ckpt::{CheckpointError, SafetensorsCheckpoint, StDtype, TensorRef};

/// Why a model could not be loaded; every message names the file and the tensor or field.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// config.json is unusable.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The weights are unusable.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The tokenizer files are unusable.
    #[error(transparent)]
    Tokenizer(#[from] crate::tokenizer::TokenizerError),
    /// The directory does not look like a model.
    #[error("{path}: {message}")]
    Layout {
        /// The path.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The backend refused (allocation, upload, compile).
    #[error("{context}: {error}")]
    Backend {
        /// What was being done.
        context: String,
        /// The backend's error.
        error: BackendError,
    },
}

fn backend_err(context: impl Into<String>) -> impl FnOnce(BackendError) -> ModelError {
    let context = context.into();
    move |error| ModelError::Backend { context, error }
}

/// The name prefixes of the text model's tensors in the known layouts.
const PREFIXES: [&str; 3] = ["model.", "model.language_model.", "language_model.model."];

/// One decoder layer's weights on the backend.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// `[q + k + v, hidden]`.
    pub qkv: WeightRef,
    /// `[hidden, heads * head_dim]`.
    pub o: WeightRef,
    /// `[2 * intermediate, hidden]`: gate rows then up rows.
    pub gate_up: WeightRef,
    /// `[hidden, intermediate]`.
    pub down: WeightRef,
    /// Norms, each `[hidden]` except q/k `[head_dim]`.
    pub input_norm: WeightRef,
    /// Query norm.
    pub q_norm: WeightRef,
    /// Key norm.
    pub k_norm: WeightRef,
    /// After attention.
    pub post_attention_norm: WeightRef,
    /// Before the feed-forward network.
    pub pre_ffn_norm: WeightRef,
    /// After the feed-forward network.
    pub post_ffn_norm: WeightRef,
    /// This layer's KV cache.
    pub cache: KvCacheRef,
}

/// How the KV caches are sized.
#[derive(Debug, Clone, Copy)]
pub struct CacheShape {
    /// Sequences held at once.
    pub slots: usize,
    /// Longest sequence (prompt + generated), in tokens.
    pub context: usize,
    /// Most rows one step may hold (prefill chunk).
    pub max_step_rows: usize,
}

/// The model on a backend.
#[derive(Debug)]
pub struct Gemma3Model {
    /// Hyper-parameters.
    pub config: Gemma3Config,
    /// `[vocab, hidden]`, also the tied output projection.
    pub embed: WeightRef,
    /// Final norm.
    pub final_norm: WeightRef,
    /// Decoder layers.
    pub layers: Vec<LayerWeights>,
    /// Cache sizing.
    pub cache_shape: CacheShape,
    /// Every buffer allocated (freed by `free`).
    buffers: Vec<BufferId>,
    /// Weight bytes uploaded.
    pub weight_bytes: u64,
}

fn api_dtype(d: StDtype) -> DType {
    match d {
        StDtype::F32 => DType::F32,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::Bf16,
    }
}

/// Progress of a load, in bytes.
pub trait LoadProgress {
    /// `done` of `total` bytes uploaded.
    fn update(&mut self, done: u64, total: u64);
}

impl<F: FnMut(u64, u64)> LoadProgress for F {
    fn update(&mut self, done: u64, total: u64) {
        self(done, total)
    }
}

struct Uploader<'a> {
    ckpt: &'a SafetensorsCheckpoint,
    backend: &'a mut dyn ComputeBackend,
    prefix: &'static str,
    buffers: Vec<BufferId>,
    done: u64,
    total: u64,
    progress: &'a mut dyn LoadProgress,
}

impl<'a> Uploader<'a> {
    fn tensor(&self, name: &str, shape: &[usize]) -> Result<TensorRef<'a>, ModelError> {
        let ckpt: &'a SafetensorsCheckpoint = self.ckpt;
        Ok(ckpt.get_with_shape(&format!("{}{name}", self.prefix), shape)?)
    }

    /// Uploads the concatenation (along rows) of `names`, which must share a dtype.
    fn upload(&mut self, names: &[(&str, Vec<usize>)]) -> Result<WeightRef, ModelError> {
        let parts: Vec<TensorRef<'a>> = names
            .iter()
            .map(|(n, s)| self.tensor(n, s))
            .collect::<Result<_, _>>()?;
        let dtype = parts[0].dtype;
        if let Some(odd) = parts.iter().find(|p| p.dtype != dtype) {
            return Err(ModelError::Layout {
                path: odd.file.to_path_buf(),
                message: format!(
                    "tensor {} is {}, but {} is {}: fused tensors must share a dtype",
                    odd.name, odd.dtype, parts[0].name, dtype
                ),
            });
        }
        let mut shape = parts[0].shape.to_vec();
        shape[0] = parts.iter().map(|p| p.shape[0]).sum();
        let desc = TensorDesc::new(api_dtype(dtype), shape);
        let name = parts.iter().map(|p| p.name).collect::<Vec<_>>().join("|");
        let buffer = self
            .backend
            .alloc(&desc, Usage::Weight)
            .map_err(backend_err(format!("allocating {name}")))?;
        self.buffers.push(buffer);
        let mut offset = 0u64;
        for p in &parts {
            self.backend
                .write(buffer, offset, p.data)
                .map_err(backend_err(format!("uploading {}", p.name)))?;
            offset += p.data.len() as u64;
        }
        self.done += offset;
        self.progress.update(self.done, self.total);
        Ok(WeightRef { buffer, desc })
    }
}

impl Gemma3Model {
    /// Finds the tensor-name prefix of the text model in a checkpoint.
    fn prefix(ckpt: &SafetensorsCheckpoint) -> Result<&'static str, ModelError> {
        PREFIXES
            .into_iter()
            .find(|p| ckpt.contains(&format!("{p}embed_tokens.weight")))
            .ok_or_else(|| ModelError::Layout {
                path: ckpt.source().to_path_buf(),
                message: format!(
                    "missing tensor embed_tokens.weight (looked for {})",
                    PREFIXES.map(|p| format!("{p}embed_tokens.weight")).join(", ")
                ),
            })
    }

    /// Uploads the weights of `ckpt` to `backend` and allocates KV caches.
    pub fn load(
        config: Gemma3Config,
        ckpt: &SafetensorsCheckpoint,
        backend: &mut dyn ComputeBackend,
        cache_shape: CacheShape,
        progress: &mut dyn LoadProgress,
    ) -> Result<Self, ModelError> {
        let prefix = Self::prefix(ckpt)?;
        let c = &config;
        let (h, d, i) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (qd, kvd) = (c.num_attention_heads * d, c.num_key_value_heads * d);
        let total = ckpt.total_bytes();
        let mut up = Uploader {
            ckpt,
            backend,
            prefix,
            buffers: Vec::new(),
            done: 0,
            total,
            progress,
        };
        let result = (|| {
            let embed = up.upload(&[("embed_tokens.weight", vec![c.vocab_size, h])])?;
            let final_norm = up.upload(&[("norm.weight", vec![h])])?;
            let mut layers = Vec::with_capacity(c.num_hidden_layers);
            for l in 0..c.num_hidden_layers {
                let n = |s: &str| format!("layers.{l}.{s}");
                let qkv = up.upload(&[
                    (&n("self_attn.q_proj.weight"), vec![qd, h]),
                    (&n("self_attn.k_proj.weight"), vec![kvd, h]),
                    (&n("self_attn.v_proj.weight"), vec![kvd, h]),
                ])?;
                let o = up.upload(&[(&n("self_attn.o_proj.weight"), vec![h, qd])])?;
                let gate_up = up.upload(&[
                    (&n("mlp.gate_proj.weight"), vec![i, h]),
                    (&n("mlp.up_proj.weight"), vec![i, h]),
                ])?;
                let down = up.upload(&[(&n("mlp.down_proj.weight"), vec![h, i])])?;
                let input_norm = up.upload(&[(&n("input_layernorm.weight"), vec![h])])?;
                let q_norm = up.upload(&[(&n("self_attn.q_norm.weight"), vec![d])])?;
                let k_norm = up.upload(&[(&n("self_attn.k_norm.weight"), vec![d])])?;
                let post_attention_norm = up.upload(&[(&n("post_attention_layernorm.weight"), vec![h])])?;
                let pre_ffn_norm = up.upload(&[(&n("pre_feedforward_layernorm.weight"), vec![h])])?;
                let post_ffn_norm = up.upload(&[(&n("post_feedforward_layernorm.weight"), vec![h])])?;
                let capacity = match c.layer_types[l] {
                    LayerType::Full => cache_shape.context,
                    // A ring of the window, plus room for a whole prefill chunk written at once.
                    LayerType::Sliding => cache_shape
                        .context
                        .min(c.sliding_window + cache_shape.max_step_rows.saturating_sub(1)),
                };
                let cdesc = TensorDesc::new(DType::F32, [cache_shape.slots, capacity, kvd]);
                let k = up
                    .backend
                    .alloc(&cdesc, Usage::KvCache)
                    .map_err(backend_err(format!("layer {l} key cache")))?;
                up.buffers.push(k);
                let v = up
                    .backend
                    .alloc(&cdesc, Usage::KvCache)
                    .map_err(backend_err(format!("layer {l} value cache")))?;
                up.buffers.push(v);
                let cache = KvCacheRef {
                    k,
                    v,
                    dtype: DType::F32,
                    slots: cache_shape.slots,
                    capacity,
                };
                layers.push(LayerWeights {
                    qkv,
                    o,
                    gate_up,
                    down,
                    input_norm,
                    q_norm,
                    k_norm,
                    post_attention_norm,
                    pre_ffn_norm,
                    post_ffn_norm,
                    cache,
                });
            }
            Ok((embed, final_norm, layers))
        })();
        let weight_bytes = up.done;
        let buffers = std::mem::take(&mut up.buffers);
        match result {
            Ok((embed, final_norm, layers)) => Ok(Gemma3Model {
                config,
                embed,
                final_norm,
                layers,
                cache_shape,
                buffers,
                weight_bytes,
            }),
            Err(e) => {
                for b in buffers {
                    let _ = up.backend.free(b);
                }
                Err(e)
            }
        }
    }

    /// Frees every buffer (programs using them must be released first).
    pub fn free(self, backend: &mut dyn ComputeBackend) -> Result<(), BackendError> {
        for b in self.buffers {
            backend.free(b)?;
        }
        Ok(())
    }

    /// The step graph for `rows` rows, keeping `selected` rows for the logits, which it writes
    /// to `logits` (`[selected, vocab]` f32).
    pub fn step_graph(&self, rows: usize, selected: usize, logits: BufferId) -> Graph {
        let c = &self.config;
        let (heads, kv_heads, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let eps = c.rms_norm_eps;
        let norm = |g: &mut GraphBuilder, x: ValueId, w: &WeightRef| {
            g.push1(Op::RmsNorm {
                x,
                weight: w.clone(),
                eps,
                weight_offset: 1.0,
            })
        };
        let mut g = GraphBuilder::new(format!("gemma3 rows={rows} selected={selected}"), rows, selected);
        let mut h = g.push1(Op::Embed {
            table: self.embed.clone(),
            scale: (c.hidden_size as f32).sqrt(),
        });
        for (l, w) in self.layers.iter().enumerate() {
            let kind = c.layer_types[l];
            let rope = c.rope(kind);
            let x = norm(&mut g, h, &w.input_norm);
            let qkv = g.push(Op::MatMul {
                x,
                weight: w.qkv.clone(),
                splits: vec![heads * d, kv_heads * d, kv_heads * d],
            });
            let q = norm(&mut g, qkv[0], &w.q_norm);
            let k = norm(&mut g, qkv[1], &w.k_norm);
            let q = g.push1(Op::Rope {
                x: q,
                head_dim: d,
                theta: rope.theta,
                factor: rope.factor,
            });
            let k = g.push1(Op::Rope {
                x: k,
                head_dim: d,
                theta: rope.theta,
                factor: rope.factor,
            });
            let a = g.push1(Op::Attention {
                q,
                k,
                v: qkv[2],
                cache: w.cache.clone(),
                heads,
                kv_heads,
                head_dim: d,
                scale: c.query_pre_attn_scalar.powf(-0.5),
                window: match kind {
                    LayerType::Sliding => Some(c.sliding_window),
                    LayerType::Full => None,
                },
                // transformers' Gemma 3 attention does not apply `attn_logit_softcapping`.
                softcap: None,
            });
            let o = g.push1(Op::MatMul {
                x: a,
                weight: w.o.clone(),
                splits: vec![c.hidden_size],
            });
            let o = norm(&mut g, o, &w.post_attention_norm);
            h = g.push1(Op::Add { a: h, b: o });
            let x = norm(&mut g, h, &w.pre_ffn_norm);
            let gu = g.push(Op::MatMul {
                x,
                weight: w.gate_up.clone(),
                splits: vec![c.intermediate_size, c.intermediate_size],
            });
            let m = g.push1(Op::GeGlu {
                gate: gu[0],
                up: gu[1],
            });
            let f = g.push1(Op::MatMul {
                x: m,
                weight: w.down.clone(),
                splits: vec![c.hidden_size],
            });
            let f = norm(&mut g, f, &w.post_ffn_norm);
            h = g.push1(Op::Add { a: h, b: f });
        }
        let hs = g.push1(Op::SelectRows { x: h });
        let hn = norm(&mut g, hs, &self.final_norm);
        let mut logits_v = g.push1(Op::MatMul {
            x: hn,
            weight: self.embed.clone(),
            splits: vec![c.vocab_size],
        });
        if let Some(cap) = c.final_logit_softcapping {
            logits_v = g.push1(Op::Softcap { x: logits_v, cap });
        }
        g.push(Op::Output {
            x: logits_v,
            buffer: logits,
        });
        g.finish()
    }
}

/// Opens a Hugging Face model directory's config and weights.
pub fn open_hf_dir(dir: &Path) -> Result<(Gemma3Config, SafetensorsCheckpoint), ModelError> {
    if !dir.is_dir() {
        return Err(ModelError::Layout {
            path: dir.to_path_buf(),
            message: "not a model directory".into(),
        });
    }
    let config = Gemma3Config::from_file(&dir.join("config.json"))?;
    let ckpt = SafetensorsCheckpoint::open_dir(dir)?;
    Ok((config, ckpt))
}
