//! The Gemma 3 text model: every weight and KV cache planned under an id of its own (Q|K|V and
//! gate|up fused into one matrix each, caches sized at load), uploaded to the units that read
//! them ([`Gemma3Model::upload`]), and the step graph over those planned ids.

use std::collections::HashMap;

use tandem_backend_api::{
    BackendError, BufferId, ComputeBackend, DType, Graph, GraphBuilder, KvCacheRef, Op, TensorDesc, Usage,
    ValueId, WeightRef,
};

use super::error::ModelError;
use super::step_model::{CacheShape, ImageTable, Part, Region, StepModel};
use crate::checkpoint::config::{Gemma3Config, LayerType};
use crate::checkpoint::source::{StoredTensor, WeightSource};

fn backend_err(context: impl Into<String>) -> impl FnOnce(BackendError) -> ModelError {
    let context = context.into();
    move |error| ModelError::Backend { context, error }
}

/// Bytes of a tensor written to a backend at a time in [`Gemma3Model::upload`].
const UPLOAD_PIECE: usize = 16 << 20;
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

/// The model, planned: what its tensors are and how its step graph reads them.
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
    /// Every tensor the model needs, by the id its graph names.
    tensors: Vec<ModelTensor>,
    /// Weight bytes of the whole model.
    pub weight_bytes: u64,
    /// Added to stored norm weights (1 for Hugging Face checkpoints, 0 for GGUF).
    pub norm_offset: f32,
    /// Rows for images' soft tokens past the vocabulary ([`Gemma3Model::add_image_rows`]).
    images: Option<WeightRef>,
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

/// The first id [`Gemma3Model::plan`] gives out: far above any id a backend issues, so that a
/// planned id is never mistaken for a backend's buffer.
pub const PLANNED_ID_BASE: u64 = 1 << 48;

/// One tensor the model needs on a backend, described before any backend holds it.
#[derive(Debug, Clone)]
pub struct ModelTensor {
    /// Its planned id (what the model's graph names before binding).
    pub id: BufferId,
    /// Shape and storage type.
    pub desc: TensorDesc,
    /// A weight or a KV cache.
    pub usage: Usage,
    /// For a weight: the canonical names and shapes of the stored tensors it concatenates along
    /// rows (one for most, three for a fused Q|K|V); empty for a cache.
    pub parts: Vec<(String, Vec<usize>)>,
    /// For messages: the stored names joined by `|`, or `layer N key cache`.
    pub label: String,
}

impl ModelTensor {
    /// Bytes it occupies.
    pub fn bytes(&self) -> u64 {
        self.desc.byte_size().unwrap_or(0)
    }
}

/// Adds a tensor to `tensors` under the next planned id, and returns the id.
fn push_tensor(
    tensors: &mut Vec<ModelTensor>,
    desc: TensorDesc,
    usage: Usage,
    parts: Vec<(String, Vec<usize>)>,
    label: String,
) -> BufferId {
    let id = BufferId(PLANNED_ID_BASE + tensors.len() as u64);
    tensors.push(ModelTensor {
        id,
        desc,
        usage,
        parts,
        label,
    });
    id
}

struct Planner<'a> {
    source: &'a dyn WeightSource,
    tensors: Vec<ModelTensor>,
}

