//! Gemma 3's vision tower (SigLIP) and multimodal projector on one backend: an image's
//! `pixel_values` to the soft tokens the language model reads in place of its image tokens.
//!
//! As transformers' `Gemma3ForConditionalGeneration.get_image_features` computes them:
//! 1. **Patches** (host): the `C x S x S` pixels cut into `(S / P)^2` patches of `C x P x P`
//!    values in the convolution weight's order (channel, row, column), patches row by row.
//! 2. **The tower** (one graph, a row per patch): the patch embedding (`MatMul` + `Bias`, the
//!    convolution as a product), the position embedding (`Embed` of the patch index, `Add`),
//!    then per layer `x += out(attn(ln1(x)))`, `x += fc2(gelu(fc1(ln2(x))))` with
//!    bidirectional attention over the image's patches (`BlockAttention`), and the final
//!    `post_layernorm`.
//! 3. **The average pool** (host): the `(S / P)^2` patch grid to `tokens_per_image` tokens,
//!    each the mean of a square of patches, tokens row by row.
//! 4. **The projector** (one graph, a row per soft token): Gemma's RMSNorm (`1 + w`) and the
//!    projection to the language model's width (`mm_input_projection_weight`, stored
//!    `[vision, text]` and multiplied as `x @ W`, so uploaded transposed).
//!
//! The ops are the backend trait's; which unit runs them is the caller's choice (the GPU
//! backends have no kernels for the vision ops yet, so the CPU backend runs it today).

use tandem_backend_api::{
    BufferId, ComputeBackend, DType, Graph, GraphBuilder, NodeTime, Op, ProgramId, StepArgs, Support,
    TensorDesc, Usage, ValueId, WeightRef,
};

use super::error::ModelError;
use crate::checkpoint::source::StoredTensor;
use crate::checkpoint::vision::{VisionConfig, VisionWeights};

/// What one image gives: the tower's last hidden state and the projected soft tokens.
#[derive(Debug, Clone)]
pub struct ImageEncoding {
    /// `[patches, vision hidden]`, after `post_layernorm`.
    pub hidden: Vec<f32>,
    /// `[tokens_per_image, text hidden]`: what the language model reads.
    pub tokens: Vec<f32>,
}

/// The tower and projector, uploaded and compiled on one backend.
pub struct VisionTower {
    cfg: VisionConfig,
    text_hidden: usize,
    patches_in: BufferId,
    hidden_out: BufferId,
    tower: ProgramId,
    pooled_in: BufferId,
    tokens_out: BufferId,
    projector: ProgramId,
    buffers: Vec<BufferId>,
}

/// The tower's and projector's graphs with their input and output buffers.
struct Built {
    tower: Graph,
    projector: Graph,
    patches_in: BufferId,
    hidden_out: BufferId,
    pooled_in: BufferId,
    tokens_out: BufferId,
}

/// What [`VisionTower::check`] finds for one unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TowerCheck {
    /// Bytes of the tower's and projector's weights as the unit would hold them.
    pub weight_bytes: u64,
    /// Each reason the unit gives, after the op names it refuses for it (`layer_norm(f32),
    /// gelu: ...`); empty where it runs them all.
    pub refused: Vec<String>,
}

/// The backend's error as a [`ModelError`], saying what was being done.
fn backend(context: impl Into<String>) -> impl FnOnce(tandem_backend_api::BackendError) -> ModelError {
    let context = context.into();
    move |error| ModelError::Backend { context, error }
}

impl VisionTower {
    /// Uploads the tower's and projector's weights from `weights` to `unit` and compiles both
    /// graphs. `text_hidden` is the language model's width.
    pub fn load(
        unit: &mut dyn ComputeBackend,
        cfg: &VisionConfig,
        text_hidden: usize,
        weights: &dyn VisionWeights,
    ) -> Result<Self, ModelError> {
        let mut up = Uploader {
            unit: Some(&mut *unit),
            buffers: Vec::new(),
            weight_bytes: 0,
        };
        let built = Self::build(&mut up, cfg, text_hidden, weights)?;
        let buffers = up.buffers;
        let tower = unit
            .compile(&built.tower)
            .map_err(backend("compiling the vision tower"))?;
        let projector = unit
            .compile(&built.projector)
            .map_err(backend("compiling the multimodal projector"))?;
        Ok(VisionTower {
            cfg: cfg.clone(),
            text_hidden,
            patches_in: built.patches_in,
            hidden_out: built.hidden_out,
            tower,
            pooled_in: built.pooled_in,
            tokens_out: built.tokens_out,
            projector,
            buffers,
        })
    }

