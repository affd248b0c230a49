//! The Gemma 3 text model on a backend: weights uploaded once (Q|K|V and gate|up fused into one
//! matrix each), KV caches sized at load, and the step graph built once per shape.

use tandem_backend_api::{
    BackendError, BufferId, ComputeBackend, DType, Graph, GraphBuilder, KvCacheRef, Op, TensorDesc, Usage,
    ValueId, WeightRef,
};

use super::error::ModelError;
use crate::checkpoint::config::{Gemma3Config, LayerType};
use crate::checkpoint::source::{StoredTensor, WeightSource};

fn backend_err(context: impl Into<String>) -> impl FnOnce(BackendError) -> ModelError {
    let context = context.into();
    move |error| ModelError::Backend { context, error }
}

/// One decoder layer's weights on the backend.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    /// `[q + k + v, hidden]` when the three share a dtype, else q, k and v apart.
    pub qkv: Vec<WeightRef>,
    /// `[hidden, heads * head_dim]`.
    pub o: WeightRef,
    /// `[2 * intermediate, hidden]` (gate rows then up rows) when both share a dtype, else apart.
    pub gate_up: Vec<WeightRef>,
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
    /// Added to stored norm weights (1 for Hugging Face checkpoints, 0 for GGUF).
    pub norm_offset: f32,
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
    source: &'a dyn WeightSource,
    backend: &'a mut dyn ComputeBackend,
    buffers: Vec<BufferId>,
    done: u64,
    total: u64,
    progress: &'a mut dyn LoadProgress,
}

impl Uploader<'_> {
    fn alloc(&mut self, desc: &TensorDesc, usage: Usage, what: &str) -> Result<BufferId, ModelError> {
        let id = self
            .backend
            .alloc(desc, usage)
            .map_err(backend_err(format!("allocating {what}")))?;
        self.buffers.push(id);
        Ok(id)
    }

    /// Uploads the concatenation (along rows) of `names` as one weight when they share a
    /// dtype (a fused projection), else each on its own.
    fn upload_fused(&mut self, names: &[(&str, Vec<usize>)]) -> Result<Vec<WeightRef>, ModelError> {
        let source = self.source;
        let parts: Vec<StoredTensor<'_>> = names
            .iter()
            .map(|(n, s)| source.tensor(n, s))
            .collect::<Result<_, _>>()?;
        if parts.iter().any(|p| p.desc.dtype != parts[0].desc.dtype) {
            return parts
                .iter()
                .map(|p| self.upload_parts(std::slice::from_ref(p)))
                .collect();
        }
        Ok(vec![self.upload_parts(&parts)?])
    }

    fn upload(&mut self, name: &str, shape: Vec<usize>) -> Result<WeightRef, ModelError> {
        let t = self.source.tensor(name, &shape)?;
        self.upload_parts(std::slice::from_ref(&t))
    }

    fn upload_parts(&mut self, parts: &[StoredTensor<'_>]) -> Result<WeightRef, ModelError> {
        let mut shape = parts[0].desc.shape.clone();
        shape[0] = parts.iter().map(|p| p.desc.shape[0]).sum();
        let desc = TensorDesc::new(parts[0].desc.dtype, shape);
        let name = parts
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join("|");
        let buffer = self.alloc(&desc, Usage::Weight, &name)?;
        let mut offset = 0u64;
        for p in parts {
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
    /// Uploads the weights of `source` to `backend` and allocates KV caches.
    pub fn load(
        config: Gemma3Config,
        source: &dyn WeightSource,
        backend: &mut dyn ComputeBackend,
        cache_shape: CacheShape,
        progress: &mut dyn LoadProgress,
    ) -> Result<Self, ModelError> {
        let c = &config;
        let (h, d, i) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (qd, kvd) = (c.num_attention_heads * d, c.num_key_value_heads * d);
        let total = source.total_bytes();
        let mut up = Uploader {
            source,
            backend,
            buffers: Vec::new(),
            done: 0,
            total,
            progress,
        };
        let result = (|| {
            let embed = up.upload("embed_tokens.weight", vec![c.vocab_size, h])?;
            let final_norm = up.upload("norm.weight", vec![h])?;
            let mut layers = Vec::with_capacity(c.num_hidden_layers);
            for l in 0..c.num_hidden_layers {
                let n = |s: &str| format!("layers.{l}.{s}");
                let qkv = up.upload_fused(&[
                    (&n("self_attn.q_proj.weight"), vec![qd, h]),
                    (&n("self_attn.k_proj.weight"), vec![kvd, h]),
                    (&n("self_attn.v_proj.weight"), vec![kvd, h]),
                ])?;
                let o = up.upload(&n("self_attn.o_proj.weight"), vec![h, qd])?;
                let gate_up = up.upload_fused(&[
                    (&n("mlp.gate_proj.weight"), vec![i, h]),
                    (&n("mlp.up_proj.weight"), vec![i, h]),
                ])?;
                let down = up.upload(&n("mlp.down_proj.weight"), vec![h, i])?;
                let input_norm = up.upload(&n("input_layernorm.weight"), vec![h])?;
                let q_norm = up.upload(&n("self_attn.q_norm.weight"), vec![d])?;
                let k_norm = up.upload(&n("self_attn.k_norm.weight"), vec![d])?;
                let post_attention_norm = up.upload(&n("post_attention_layernorm.weight"), vec![h])?;
                let pre_ffn_norm = up.upload(&n("pre_feedforward_layernorm.weight"), vec![h])?;
                let post_ffn_norm = up.upload(&n("post_feedforward_layernorm.weight"), vec![h])?;
                let capacity = match c.layer_types[l] {
                    LayerType::Full => cache_shape.context,
                    // A ring of the window, plus room for a whole prefill chunk written at once.
                    LayerType::Sliding => cache_shape
                        .context
                        .min(c.sliding_window + cache_shape.max_step_rows.saturating_sub(1)),
                };
                let cdesc = TensorDesc::new(DType::F32, [cache_shape.slots, capacity, kvd]);
                let k = up.alloc(&cdesc, Usage::KvCache, &format!("layer {l} key cache"))?;
                let v = up.alloc(&cdesc, Usage::KvCache, &format!("layer {l} value cache"))?;
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
                norm_offset: source.norm_offset(),
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
        let offset = self.norm_offset;
        let norm = |g: &mut GraphBuilder, x: ValueId, w: &WeightRef| {
            g.push1(Op::RmsNorm {
                x,
                weight: w.clone(),
                eps,
                weight_offset: offset,
            })
        };
        // One MatMul node over a fused weight, or one per part.
        let project =
            |g: &mut GraphBuilder, x: ValueId, ws: &[WeightRef], widths: &[usize]| -> Vec<ValueId> {
                match ws {
                    [fused] => g.push(Op::MatMul {
                        x,
                        weight: fused.clone(),
                        splits: widths.to_vec(),
                    }),
                    parts => parts
                        .iter()
                        .zip(widths)
                        .map(|(w, n)| {
                            g.push1(Op::MatMul {
                                x,
                                weight: w.clone(),
                                splits: vec![*n],
                            })
                        })
                        .collect(),
                }
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
            let qkv = project(&mut g, x, &w.qkv, &[heads * d, kv_heads * d, kv_heads * d]);
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
                    // A context shorter than the window never reaches it.
                    LayerType::Sliding => Some(c.sliding_window.min(w.cache.capacity)),
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
            let gu = project(&mut g, x, &w.gate_up, &[c.intermediate_size, c.intermediate_size]);
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