impl Planner<'_> {
    fn add(
        &mut self,
        desc: TensorDesc,
        usage: Usage,
        parts: Vec<(String, Vec<usize>)>,
        label: String,
    ) -> BufferId {
        push_tensor(&mut self.tensors, desc, usage, parts, label)
    }

    /// Plans the concatenation (along rows) of `names` as one weight when they share a dtype (a
    /// fused projection), else each on its own.
    fn fused(&mut self, names: &[(&str, Vec<usize>)]) -> Result<Vec<WeightRef>, ModelError> {
        let source = self.source;
        let parts: Vec<StoredTensor<'_>> = names
            .iter()
            .map(|(n, s)| source.tensor(n, s))
            .collect::<Result<_, _>>()?;
        let groups: Vec<Vec<usize>> = if parts.iter().any(|p| p.desc.dtype != parts[0].desc.dtype) {
            (0..parts.len()).map(|i| vec![i]).collect()
        } else {
            vec![(0..parts.len()).collect()]
        };
        Ok(groups
            .into_iter()
            .map(|group| {
                let first = &parts[group[0]];
                let mut shape = first.desc.shape.clone();
                shape[0] = group.iter().map(|&i| parts[i].desc.shape[0]).sum();
                let desc = TensorDesc::new(first.desc.dtype, shape);
                let label = group
                    .iter()
                    .map(|&i| parts[i].name.as_str())
                    .collect::<Vec<_>>()
                    .join("|");
                let stored = group
                    .iter()
                    .map(|&i| (names[i].0.to_string(), names[i].1.clone()))
                    .collect();
                let buffer = self.add(desc.clone(), Usage::Weight, stored, label);
                WeightRef { buffer, desc }
            })
            .collect())
    }

    fn single(&mut self, name: &str, shape: Vec<usize>) -> Result<WeightRef, ModelError> {
        let mut refs = self.fused(&[(name, shape)])?;
        refs.pop().ok_or_else(|| ModelError::Layout {
            path: self.source.location().to_path_buf(),
            message: format!("tensor {name}: nothing planned"),
        })
    }
}

impl Gemma3Model {
    /// Bytes of one cached row (one token's keys, or its values, of one layer) in the KV caches'
    /// element type: what a hand-over of cached rows between units copies per token.
    pub fn kv_row_bytes(&self) -> usize {
        self.config.num_key_value_heads * self.config.head_dim * self.cache_shape.dtype.block_bytes()
    }