    /// Whether `unit` runs every op of the tower and projector that `weights` describe, without
    /// uploading or compiling anything: their weights' bytes, and each op kind the unit refuses
    /// with its reason (empty: it runs them all). What `engine placement` reports.
    pub fn check(
        unit: &dyn ComputeBackend,
        cfg: &VisionConfig,
        text_hidden: usize,
        weights: &dyn VisionWeights,
    ) -> Result<TowerCheck, ModelError> {
        let mut up = Uploader {
            unit: None,
            buffers: Vec::new(),
            weight_bytes: 0,
        };
        let built = Self::build(&mut up, cfg, text_hidden, weights)?;
        // Each reason once, with the op names it refuses.
        let mut refused: Vec<(String, Vec<String>)> = Vec::new();
        for node in built.tower.nodes.iter().chain(&built.projector.nodes) {
            if let Support::No { reason } = unit.supports(&node.op) {
                let op = node.op.name();
                match refused.iter_mut().find(|(r, _)| *r == reason) {
                    Some((_, ops)) if !ops.contains(&op) => ops.push(op),
                    Some(_) => {}
                    None => refused.push((reason, vec![op])),
                }
            }
        }
        Ok(TowerCheck {
            weight_bytes: up.weight_bytes,
            refused: refused
                .into_iter()
                .map(|(reason, ops)| format!("{}: {reason}", ops.join(", ")))
                .collect(),
        })
    }

    /// The tower's and projector's graphs over the weights `up` takes from `weights`.
    fn build(
        up: &mut Uploader<'_>,
        cfg: &VisionConfig,
        text_hidden: usize,
        weights: &dyn VisionWeights,
    ) -> Result<Built, ModelError> {
        let (h, patches) = (cfg.hidden, cfg.patches());
        // The tower.
        let mut g = GraphBuilder::new("vision tower", patches, 0);
        let patches_in = up.activation([patches, cfg.patch_values()])?;
        let x = g.push1(Op::Input {
            buffer: patches_in,
            cols: cfg.patch_values(),
            selected: false,
        });
        let conv = weights.tensor(
            "embeddings.patch_embedding.weight",
            &[h, cfg.channels, cfg.patch_size, cfg.patch_size],
        )?;
        let conv = up.weight_as(&conv, &[h, cfg.patch_values()])?;
        let x = g.push1(Op::MatMul {
            x,
            weight: conv,
            splits: vec![h],
        });
        let x = bias(&mut g, up, weights, x, "embeddings.patch_embedding.bias", h)?;
        let pos = up.weight(&weights.tensor("embeddings.position_embedding.weight", &[patches, h])?)?;
        let pos = g.push1(Op::Embed {
            table: pos,
            scale: 1.0,
            extra: None,
        });
        let mut x = g.push1(Op::Add { a: x, b: pos });
        let head_dim = h / cfg.heads;
        for l in 0..cfg.layers {
            let p = format!("encoder.layers.{l}.");
            let n = layer_norm(&mut g, up, weights, x, &format!("{p}layer_norm1"), h, cfg.eps)?;
            let mut qkv = [n; 3];
            for (v, name) in qkv.iter_mut().zip(["q_proj", "k_proj", "v_proj"]) {
                *v = linear(&mut g, up, weights, n, &format!("{p}self_attn.{name}"), h, h)?;
            }
            let a = g.push1(Op::BlockAttention {
                q: qkv[0],
                k: qkv[1],
                v: qkv[2],
                heads: cfg.heads,
                head_dim,
                scale: (head_dim as f32).powf(-0.5),
                block: patches,
            });
            let a = linear(&mut g, up, weights, a, &format!("{p}self_attn.out_proj"), h, h)?;
            x = g.push1(Op::Add { a: x, b: a });
            let n = layer_norm(&mut g, up, weights, x, &format!("{p}layer_norm2"), h, cfg.eps)?;
            let m = linear(
                &mut g,
                up,
                weights,
                n,
                &format!("{p}mlp.fc1"),
                cfg.intermediate,
                h,
            )?;
            let m = g.push1(Op::Gelu { x: m });
            let m = linear(
                &mut g,
                up,
                weights,
                m,
                &format!("{p}mlp.fc2"),
                h,
                cfg.intermediate,
            )?;
            x = g.push1(Op::Add { a: x, b: m });
        }
        let x = layer_norm(&mut g, up, weights, x, "post_layernorm", h, cfg.eps)?;
        let hidden_out = up.activation([patches, h])?;
        g.push(Op::Output {
            x,
            buffer: hidden_out,
        });
        let tower = g.finish();
        // The projector.
        let tokens = cfg.tokens_per_image;
        let mut g = GraphBuilder::new("multimodal projector", tokens, 0);
        let pooled_in = up.activation([tokens, h])?;
        let x = g.push1(Op::Input {
            buffer: pooled_in,
            cols: h,
            selected: false,
        });
        let norm = up.weight(&weights.tensor("projector.mm_soft_emb_norm.weight", &[h])?)?;
        let x = g.push1(Op::RmsNorm {
            x,
            weight: norm,
            eps: cfg.eps,
            weight_offset: weights.norm_offset(),
        });
        let proj = weights.tensor("projector.mm_input_projection_weight", &[h, text_hidden])?;
        let proj = up.transposed(&proj)?;
        let y = g.push1(Op::MatMul {
            x,
            weight: proj,
            splits: vec![text_hidden],
        });
        let tokens_out = up.activation([tokens, text_hidden])?;
        g.push(Op::Output {
            x: y,
            buffer: tokens_out,
        });
        Ok(Built {
            tower,
            projector: g.finish(),
            patches_in,
            hidden_out,
            pooled_in,
            tokens_out,
        })
    }