    /// Describes every weight and KV cache the model needs, with planned ids
    /// ([`PLANNED_ID_BASE`] up) and without touching a backend: what placement binds. The
    /// stored tensors are checked (names, shapes, dtypes) but not read.
    pub fn plan(
        config: Gemma3Config,
        source: &dyn WeightSource,
        cache_shape: CacheShape,
    ) -> Result<Self, ModelError> {
        let c = &config;
        let (h, d, i) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (qd, kvd) = (c.num_attention_heads * d, c.num_key_value_heads * d);
        let mut p = Planner {
            source,
            tensors: Vec::new(),
        };
        let embed = p.single("embed_tokens.weight", vec![c.vocab_size, h])?;
        let final_norm = p.single("norm.weight", vec![h])?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            let n = |s: &str| format!("layers.{l}.{s}");
            let qkv = p.fused(&[
                (&n("self_attn.q_proj.weight"), vec![qd, h]),
                (&n("self_attn.k_proj.weight"), vec![kvd, h]),
                (&n("self_attn.v_proj.weight"), vec![kvd, h]),
            ])?;
            let o = p.single(&n("self_attn.o_proj.weight"), vec![h, qd])?;
            let gate_up = p.fused(&[
                (&n("mlp.gate_proj.weight"), vec![i, h]),
                (&n("mlp.up_proj.weight"), vec![i, h]),
            ])?;
            let down = p.single(&n("mlp.down_proj.weight"), vec![h, i])?;
            let input_norm = p.single(&n("input_layernorm.weight"), vec![h])?;
            let q_norm = p.single(&n("self_attn.q_norm.weight"), vec![d])?;
            let k_norm = p.single(&n("self_attn.k_norm.weight"), vec![d])?;
            let post_attention_norm = p.single(&n("post_attention_layernorm.weight"), vec![h])?;
            let pre_ffn_norm = p.single(&n("pre_feedforward_layernorm.weight"), vec![h])?;
            let post_ffn_norm = p.single(&n("post_feedforward_layernorm.weight"), vec![h])?;
            let capacity = match c.layer_types[l] {
                LayerType::Full => cache_shape.context,
                // A ring of the window, plus room for a whole prefill chunk written at once.
                LayerType::Sliding => cache_shape
                    .context
                    .min(c.sliding_window + cache_shape.max_step_rows.saturating_sub(1)),
            };
            let cdesc = TensorDesc::new(cache_shape.dtype, [cache_shape.slots, capacity, kvd]);
            let k = p.add(
                cdesc.clone(),
                Usage::KvCache,
                Vec::new(),
                format!("layer {l} key cache"),
            );
            let v = p.add(
                cdesc,
                Usage::KvCache,
                Vec::new(),
                format!("layer {l} value cache"),
            );
            let cache = KvCacheRef {
                k,
                v,
                dtype: cache_shape.dtype,
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
        let weight_bytes = p
            .tensors
            .iter()
            .filter(|t| t.usage == Usage::Weight)
            .map(ModelTensor::bytes)
            .sum();
        Ok(Gemma3Model {
            config,
            embed,
            final_norm,
            layers,
            cache_shape,
            tensors: p.tensors,
            weight_bytes,
            norm_offset: source.norm_offset(),
            images: None,
        })
    }

    /// Adds `rows` rows for images' soft tokens (an f32 `[rows, hidden]` table, written by the
    /// host before each image's prompt chunk): token ids `vocab ..< vocab + rows` then embed as
    /// those rows, and the attention of rows holding them sees their whole image (Gemma 3's
    /// bidirectional image mask, `Op::Attention::bidirectional_from`). `rows == 0` does nothing.
    pub fn add_image_rows(&mut self, rows: usize) {
        if rows == 0 || self.images.is_some() {
            return;
        }
        let desc = TensorDesc::new(DType::F32, [rows, self.config.hidden_size]);
        let label = "images' soft tokens".to_string();
        let buffer = push_tensor(&mut self.tensors, desc.clone(), Usage::Weight, Vec::new(), label);
        self.weight_bytes += desc.byte_size().unwrap_or(0);
        self.images = Some(WeightRef { buffer, desc });
    }

    /// The images' table, where [`Gemma3Model::add_image_rows`] added one.
    pub fn image_rows(&self) -> Option<ImageTable> {
        self.images.as_ref().map(|w| ImageTable {
            id: w.buffer,
            rows: w.desc.shape.first().copied().unwrap_or(0),
            width: self.config.hidden_size,
        })
    }

    /// The tensors [`Gemma3Model::plan`] described, by planned id.
    pub fn tensors(&self) -> &[ModelTensor] {
        &self.tensors
    }

    /// Allocates the planned tensors `ids` on `backend` and uploads the weights among them from
    /// `source` (adding their bytes to `done` of `total` for `progress`); returns each planned
    /// id's buffer there. The weights among `host` are allocated as [`Usage::HostWeight`] (read
    /// from host memory: the prefill op offload's). On failure, frees what it allocated.
    #[allow(clippy::too_many_arguments)]
    pub fn upload(
        &self,
        ids: &[BufferId],
        host: &[BufferId],
        source: &dyn WeightSource,
        backend: &mut dyn ComputeBackend,
        done: &mut u64,
        total: u64,
        progress: &mut dyn LoadProgress,
    ) -> Result<HashMap<BufferId, BufferId>, ModelError> {
        let mut map = HashMap::with_capacity(ids.len());
        let result = (|| {
            for t in self.tensors.iter().filter(|t| ids.contains(&t.id)) {
                // Weights this unit reads from host memory (the prefill op offload's).
                let usage = if t.usage == Usage::Weight && host.contains(&t.id) {
                    Usage::HostWeight
                } else {
                    t.usage
                };
                let buffer = backend
                    .alloc(&t.desc, usage)
                    .map_err(backend_err(format!("allocating {}", t.label)))?;
                map.insert(t.id, buffer);
                let mut offset = 0u64;
                for (name, shape) in &t.parts {
                    let stored = source.tensor(name, shape)?;
                    // In pieces, each piece's mapped pages given back once copied: a large
                    // tensor (the embedding) is never held twice.
                    for piece in stored.data.chunks(UPLOAD_PIECE) {
                        backend
                            .write(buffer, offset, piece)
                            .map_err(backend_err(format!("uploading {}", stored.name)))?;
                        source.release(piece);
                        offset += piece.len() as u64;
                    }
                }
                if !t.parts.is_empty() {
                    *done += offset;
                    progress.update(*done, total);
                }
            }
            Ok(())
        })();
        match result {
            Ok(()) => Ok(map),
            Err(e) => {
                for b in map.into_values() {
                    let _ = backend.free(b);
                }
                Err(e)
            }
        }
    }

    /// The step graph for `rows` rows, keeping `selected` rows for the logits, which it writes
    /// to `logits` (`[selected, vocab]` f32).
    pub fn step_graph(&self, rows: usize, selected: usize, logits: BufferId) -> Graph {
        self.step_graph_parts(rows, selected, logits).0
    }

    /// [`Gemma3Model::step_graph`], with the part of the model each node belongs to (what the
    /// placement's preference lists are keyed by) and its region (what layer placement places):
    /// [`StepModel::step_graph_parts`].
    pub fn step_graph_parts(
        &self,
        rows: usize,
        selected: usize,
        logits: BufferId,
    ) -> (Graph, Vec<Part>, Vec<Region>) {
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
        // The part of every node pushed since the last call.
        let mut parts: Vec<Part> = Vec::new();
        let mut mark = |g: &GraphBuilder, part: Part| parts.resize(g.node_count(), part);
        // The region of every node pushed since the last call.
        let mut regions: Vec<Region> = Vec::new();
        let mut region = |g: &GraphBuilder, r: Region| regions.resize(g.node_count(), r);
        let mut h = g.push1(Op::Embed {
            table: self.embed.clone(),
            scale: (c.hidden_size as f32).sqrt(),
            extra: self.images.clone(),
        });
        region(&g, Region::Embedding);
        for (l, w) in self.layers.iter().enumerate() {
            let kind = c.layer_types[l];
            let rope = c.rope(kind);
            let x = norm(&mut g, h, &w.input_norm);
            mark(&g, Part::Other);
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
                // Image rows (ids past the vocabulary) see their whole image.
                bidirectional_from: self.images.as_ref().map(|_| c.vocab_size as u32),
            });
            let o = g.push1(Op::MatMul {
                x: a,
                weight: w.o.clone(),
                splits: vec![c.hidden_size],
            });
            mark(&g, Part::Attention);
            let o = norm(&mut g, o, &w.post_attention_norm);
            h = g.push1(Op::Add { a: h, b: o });
            let x = norm(&mut g, h, &w.pre_ffn_norm);
            mark(&g, Part::Other);
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
            mark(&g, Part::Ffn);
            let f = norm(&mut g, f, &w.post_ffn_norm);
            h = g.push1(Op::Add { a: h, b: f });
            region(&g, Region::Layer(l));
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
        mark(&g, Part::Other);
        region(&g, Region::Head);
        (g.finish(), parts, regions)
    }
}