    /// The configuration it was loaded with.
    pub fn config(&self) -> &VisionConfig {
        &self.cfg
    }

    /// Encodes one image's `pixel_values` (`C x S x S`, as `tandem_image_input::preprocess`
    /// gives them) on `unit`, the backend it was loaded on.
    pub fn encode(
        &mut self,
        unit: &mut dyn ComputeBackend,
        pixels: &[f32],
    ) -> Result<ImageEncoding, ModelError> {
        let cfg = &self.cfg;
        let want = cfg.channels * cfg.image_size * cfg.image_size;
        if pixels.len() != want {
            return Err(ModelError::Layout {
                path: "image".into(),
                message: format!(
                    "{} pixel values; the vision tower takes {} x {} x {} = {want}",
                    pixels.len(),
                    cfg.channels,
                    cfg.image_size,
                    cfg.image_size
                ),
            });
        }
        let rows = patchify(cfg, pixels);
        let hidden = run(
            unit,
            self.tower,
            self.patches_in,
            &rows,
            cfg.patches(),
            self.hidden_out,
            cfg.hidden,
            "the vision tower",
        )?;
        let pooled = pool(cfg, &hidden);
        let tokens = run(
            unit,
            self.projector,
            self.pooled_in,
            &pooled,
            cfg.tokens_per_image,
            self.tokens_out,
            self.text_hidden,
            "the multimodal projector",
        )?;
        Ok(ImageEncoding { hidden, tokens })
    }

    /// Per-node device time of the last encoding, the tower's nodes then the projector's, where
    /// `unit` measures it (its `profile` option).
    pub fn profile(&self, unit: &mut dyn ComputeBackend) -> Result<Vec<NodeTime>, ModelError> {
        let mut out = unit
            .profile(self.tower)
            .map_err(backend("reading the vision tower's profile"))?;
        out.extend(
            unit.profile(self.projector)
                .map_err(backend("reading the projector's profile"))?,
        );
        Ok(out)
    }

    /// Frees its programs and buffers on `unit`.
    pub fn free(self, unit: &mut dyn ComputeBackend) -> Result<(), ModelError> {
        for p in [self.tower, self.projector] {
            unit.release(p)
                .map_err(backend("releasing the vision programs"))?;
        }
        for b in self.buffers {
            unit.free(b).map_err(backend("freeing the vision buffers"))?;
        }
        Ok(())
    }
}

/// Writes `input` to `into`, runs `program` over its `rows` rows (each row's token id and
/// position its index, as the position embedding reads them) and reads back `width` values a
/// row from `out`.
#[allow(clippy::too_many_arguments)]
fn run(
    unit: &mut dyn ComputeBackend,
    program: ProgramId,
    into: BufferId,
    input: &[f32],
    rows: usize,
    out: BufferId,
    width: usize,
    what: &str,
) -> Result<Vec<f32>, ModelError> {
    unit.write(into, 0, bytemuck::cast_slice(input))
        .map_err(backend(format!("writing the input of {what}")))?;
    let ids: Vec<u32> = (0..rows as u32).collect();
    let zeros = vec![0u32; rows];
    let args = StepArgs {
        tokens: &ids,
        positions: &ids,
        slots: &zeros,
        select: &[],
    };
    let t = unit
        .execute(program, &args)
        .map_err(backend(format!("running {what}")))?;
    unit.wait(t).map_err(backend(format!("running {what}")))?;
    let mut values = vec![0f32; rows * width];
    unit.read(out, 0, bytemuck::cast_slice_mut(&mut values))
        .map_err(backend(format!("reading the output of {what}")))?;
    Ok(values)
}

/// The image's patches as the tower's input rows: patch `(py, px)` is row `py * side + px`,
/// its values in the convolution weight's order (channel, row, column).
pub fn patchify(cfg: &VisionConfig, pixels: &[f32]) -> Vec<f32> {
    let (s, p, side) = (cfg.image_size, cfg.patch_size, cfg.patches_per_side());
    let mut out = Vec::with_capacity(pixels.len());
    for py in 0..side {
        for px in 0..side {
            for c in 0..cfg.channels {
                for y in 0..p {
                    let at = c * s * s + (py * p + y) * s + px * p;
                    out.extend_from_slice(&pixels[at..at + p]);
                }
            }
        }
    }
    out
}

/// The average pool of the tower's `[patches, hidden]` output to `[tokens_per_image, hidden]`:
/// token `(ty, tx)` (row `ty * tokens_per_side + tx`) is the mean of the `k x k` patches it
/// covers, `k = patches_per_side / tokens_per_side` (transformers' `AvgPool2d(k, stride=k)`).
pub fn pool(cfg: &VisionConfig, hidden: &[f32]) -> Vec<f32> {
    let (h, side, tside) = (cfg.hidden, cfg.patches_per_side(), cfg.tokens_per_side());
    let k = side / tside;
    let mut out = vec![0f32; cfg.tokens_per_image * h];
    for ty in 0..tside {
        for tx in 0..tside {
            let o = &mut out[(ty * tside + tx) * h..(ty * tside + tx + 1) * h];
            for y in ty * k..(ty + 1) * k {
                for x in tx * k..(tx + 1) * k {
                    let row = &hidden[(y * side + x) * h..(y * side + x + 1) * h];
                    for (a, b) in o.iter_mut().zip(row) {
                        *a += b;
                    }
                }
            }
            let inv = 1.0 / (k * k) as f32;
            for a in o.iter_mut() {
                *a *= inv;
            }
        }
    }
    out
}

/// Uploads to one unit, keeping what it allocated.
/// Where the graphs' buffers come from: a unit's allocations and uploads, or (`unit` `None`,
/// [`VisionTower::check`]) none, every buffer [`BufferId::UNBOUND`].
struct Uploader<'a> {
    unit: Option<&'a mut dyn ComputeBackend>,
    buffers: Vec<BufferId>,
    /// Bytes of the weights taken, as the unit holds them.
    weight_bytes: u64,
}

impl Uploader<'_> {
    fn alloc(&mut self, desc: TensorDesc, usage: Usage, what: &str) -> Result<BufferId, ModelError> {
        if usage == Usage::Weight {
            self.weight_bytes += desc
                .byte_size()
                .map_err(backend(format!("sizing {what} ({desc})")))?;
        }
        let Some(unit) = self.unit.as_deref_mut() else {
            return Ok(BufferId::UNBOUND);
        };
        let b = unit
            .alloc(&desc, usage)
            .map_err(backend(format!("allocating {what} ({desc})")))?;
        self.buffers.push(b);
        Ok(b)
    }

    /// Writes `data` into `buffer` where there is a unit.
    fn write(&mut self, buffer: BufferId, data: &[u8], what: &str) -> Result<(), ModelError> {
        match self.unit.as_deref_mut() {
            Some(unit) => unit
                .write(buffer, 0, data)
                .map_err(backend(format!("uploading {what}"))),
            None => Ok(()),
        }
    }

    fn activation(&mut self, shape: [usize; 2]) -> Result<BufferId, ModelError> {
        self.alloc(
            TensorDesc::new(DType::F32, shape),
            Usage::Activation,
            "a vision activation",
        )
    }

    /// `t` as stored, under `shape` (the same number of elements).
    fn weight_as(&mut self, t: &StoredTensor<'_>, shape: &[usize]) -> Result<WeightRef, ModelError> {
        let desc = TensorDesc::new(t.desc.dtype, shape.to_vec());
        let buffer = self.alloc(desc.clone(), Usage::Weight, &t.name)?;
        self.write(buffer, t.data, &t.name)?;
        Ok(WeightRef { buffer, desc })
    }

    fn weight(&mut self, t: &StoredTensor<'_>) -> Result<WeightRef, ModelError> {
        let shape = t.desc.shape.clone();
        self.weight_as(t, &shape)
    }

    /// A 2-D `t` transposed, in f32.
    fn transposed(&mut self, t: &StoredTensor<'_>) -> Result<WeightRef, ModelError> {
        let (rows, cols) = (t.desc.shape[0], t.desc.shape[1]);
        let desc = TensorDesc::new(DType::F32, [cols, rows]);
        if self.unit.is_none() {
            let buffer = self.alloc(desc.clone(), Usage::Weight, &t.name)?;
            return Ok(WeightRef { buffer, desc });
        }
        let mut values = vec![0f32; rows * cols];
        tandem_backend_api::kit::quant::dequantize_row(t.desc.dtype, t.data, &mut values).map_err(|e| {
            ModelError::Layout {
                path: t.file.to_path_buf(),
                message: format!("tensor {}: {e}", t.name),
            }
        })?;
        let mut out = vec![0f32; rows * cols];
        for r in 0..rows {
            for c in 0..cols {
                out[c * rows + r] = values[r * cols + c];
            }
        }
        let buffer = self.alloc(desc.clone(), Usage::Weight, &t.name)?;
        self.write(buffer, bytemuck::cast_slice(&out), &t.name)?;
        Ok(WeightRef { buffer, desc })
    }
}