/// What the split scheduler sees of Gemma 3: [`Gemma3Model::step_graph_parts`] and the
/// vocabulary. Its KV caches are the [`KvCacheRef`]s of the graph's attention nodes (one per
/// layer, [`LayerWeights::cache`]).
impl StepModel for Gemma3Model {
    fn step_graph_parts(
        &self,
        rows: usize,
        selected: usize,
        logits: BufferId,
    ) -> (Graph, Vec<Part>, Vec<Region>) {
        Gemma3Model::step_graph_parts(self, rows, selected, logits)
    }

    fn step_graph(&self, rows: usize, selected: usize, logits: BufferId) -> Graph {
        Gemma3Model::step_graph(self, rows, selected, logits)
    }

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn cache_shape(&self) -> CacheShape {
        self.cache_shape
    }

    fn fresh_rows(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.cache.capacity)
            .min()
            .unwrap_or(usize::MAX)
            .min(self.cache_shape.context)
    }

    fn image_rows(&self) -> Option<ImageTable> {
        Gemma3Model::image_rows(self)
    }

    fn can_rewind(&self, len: usize, by: usize) -> bool {
        // A sliding-window layer's ring holds its window and the rows past it: shortening a
        // sequence by `by` keeps what the next steps read while the ring has `by` rows to spare,
        // or while the sequence never filled the ring (nothing was overwritten yet).
        self.layers.iter().all(|l| {
            l.cache.capacity >= self.cache_shape.context
                || len <= l.cache.capacity
                || l.cache.capacity.saturating_sub(self.config.sliding_window) >= by
        })
    }
}