/// `x + b` with the bias `name` of `n` values.
fn bias(
    g: &mut GraphBuilder,
    up: &mut Uploader<'_>,
    w: &dyn VisionWeights,
    x: ValueId,
    name: &str,
    n: usize,
) -> Result<ValueId, ModelError> {
    let b = up.weight(&w.tensor(name, &[n])?)?;
    Ok(g.push1(Op::Bias { x, bias: b }))
}

/// The linear layer `name` (`.weight` `[n, k]`, `.bias` `[n]`) of `x`.
fn linear(
    g: &mut GraphBuilder,
    up: &mut Uploader<'_>,
    w: &dyn VisionWeights,
    x: ValueId,
    name: &str,
    n: usize,
    k: usize,
) -> Result<ValueId, ModelError> {
    let weight = up.weight(&w.tensor(&format!("{name}.weight"), &[n, k])?)?;
    let y = g.push1(Op::MatMul {
        x,
        weight,
        splits: vec![n],
    });
    bias(g, up, w, y, &format!("{name}.bias"), n)
}

/// The layer norm `name` (`.weight`, `.bias`, `[h]` each) of `x`.
fn layer_norm(
    g: &mut GraphBuilder,
    up: &mut Uploader<'_>,
    w: &dyn VisionWeights,
    x: ValueId,
    name: &str,
    h: usize,
    eps: f32,
) -> Result<ValueId, ModelError> {
    let weight = up.weight(&w.tensor(&format!("{name}.weight"), &[h])?)?;
    let bias = up.weight(&w.tensor(&format!("{name}.bias"), &[h])?)?;
    Ok(g.push1(Op::LayerNorm { x, weight, bias, eps }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> VisionConfig {
        VisionConfig {
            hidden: 2,
            intermediate: 4,
            layers: 1,
            heads: 1,
            image_size: 4,
            patch_size: 2,
            channels: 1,
            eps: 1e-6,
            tokens_per_image: 1,
            image_token: 9,
            boi_token: 7,
            eoi_token: 8,
        }
    }

    #[test]
    fn patches_go_row_by_row_in_the_kernel_s_order() {
        // A 4 x 4 one-channel image numbered 0..16: four 2 x 2 patches.
        let pixels: Vec<f32> = (0..16).map(|v| v as f32).collect();
        let rows = patchify(&cfg(), &pixels);
        assert_eq!(&rows[..4], &[0.0, 1.0, 4.0, 5.0]);
        assert_eq!(&rows[4..8], &[2.0, 3.0, 6.0, 7.0]);
        assert_eq!(&rows[8..12], &[8.0, 9.0, 12.0, 13.0]);
    }

    #[test]
    fn the_pool_averages_squares_of_patches() {
        // 2 x 2 patches of width 2 pooled to one token.
        let hidden = [1.0, 10.0, 2.0, 20.0, 3.0, 30.0, 6.0, 60.0];
        assert_eq!(pool(&cfg(), &hidden), vec![3.0, 30.0]);
    }
}
