//! Synthetic Gemma 3 checkpoints: GGUF files with the metadata, tokenizer layout, tensor names,
//! shapes and types of a llama.cpp-converted Gemma 3, filled with seeded random weights.
//!
//! They let the engine be loaded, benchmarked and placed at every published size without
//! downloading weights. The layout mirrors `gemma-3-270m-q4_k_m.gguf` as llama.cpp writes it:
//! `output_norm.weight`, `token_embd.weight`, then each layer's tensors in name order; norm weights
//! in `f32`, stored as `1 + w` (llama.cpp's Gemma convention); matrices and the embedding in the
//! chosen type. With [`SynthDtype::Q4K`], matrices whose rows are not a whole number of 256-value
//! blocks fall back to `q5_0`, as `llama-quantize` does, and the embedding is `q8_0`, as in the
//! 270M file (llama.cpp's `q4_k_m` picks `q6_k` for it, `q8_0` where rows do not fit 256-blocks).
//!
//! Weights are deterministic: each row is generated from `(seed, tensor name, row)` alone, so the
//! bytes do not depend on the number of threads. Matrices are roughly N(0, 0.02) (a sum of four
//! uniforms), norm weights `1 + w` with `w` roughly N(0, 0.05).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use tandem_backend_api::DType;

use super::gguf::writer::{GgufWriteError, GgufWriter, TensorSink, TensorSpec};
use super::quantize::{self, QuantizeError};

/// Values generated and encoded per write to the file.
const CHUNK_VALUES: usize = 1 << 22;
/// Below this many values per chunk, rows are encoded on the calling thread.
const PARALLEL_MIN_VALUES: usize = 1 << 16;
/// Standard deviation of matrix weights.
const MATRIX_STD: f32 = 0.02;
/// Standard deviation of `w` in norm weights stored as `1 + w`.
const NORM_STD: f32 = 0.05;
/// `rms_norm_eps` of every Gemma 3 size.
const RMS_NORM_EPS: f32 = 1e-6;
/// Global-layer rope base of every Gemma 3 size.
const ROPE_FREQ_BASE: f32 = 1_000_000.0;

/// SentencePiece token types as GGUF stores them.
mod token_type {
    pub const NORMAL: i32 = 1;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    pub const BYTE: i32 = 6;
}

/// The model sizes a synthetic file can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SynthShape {
    /// A test-sized model: hidden 256, 2 layers, vocabulary 512 (not a published size).
    Tiny,
    /// Gemma 3 270M.
    Gemma3_270m,
    /// Gemma 3 1B.
    Gemma3_1b,
    /// Gemma 3 4B (text part).
    Gemma3_4b,
    /// Gemma 3 12B (text part).
    Gemma3_12b,
    /// Gemma 3 27B (text part).
    Gemma3_27b,
}

/// The hyperparameters of a [`SynthShape`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SynthDims {
    /// Hidden size (`embedding_length`).
    pub hidden: u64,
    /// MLP intermediate size (`feed_forward_length`).
    pub intermediate: u64,
    /// Decoder layers (`block_count`).
    pub layers: u64,
    /// Query heads.
    pub heads: u64,
    /// Key/value heads.
    pub kv_heads: u64,
    /// Dimension of each head (`key_length` and `value_length`).
    pub head_dim: u64,
    /// Rows of the embedding, and tokens in the vocabulary.
    pub vocab: u64,
    /// Trained context length.
    pub context_length: u32,
    /// Sliding window of the local layers.
    pub sliding_window: u32,
    /// Linear rope scaling factor of the global layers, if any.
    pub rope_scaling_factor: Option<f32>,
    /// `general.size_label`.
    pub size_label: &'static str,
}

impl SynthShape {
    /// Every shape, smallest first.
    pub const ALL: [SynthShape; 6] = [
        SynthShape::Tiny,
        SynthShape::Gemma3_270m,
        SynthShape::Gemma3_1b,
        SynthShape::Gemma3_4b,
        SynthShape::Gemma3_12b,
        SynthShape::Gemma3_27b,
    ];

    /// The name used on the command line (`gemma3-270m`, ..., `tiny`).
    pub const fn name(self) -> &'static str {
        match self {
            SynthShape::Tiny => "tiny",
            SynthShape::Gemma3_270m => "gemma3-270m",
            SynthShape::Gemma3_1b => "gemma3-1b",
            SynthShape::Gemma3_4b => "gemma3-4b",
            SynthShape::Gemma3_12b => "gemma3-12b",
            SynthShape::Gemma3_27b => "gemma3-27b",
        }
    }

    /// The hyperparameters, as the published checkpoints (and their GGUF conversions) have them.
    pub const fn dims(self) -> SynthDims {
        const fn dims(
            (hidden, intermediate, layers): (u64, u64, u64),
            (heads, kv_heads, head_dim): (u64, u64, u64),
            (vocab, context_length, sliding_window): (u64, u32, u32),
            rope_scaling_factor: Option<f32>,
            size_label: &'static str,
        ) -> SynthDims {
            SynthDims {
                hidden,
                intermediate,
                layers,
                heads,
                kv_heads,
                head_dim,
                vocab,
                context_length,
                sliding_window,
                rope_scaling_factor,
                size_label,
            }
        }
        match self {
            SynthShape::Tiny => dims((256, 512, 2), (4, 1, 64), (512, 2048, 64), None, "1.2M"),
            SynthShape::Gemma3_270m => {
                dims((640, 2048, 18), (4, 1, 256), (262_144, 32_768, 512), None, "270M")
            }
            SynthShape::Gemma3_1b => dims((1152, 6912, 26), (4, 1, 256), (262_144, 32_768, 512), None, "1B"),
            SynthShape::Gemma3_4b => dims(
                (2560, 10_240, 34),
                (8, 4, 256),
                (262_208, 131_072, 1024),
                Some(8.0),
                "4B",
            ),
            SynthShape::Gemma3_12b => dims(
                (3840, 15_360, 48),
                (16, 8, 256),
                (262_208, 131_072, 1024),
                Some(8.0),
                "12B",
            ),
            SynthShape::Gemma3_27b => dims(
                (5376, 21_504, 62),
                (32, 16, 128),
                (262_208, 131_072, 1024),
                Some(8.0),
                "27B",
            ),
        }
    }
}

impl fmt::Display for SynthShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SynthShape {
    type Err = SynthError;

    fn from_str(s: &str) -> Result<Self, SynthError> {
        SynthShape::ALL
            .into_iter()
            .find(|shape| shape.name() == s)
            .ok_or_else(|| SynthError::UnknownShape { name: s.to_owned() })
    }
}

/// The storage type of a synthetic file's matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SynthDtype {
    /// Everything but norms in `f16`.
    F16,
    /// Everything but norms in `bf16`.
    Bf16,
    /// Everything but norms in `q8_0`.
    Q8_0,
    /// Matrices in `q4_k` (`q5_0` where rows do not fit 256-value blocks), embedding in `q8_0`.
    Q4K,
}

impl SynthDtype {
    /// Every type.
    pub const ALL: [SynthDtype; 4] = [
        SynthDtype::F16,
        SynthDtype::Bf16,
        SynthDtype::Q8_0,
        SynthDtype::Q4K,
    ];

    /// The name used on the command line (`f16`, `bf16`, `q8_0`, `q4_k`).
    pub const fn name(self) -> &'static str {
        match self {
            SynthDtype::F16 => "f16",
            SynthDtype::Bf16 => "bf16",
            SynthDtype::Q8_0 => "q8_0",
            SynthDtype::Q4K => "q4_k",
        }
    }

    /// The type of a weight matrix whose rows have `row_width` values.
    pub const fn matrix_dtype(self, row_width: u64) -> DType {
        match self {
            SynthDtype::F16 => DType::F16,
            SynthDtype::Bf16 => DType::Bf16,
            SynthDtype::Q8_0 => DType::Q8_0,
            SynthDtype::Q4K if row_width.is_multiple_of(256) => DType::Q4K,
            // llama-quantize's fallback for q4_k (`convert_incompatible_tensor` in llama-quant.cpp).
            SynthDtype::Q4K => DType::Q5_0,
        }
    }

    /// The type of `token_embd.weight`.
    pub const fn embedding_dtype(self) -> DType {
        match self {
            SynthDtype::F16 => DType::F16,
            SynthDtype::Bf16 => DType::Bf16,
            SynthDtype::Q8_0 | SynthDtype::Q4K => DType::Q8_0,
        }
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`): 1 mostly f16, 32 mostly bf16, 7 mostly
    /// q8_0, 14 mostly q4_k (small: no q6_k/q5_k upgrades of sensitive tensors).
    pub const fn file_type(self) -> u32 {
        match self {
            SynthDtype::F16 => 1,
            SynthDtype::Bf16 => 32,
            SynthDtype::Q8_0 => 7,
            SynthDtype::Q4K => 14,
        }
    }
}

impl fmt::Display for SynthDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SynthDtype {
    type Err = SynthError;

    fn from_str(s: &str) -> Result<Self, SynthError> {
        SynthDtype::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| SynthError::UnknownDtype { name: s.to_owned() })
    }
}

/// What [`write_synthetic_gguf`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SynthReport {
    /// The file.
    pub path: PathBuf,
    /// Its length in bytes.
    pub bytes: u64,
    /// Tensors in it.
    pub tensors: usize,
    /// Weights in it (elements of all tensors).
    pub params: u64,
}

/// Why a synthetic file could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// The shape name is not one of [`SynthShape::ALL`].
    #[error("unknown model shape {name:?}; expected one of {}", names(SynthShape::ALL.map(SynthShape::name)))]
    UnknownShape {
        /// The name given.
        name: String,
    },
    /// The type name is not one of [`SynthDtype::ALL`].
    #[error("unknown data type {name:?}; expected one of {}", names(SynthDtype::ALL.map(SynthDtype::name)))]
    UnknownDtype {
        /// The name given.
        name: String,
    },
    /// An mmproj file was asked of a shape without a vision tower.
    #[error("Gemma 3 {shape} has no vision tower (4B, 12B and 27B have one; tiny for tests)")]
    NoVision {
        /// The shape's name.
        shape: &'static str,
    },
    /// Describing or writing the GGUF file failed (the error names the file).
    #[error(transparent)]
    Gguf(#[from] GgufWriteError),
    /// A tensor could not be encoded in its type.
    #[error("cannot encode tensor {tensor} for {}: {source}", path.display())]
    Encode {
        /// The file being written.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The encoder's error.
        source: QuantizeError,
    },
}

fn names<const N: usize>(list: [&str; N]) -> String {
    list.join(", ")
}

/// Writes a synthetic Gemma 3 GGUF of `shape` with matrices in `dtype` to `out` (created or
/// truncated; removed again on failure), with weights from `seed`.
///
/// `progress(done, total)` is called with bytes written so far and the file's final length, as
/// writing proceeds.
pub fn write_synthetic_gguf(
    shape: SynthShape,
    dtype: SynthDtype,
    out: &Path,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SynthReport, SynthError> {
    write_with_threads(shape, dtype, out, seed, progress, writer_threads())
}

/// The vision tower an mmproj file of `shape` holds: Gemma 3's SigLIP (896 / 14, 1152 wide, 27
/// layers, 256 soft tokens) for the multimodal sizes, a test-sized one for `tiny` (56 / 14, 32
/// wide, 2 layers, 4 soft tokens); `None` for the text-only sizes (270M and 1B).
/// (image_size, patch_size, hidden, intermediate, layers, heads, pool scale).
fn vision_dims(shape: SynthShape) -> Option<(u32, u32, u64, u64, u64, u32, u32)> {
    match shape {
        SynthShape::Tiny => Some((56, 14, 32, 48, 2, 2, 2)),
        SynthShape::Gemma3_4b | SynthShape::Gemma3_12b | SynthShape::Gemma3_27b => {
            Some((896, 14, 1152, 4304, 27, 16, 4))
        }
        _ => None,
    }
}

impl SynthShape {
    /// Whether the shape has a vision tower ([`write_synthetic_mmproj`] writes one).
    pub fn has_vision(self) -> bool {
        vision_dims(self).is_some()
    }
}

/// Writes a synthetic mmproj GGUF (llama.cpp's layout for `clip.projector_type = "gemma3"`: `v.*`
/// tower tensors in f16 with f32 biases and norms, `mm.*` projector) for the text model of
/// `shape`, with weights from `seed`: the vision tower a `--mmproj` run loads, for benchmarks
/// where the real file cannot travel. Shapes without a vision tower are an error.
pub fn write_synthetic_mmproj(
    shape: SynthShape,
    out: &Path,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SynthReport, SynthError> {
    let (image, patch, h, ff, layers, heads, scale) =
        vision_dims(shape).ok_or_else(|| SynthError::NoVision { shape: shape.name() })?;
    let text = shape.dims().hidden;
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "clip")?;
    w.add_metadata(
        "general.name",
        format!("Gemma 3 {} synthetic mmproj", shape.name()),
    )?;
    w.add_metadata("clip.projector_type", "gemma3")?;
    w.add_metadata("clip.has_vision_encoder", true)?;
    w.add_metadata("clip.use_gelu", true)?;
    w.add_metadata("clip.vision.image_size", image)?;
    w.add_metadata("clip.vision.patch_size", patch)?;
    w.add_metadata("clip.vision.embedding_length", h as u32)?;
    w.add_metadata("clip.vision.feed_forward_length", ff as u32)?;
    w.add_metadata("clip.vision.block_count", layers as u32)?;
    w.add_metadata("clip.vision.attention.head_count", heads)?;
    w.add_metadata("clip.vision.attention.layer_norm_epsilon", 1e-6f32)?;
    w.add_metadata("clip.vision.projection_dim", text as u32)?;
    w.add_metadata("clip.vision.projector.scale_factor", scale)?;
    w.add_metadata("clip.vision.image_mean", vec![0.5f32; 3])?;
    w.add_metadata("clip.vision.image_std", vec![0.5f32; 3])?;
    let patches = u64::from(image / patch).pow(2);
    let p = u64::from(patch);
    let mut plan: Vec<(TensorSpec, Init)> = Vec::new();
    let mut add = |name: String, dims: &[u64], dtype: DType, init: Init| {
        plan.push((TensorSpec::new(name, dims, dtype), init));
    };
    // The embeddings in f32, as llama.cpp's converter writes Gemma 3's (its CPU add of the
    // position embedding takes no f16 operand: llama-mtmd-cli aborts on an f16 one).
    add(
        "v.patch_embd.weight".into(),
        &[p, p, 3, h],
        DType::F32,
        Init::Matrix,
    );
    add("v.patch_embd.bias".into(), &[h], DType::F32, Init::Matrix);
    add(
        "v.position_embd.weight".into(),
        &[h, patches],
        DType::F32,
        Init::Matrix,
    );
    for l in 0..layers {
        for (name, dims) in [
            ("attn_q", [h, h]),
            ("attn_k", [h, h]),
            ("attn_v", [h, h]),
            ("attn_out", [h, h]),
            ("ffn_up", [h, ff]),
            ("ffn_down", [ff, h]),
        ] {
            add(
                format!("v.blk.{l}.{name}.weight"),
                &dims,
                DType::F16,
                Init::Matrix,
            );
            add(
                format!("v.blk.{l}.{name}.bias"),
                &[dims[1]],
                DType::F32,
                Init::Matrix,
            );
        }
        for ln in ["ln1", "ln2"] {
            add(format!("v.blk.{l}.{ln}.weight"), &[h], DType::F32, Init::Norm);
            add(format!("v.blk.{l}.{ln}.bias"), &[h], DType::F32, Init::Matrix);
        }
    }
    add("v.post_ln.weight".into(), &[h], DType::F32, Init::Norm);
    add("v.post_ln.bias".into(), &[h], DType::F32, Init::Matrix);
    add("mm.soft_emb_norm.weight".into(), &[h], DType::F32, Init::Norm);
    add(
        "mm.input_projection.weight".into(),
        &[text, h],
        DType::F16,
        Init::Matrix,
    );
    write_plan(w, &plan, out, seed, progress, writer_threads())
}

/// How a tensor's values are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Init {
    /// `1 + w`, `w` ~ N(0, NORM_STD).
    Norm,
    /// ~ N(0, MATRIX_STD).
    Matrix,
}

fn write_with_threads(
    shape: SynthShape,
    dtype: SynthDtype,
    out: &Path,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
    threads: usize,
) -> Result<SynthReport, SynthError> {
    let mut writer = GgufWriter::new();
    add_metadata(&mut writer, shape, dtype)?;
    write_plan(writer, &tensor_plan(shape, dtype), out, seed, progress, threads)
}

/// Adds the tensors of `plan` to `writer` (its metadata already added) and writes the file:
/// each tensor's values drawn by its `Init` from `seed`, encoded on `threads` threads.
fn write_plan(
    mut writer: GgufWriter,
    plan: &[(TensorSpec, Init)],
    out: &Path,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
    threads: usize,
) -> Result<SynthReport, SynthError> {
    for (spec, _) in plan {
        writer.add_tensor(spec.clone())?;
    }
    let total = writer.file_len();
    let params = plan.iter().map(|(spec, _)| spec.elems().unwrap_or(0)).sum();
    let bytes = writer.write_file(out, |i, sink: &mut TensorSink<'_>| -> Result<(), SynthError> {
        progress(sink.position(), total);
        let (spec, init) = &plan[i];
        write_tensor(spec, *init, seed, sink, threads, out, progress, total)
    })?;
    progress(bytes, total);
    Ok(SynthReport {
        path: out.to_path_buf(),
        bytes,
        tensors: plan.len(),
        params,
    })
}

/// Threads that encode a synthetic file's tensors: the machine's, at most 16.
fn writer_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(16)
}

/// The metadata of a llama.cpp-converted Gemma 3, in the order llama.cpp writes it.
fn add_metadata(w: &mut GgufWriter, shape: SynthShape, dtype: SynthDtype) -> Result<(), GgufWriteError> {
    let d = shape.dims();
    let size = match shape {
        SynthShape::Tiny => "tiny".to_owned(),
        _ => d.size_label.to_lowercase(),
    };
    let tags = ["gemma3", "gemma", "google", "text-generation"]
        .map(String::from)
        .to_vec();
    w.add_metadata("general.architecture", "gemma3")?;
    w.add_metadata("general.type", "model")?;
    w.add_metadata("general.name", format!("Gemma 3 {size} synthetic"))?;
    w.add_metadata("general.basename", "gemma-3")?;
    w.add_metadata("general.size_label", d.size_label)?;
    w.add_metadata("general.license", "gemma")?;
    w.add_metadata("general.tags", tags)?;
    w.add_metadata("gemma3.context_length", d.context_length)?;
    w.add_metadata("gemma3.embedding_length", d.hidden as u32)?;
    w.add_metadata("gemma3.block_count", d.layers as u32)?;
    w.add_metadata("gemma3.feed_forward_length", d.intermediate as u32)?;
    w.add_metadata("gemma3.attention.head_count", d.heads as u32)?;
    w.add_metadata("gemma3.attention.layer_norm_rms_epsilon", RMS_NORM_EPS)?;
    w.add_metadata("gemma3.attention.key_length", d.head_dim as u32)?;
    w.add_metadata("gemma3.attention.value_length", d.head_dim as u32)?;
    w.add_metadata("gemma3.rope.freq_base", ROPE_FREQ_BASE)?;
    if let Some(factor) = d.rope_scaling_factor {
        w.add_metadata("gemma3.rope.scaling.type", "linear")?;
        w.add_metadata("gemma3.rope.scaling.factor", factor)?;
    }
    w.add_metadata("gemma3.attention.sliding_window", d.sliding_window)?;
    w.add_metadata("gemma3.attention.head_count_kv", d.kv_heads as u32)?;
    let (tokens, scores, types) = vocabulary(d.vocab as usize);
    w.add_metadata("tokenizer.ggml.model", "llama")?;
    w.add_metadata("tokenizer.ggml.pre", "default")?;
    w.add_metadata("tokenizer.ggml.tokens", tokens)?;
    w.add_metadata("tokenizer.ggml.scores", scores)?;
    w.add_metadata("tokenizer.ggml.token_type", types)?;
    w.add_metadata("tokenizer.ggml.bos_token_id", 2u32)?;
    w.add_metadata("tokenizer.ggml.eos_token_id", 1u32)?;
    w.add_metadata("tokenizer.ggml.unknown_token_id", 3u32)?;
    w.add_metadata("tokenizer.ggml.padding_token_id", 0u32)?;
    w.add_metadata("tokenizer.ggml.add_bos_token", true)?;
    w.add_metadata("tokenizer.ggml.add_sep_token", false)?;
    w.add_metadata("tokenizer.ggml.add_eos_token", false)?;
    w.add_metadata("tokenizer.ggml.add_space_prefix", false)?;
    w.add_metadata("general.quantization_version", 2u32)?;
    w.add_metadata("general.file_type", dtype.file_type())?;
    Ok(())
}

/// The tensors in file order, with how to fill each.
fn tensor_plan(shape: SynthShape, dtype: SynthDtype) -> Vec<(TensorSpec, Init)> {
    let d = shape.dims();
    let q = d.heads * d.head_dim;
    let kv = d.kv_heads * d.head_dim;
    let norm = |name: String, width: u64| (TensorSpec::new(name, &[width], DType::F32), Init::Norm);
    let matrix = |name: String, dims: [u64; 2]| {
        (
            TensorSpec::new(name, &dims, dtype.matrix_dtype(dims[0])),
            Init::Matrix,
        )
    };
    let mut plan = vec![
        norm("output_norm.weight".into(), d.hidden),
        (
            TensorSpec::new("token_embd.weight", &[d.hidden, d.vocab], dtype.embedding_dtype()),
            Init::Matrix,
        ),
    ];
    for layer in 0..d.layers {
        let name = |t: &str| format!("blk.{layer}.{t}.weight");
        // Name order, as llama.cpp's conversion writes them.
        plan.push(matrix(name("attn_k"), [d.hidden, kv]));
        plan.push(norm(name("attn_k_norm"), d.head_dim));
        plan.push(norm(name("attn_norm"), d.hidden));
        plan.push(matrix(name("attn_output"), [q, d.hidden]));
        plan.push(matrix(name("attn_q"), [d.hidden, q]));
        plan.push(norm(name("attn_q_norm"), d.head_dim));
        plan.push(matrix(name("attn_v"), [d.hidden, kv]));
        plan.push(matrix(name("ffn_down"), [d.intermediate, d.hidden]));
        plan.push(matrix(name("ffn_gate"), [d.hidden, d.intermediate]));
        plan.push(norm(name("ffn_norm"), d.hidden));
        plan.push(matrix(name("ffn_up"), [d.hidden, d.intermediate]));
        plan.push(norm(name("post_attention_norm"), d.hidden));
        plan.push(norm(name("post_ffw_norm"), d.hidden));
    }
    plan
}

/// HTML tags the Gemma 3 vocabulary holds as user-defined tokens 168..=237.
const HTML_TAGS: [&str; 70] = [
    "<table>",
    "<caption>",
    "<thead>",
    "<tbody>",
    "<tfoot>",
    "<tr>",
    "<th>",
    "<td>",
    "</table>",
    "</caption>",
    "</thead>",
    "</tbody>",
    "</tfoot>",
    "</tr>",
    "</th>",
    "</td>",
    "<h1>",
    "<h2>",
    "<h3>",
    "<h4>",
    "<h5>",
    "<h6>",
    "<blockquote>",
    "</h1>",
    "</h2>",
    "</h3>",
    "</h4>",
    "</h5>",
    "</h6>",
    "</blockquote>",
    "<strong>",
    "<em>",
    "<b>",
    "<i>",
    "<u>",
    "<s>",
    "<sub>",
    "<sup>",
    "<code>",
    "</strong>",
    "</em>",
    "</b>",
    "</i>",
    "</u>",
    "</s>",
    "</sub>",
    "</sup>",
    "</code>",
    "<a>",
    "<html>",
    "<body>",
    "<img>",
    "<span>",
    "<bbox>",
    "<ul>",
    "<li>",
    "<div>",
    "<iframe>",
    "<footer>",
    "</a>",
    "</html>",
    "</body>",
    "</img>",
    "</span>",
    "</bbox>",
    "</ul>",
    "</li>",
    "</div>",
    "</iframe>",
    "</footer>",
];

/// First id of the 256 byte tokens `<0x00>`..`<0xFF>`.
const FIRST_BYTE_TOKEN: usize = 238;
/// First id of the normal (scored) pieces.
const FIRST_NORMAL_TOKEN: usize = FIRST_BYTE_TOKEN + 256;
/// Size of the published Gemma 3 tokenizer.
const GEMMA3_TOKENIZER_SIZE: usize = 262_144;
/// Where the published vocabulary's normal pieces end (31 tab runs follow).
const GEMMA3_NORMAL_END: usize = 255_968;

/// A SentencePiece vocabulary of `n` tokens (`n` > 494) laid out like Gemma 3's: the special and
/// user-defined tokens at their real ids (pad 0, eos 1, bos 2, unk 3, `<start_of_turn>` 105,
/// `<end_of_turn>` 106, newline and space runs, HTML tags, bytes at 238..=493), then distinct filler
/// pieces scored `-k`. At the published size and above, tab runs, the image tokens, `<unused99>`..
/// and, past 262 144, `<image_soft_token>` and `[PADn]` padding follow as in the converted
/// checkpoints.
fn vocabulary(n: usize) -> (Vec<String>, Vec<f32>, Vec<i32>) {
    let mut tokens = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    let mut push = |t: String, ty: i32| {
        tokens.push(t);
        types.push(ty);
    };
    for t in ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"] {
        push(t.into(), token_type::CONTROL);
    }
    push("[multimodal]".into(), token_type::USER_DEFINED);
    for k in 0..99 {
        push(format!("<unused{k}>"), token_type::CONTROL);
    }
    push("<start_of_turn>".into(), token_type::CONTROL);
    push("<end_of_turn>".into(), token_type::CONTROL);
    for k in 1..=31 {
        push("\n".repeat(k), token_type::USER_DEFINED);
    }
    for k in 2..=31 {
        push(" ".repeat(k), token_type::USER_DEFINED);
    }
    for t in HTML_TAGS {
        push(t.into(), token_type::USER_DEFINED);
    }
    for b in 0..=255u8 {
        push(format!("<0x{b:02X}>"), token_type::BYTE);
    }
    let normal_end = if n >= GEMMA3_TOKENIZER_SIZE {
        GEMMA3_NORMAL_END
    } else {
        n
    };
    for piece in filler_pieces().take(normal_end.saturating_sub(FIRST_NORMAL_TOKEN)) {
        push(piece, token_type::NORMAL);
    }
    if n >= GEMMA3_TOKENIZER_SIZE {
        for k in 1..=31 {
            push("\t".repeat(k), token_type::USER_DEFINED);
        }
        push("<start_of_image>".into(), token_type::USER_DEFINED);
        push("<end_of_image>".into(), token_type::USER_DEFINED);
        for k in 99..99 + (GEMMA3_TOKENIZER_SIZE - GEMMA3_NORMAL_END - 33) {
            push(format!("<unused{k}>"), token_type::CONTROL);
        }
    }
    if n > GEMMA3_TOKENIZER_SIZE {
        push("<image_soft_token>".into(), token_type::CONTROL);
        for id in GEMMA3_TOKENIZER_SIZE + 1..n {
            push(format!("[PAD{id}]"), token_type::UNUSED);
        }
    }
    tokens.truncate(n);
    types.truncate(n);
    let scores = types
        .iter()
        .enumerate()
        .map(|(id, &ty)| match ty {
            token_type::NORMAL => -((id - FIRST_NORMAL_TOKEN) as f32),
            token_type::BYTE => 0.0,
            _ => -1000.0,
        })
        .collect();
    (tokens, scores, types)
}

/// Distinct normal pieces: `▁`, each printable ASCII character, `▁` + each, then lowercase words
/// of growing length, each bare and with `▁` (SentencePiece's word-start mark) in front.
fn filler_pieces() -> impl Iterator<Item = String> {
    let ascii = || (b'!'..=b'~').map(char::from);
    let singles = std::iter::once("\u{2581}".to_owned())
        .chain(ascii().map(String::from))
        .chain(ascii().map(|c| format!("\u{2581}{c}")));
    let words = (2u32..).flat_map(|len| {
        (0..26u64.pow(len)).flat_map(move |mut k| {
            let mut word = vec![b'a'; len as usize];
            for slot in word.iter_mut().rev() {
                *slot = b'a' + (k % 26) as u8;
                k /= 26;
            }
            let word: String = word.into_iter().map(char::from).collect();
            [format!("\u{2581}{word}"), word]
        })
    });
    singles.chain(words)
}

/// SplitMix64: a 64-bit generator that is also a good hash of its state.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// A value of mean 0 and standard deviation 1 (to 1e-5), roughly normal and bounded by +-3.46: the
/// sum of the four 16-bit lanes of `r`, centred and scaled.
fn unit_normal_like(r: u64) -> f32 {
    /// Standard deviation of the sum of four uniform 16-bit integers: sqrt(4 (65536^2 - 1) / 12).
    const SUM_STD: f32 = 37_837.23;
    let sum = (r & 0xffff) + ((r >> 16) & 0xffff) + ((r >> 32) & 0xffff) + (r >> 48);
    (sum as f32 - 131_070.0) * (1.0 / SUM_STD)
}

fn tensor_seed(seed: u64, name: &str) -> u64 {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    SplitMix64(seed ^ h).next()
}

/// Row `row` of a tensor: a function of the tensor's seed and the row index only.
fn fill_row(init: Init, tensor_seed: u64, row: u64, values: &mut [f32]) {
    let mut rng = SplitMix64(SplitMix64(tensor_seed.wrapping_add(row)).next());
    match init {
        Init::Matrix => values
            .iter_mut()
            .for_each(|v| *v = MATRIX_STD * unit_normal_like(rng.next())),
        Init::Norm => values
            .iter_mut()
            .for_each(|v| *v = 1.0 + NORM_STD * unit_normal_like(rng.next())),
    }
}

#[allow(clippy::too_many_arguments)]
fn write_tensor(
    spec: &TensorSpec,
    init: Init,
    seed: u64,
    sink: &mut TensorSink<'_>,
    threads: usize,
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
    total: u64,
) -> Result<(), SynthError> {
    let encode_error = |source| SynthError::Encode {
        path: path.to_path_buf(),
        tensor: spec.name.clone(),
        source,
    };
    let row_len = spec.dims.first().copied().unwrap_or(0) as usize;
    let row_bytes = quantize::encoded_len(spec.dtype, row_len).map_err(encode_error)?;
    let rows = spec.rows();
    let chunk_rows = (CHUNK_VALUES / row_len.max(1)).max(1) as u64;
    let seed = tensor_seed(seed, &spec.name);
    let mut buf = Vec::new();
    let mut first = 0u64;
    while first < rows {
        let n = chunk_rows.min(rows - first);
        buf.resize(n as usize * row_bytes, 0);
        let job = RowJob {
            init,
            dtype: spec.dtype,
            seed,
            row_len,
            row_bytes,
        };
        job.encode_rows(first, &mut buf, threads).map_err(encode_error)?;
        sink.write(&buf)?;
        progress(sink.position(), total);
        first += n;
    }
    Ok(())
}

/// Generates and encodes rows of one tensor.
#[derive(Clone, Copy)]
struct RowJob {
    init: Init,
    dtype: DType,
    seed: u64,
    row_len: usize,
    row_bytes: usize,
}

impl RowJob {
    /// Fills `out` with the encodings of the rows starting at `first`, split over `threads`.
    fn encode_rows(self, first: u64, out: &mut [u8], threads: usize) -> Result<(), QuantizeError> {
        let rows = out.len() / self.row_bytes;
        let workers = threads.min(rows).max(1);
        if workers == 1 || rows * self.row_len < PARALLEL_MIN_VALUES {
            return self.encode_serial(first, out);
        }
        let per_worker = rows.div_ceil(workers);
        std::thread::scope(|scope| {
            let handles: Vec<_> = out
                .chunks_mut(per_worker * self.row_bytes)
                .enumerate()
                .map(|(w, part)| {
                    let start = first + (w * per_worker) as u64;
                    scope.spawn(move || self.encode_serial(start, part))
                })
                .collect();
            handles.into_iter().try_for_each(|h| match h.join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            })
        })
    }

    fn encode_serial(self, first: u64, out: &mut [u8]) -> Result<(), QuantizeError> {
        let mut values = vec![0.0f32; self.row_len];
        for (k, dst) in out.chunks_exact_mut(self.row_bytes).enumerate() {
            fill_row(self.init, self.seed, first + k as u64, &mut values);
            quantize::encode(self.dtype, &values, dst)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_mmproj_of_a_shape_opens_as_its_vision_tower() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mmproj.gguf");
        let report = write_synthetic_mmproj(SynthShape::Tiny, &path, 7, &mut |_, _| {}).unwrap();
        assert_eq!(report.tensors, 3 + 2 * 16 + 4);
        let (cfg, weights) = crate::checkpoint::vision::MmprojWeights::open(&path).unwrap();
        assert_eq!(
            (cfg.hidden, cfg.layers, cfg.patches(), cfg.tokens_per_image),
            (32, 2, 16, 4)
        );
        assert_eq!(weights.projection_dim().unwrap(), 256);
        let err = write_synthetic_mmproj(SynthShape::Gemma3_1b, &path, 7, &mut |_, _| {}).unwrap_err();
        assert!(err.to_string().contains("no vision tower"), "{err}");
    }
    use crate::checkpoint::gguf::value::{GgufArray, GgufValue};
    use crate::checkpoint::gguf::writer::ggml_type_id;
    use crate::checkpoint::gguf::writer::test_reader::{parse, Parsed};

    fn write_tiny(dtype: SynthDtype, threads: usize) -> (SynthReport, Vec<u8>, Vec<(u64, u64)>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.gguf");
        let mut calls = Vec::new();
        let report = write_with_threads(
            SynthShape::Tiny,
            dtype,
            &path,
            7,
            &mut |d, t| calls.push((d, t)),
            threads,
        )
        .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        (report, bytes, calls)
    }

    fn u32_of(p: &Parsed, key: &str) -> u32 {
        match p.get(key) {
            Some(GgufValue::U32(v)) => *v,
            other => panic!("{key}: {other:?}"),
        }
    }

    fn f32_at(bytes: &[u8], at: usize) -> f32 {
        f32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
    }

    #[test]
    fn names_parse() {
        for shape in SynthShape::ALL {
            assert_eq!(shape.name().parse::<SynthShape>().unwrap(), shape);
        }
        for dtype in SynthDtype::ALL {
            assert_eq!(dtype.to_string().parse::<SynthDtype>().unwrap(), dtype);
        }
        let err = "gemma3-2b".parse::<SynthShape>().unwrap_err();
        assert!(err.to_string().contains("gemma3-270m"), "{err}");
        let err = "q4_k_m".parse::<SynthDtype>().unwrap_err();
        assert!(err.to_string().contains("q4_k"), "{err}");
    }

    #[test]
    fn tiny_file_reads_back_like_a_converted_gemma3() {
        let (report, bytes, calls) = write_tiny(SynthDtype::Q8_0, 2);
        assert_eq!(report.bytes, bytes.len() as u64);
        let p = parse(&bytes).unwrap();
        assert_eq!(p.version, 3);
        assert_eq!(p.get("general.architecture"), Some(&GgufValue::from("gemma3")));
        assert_eq!(u32_of(&p, "gemma3.embedding_length"), 256);
        assert_eq!(u32_of(&p, "gemma3.block_count"), 2);
        assert_eq!(u32_of(&p, "gemma3.feed_forward_length"), 512);
        assert_eq!(u32_of(&p, "gemma3.attention.head_count"), 4);
        assert_eq!(u32_of(&p, "gemma3.attention.head_count_kv"), 1);
        assert_eq!(u32_of(&p, "gemma3.attention.key_length"), 64);
        assert_eq!(u32_of(&p, "gemma3.attention.value_length"), 64);
        assert_eq!(u32_of(&p, "gemma3.attention.sliding_window"), 64);
        assert_eq!(u32_of(&p, "tokenizer.ggml.bos_token_id"), 2);
        assert_eq!(u32_of(&p, "tokenizer.ggml.eos_token_id"), 1);
        assert_eq!(u32_of(&p, "general.file_type"), 7);
        assert_eq!(
            p.get("gemma3.attention.layer_norm_rms_epsilon"),
            Some(&GgufValue::F32(1e-6))
        );
        assert_eq!(p.get("gemma3.rope.freq_base"), Some(&GgufValue::F32(1e6)));
        assert_eq!(p.get("gemma3.rope.scaling.type"), None);
        assert_eq!(p.get("tokenizer.ggml.model"), Some(&GgufValue::from("llama")));
        assert_eq!(
            p.get("tokenizer.ggml.add_bos_token"),
            Some(&GgufValue::Bool(true))
        );
        let Some(GgufValue::Array(GgufArray::String(tokens))) = p.get("tokenizer.ggml.tokens") else {
            panic!("no token list");
        };
        assert_eq!(tokens.len(), 512);
        assert_eq!(&tokens[..4], ["<pad>", "<eos>", "<bos>", "<unk>"]);
        assert_eq!(tokens[105], "<start_of_turn>");
        assert_eq!(tokens[106], "<end_of_turn>");
        assert_eq!(tokens[238], "<0x00>");
        assert_eq!(tokens[248], "<0x0A>");
        assert_eq!(tokens[493], "<0xFF>");
        let Some(GgufValue::Array(GgufArray::I32(types))) = p.get("tokenizer.ggml.token_type") else {
            panic!("no token types");
        };
        assert_eq!(
            (types[1], types[106], types[107], types[300], types[511]),
            (3, 3, 4, 6, 1)
        );
        let Some(GgufValue::Array(GgufArray::F32(scores))) = p.get("tokenizer.ggml.scores") else {
            panic!("no scores");
        };
        assert_eq!((scores[2], scores[300], scores[495]), (-1000.0, 0.0, -1.0));

        let names: Vec<&str> = p.tensors.iter().map(|t| t.0.as_str()).collect();
        assert_eq!(names.len(), 2 + 2 * 13);
        assert_eq!(
            &names[..4],
            [
                "output_norm.weight",
                "token_embd.weight",
                "blk.0.attn_k.weight",
                "blk.0.attn_k_norm.weight"
            ]
        );
        assert_eq!(names[27], "blk.1.post_ffw_norm.weight");
        assert_eq!(report.tensors, names.len());
        let find = |n: &str| p.tensors.iter().find(|t| t.0 == n).unwrap();
        let q8 = ggml_type_id(DType::Q8_0);
        assert_eq!(
            (find("token_embd.weight").1.clone(), find("token_embd.weight").2),
            (vec![256, 512], q8)
        );
        assert_eq!(find("blk.1.attn_q.weight").1, vec![256, 256]);
        assert_eq!(find("blk.1.attn_k.weight").1, vec![256, 64]);
        assert_eq!(find("blk.1.attn_v.weight").1, vec![256, 64]);
        assert_eq!(find("blk.1.attn_output.weight").1, vec![256, 256]);
        assert_eq!(find("blk.1.ffn_gate.weight").1, vec![256, 512]);
        assert_eq!(find("blk.1.ffn_down.weight").1, vec![512, 256]);
        assert_eq!(
            (
                find("blk.0.attn_q_norm.weight").1.clone(),
                find("blk.0.attn_q_norm.weight").2
            ),
            (vec![64], 0)
        );
        assert_eq!(find("blk.0.ffn_norm.weight").1, vec![256]);
        let params: u64 = p.tensors.iter().map(|t| t.1.iter().product::<u64>()).sum();
        assert_eq!(report.params, params);

        // Norms are 1 + w, w small.
        let norm = find("output_norm.weight");
        let at = p.data_start + norm.3 as usize;
        let values: Vec<f32> = (0..256).map(|i| f32_at(&bytes, at + 4 * i)).collect();
        assert!(values.iter().all(|v| (0.75..1.25).contains(v)), "{values:?}");
        let mean = values.iter().sum::<f32>() / 256.0;
        assert!((mean - 1.0).abs() < 0.02, "{mean}");

        // Progress ends at the file length and never goes back.
        assert_eq!(calls.last(), Some(&(report.bytes, report.bytes)));
        assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 == w[1].1));
    }

    #[test]
    fn matrices_have_the_intended_spread() {
        let mut row = vec![0.0f32; 1 << 16];
        fill_row(Init::Matrix, 1, 0, &mut row);
        let n = row.len() as f32;
        let mean = row.iter().sum::<f32>() / n;
        let std = (row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n).sqrt();
        assert!(mean.abs() < 5e-4, "{mean}");
        assert!((std - MATRIX_STD).abs() < 5e-4, "{std}");
        let mut other = vec![0.0f32; 1 << 16];
        fill_row(Init::Matrix, 1, 1, &mut other);
        assert_ne!(row, other);
    }

    #[test]
    fn output_does_not_depend_on_threads() {
        let (_, serial, _) = write_tiny(SynthDtype::Q4K, 1);
        let (_, parallel, _) = write_tiny(SynthDtype::Q4K, 3);
        assert!(serial == parallel);
        let p = parse(&serial).unwrap();
        let types: Vec<u32> = p.tensors.iter().take(4).map(|t| t.2).collect();
        assert_eq!(types, vec![0, 8, 12, 0]);
        assert_eq!(u32_of(&p, "general.file_type"), 14);
    }

    #[test]
    fn every_dtype_writes() {
        for (dtype, embd, matrix) in [(SynthDtype::F16, 1, 1), (SynthDtype::Bf16, 30, 30)] {
            let (report, bytes, _) = write_tiny(dtype, 2);
            let p = parse(&bytes).unwrap();
            assert_eq!(p.tensors[1].2, embd);
            assert_eq!(p.tensors[2].2, matrix);
            assert_eq!(report.bytes, bytes.len() as u64);
        }
    }

    #[test]
    fn q4_k_falls_back_like_llama_quantize() {
        let plan = tensor_plan(SynthShape::Gemma3_270m, SynthDtype::Q4K);
        let dtype_of = |n: &str| plan.iter().find(|(s, _)| s.name == n).map(|(s, _)| s.dtype);
        assert_eq!(dtype_of("token_embd.weight"), Some(DType::Q8_0));
        assert_eq!(dtype_of("blk.0.attn_q.weight"), Some(DType::Q5_0));
        assert_eq!(dtype_of("blk.0.ffn_up.weight"), Some(DType::Q5_0));
        assert_eq!(dtype_of("blk.0.attn_output.weight"), Some(DType::Q4K));
        assert_eq!(dtype_of("blk.17.ffn_down.weight"), Some(DType::Q4K));
        assert_eq!(dtype_of("blk.0.attn_norm.weight"), Some(DType::F32));
        assert_eq!(plan.len(), 2 + 18 * 13);
        for shape in [
            SynthShape::Gemma3_4b,
            SynthShape::Gemma3_12b,
            SynthShape::Gemma3_27b,
        ] {
            let plan = tensor_plan(shape, SynthDtype::Q4K);
            assert!(
                plan.iter()
                    .skip(2)
                    .all(|(s, _)| matches!(s.dtype, DType::Q4K | DType::F32)),
                "{shape}"
            );
        }
    }

    #[test]
    fn every_shape_describes_a_valid_file() {
        for shape in SynthShape::ALL {
            for dtype in SynthDtype::ALL {
                let mut w = GgufWriter::new();
                for (spec, _) in tensor_plan(shape, dtype) {
                    w.add_tensor(spec).unwrap();
                }
            }
        }
        let d = SynthShape::Gemma3_27b.dims();
        assert_eq!(
            (d.heads * d.head_dim, d.vocab, d.rope_scaling_factor),
            (4096, 262_208, Some(8.0))
        );
    }

    #[test]
    fn multimodal_sizes_carry_linear_rope_scaling() {
        let mut w = GgufWriter::new();
        add_metadata(&mut w, SynthShape::Gemma3_4b, SynthDtype::Bf16).unwrap();
        let mut bytes = Vec::new();
        w.write_to(&mut bytes, Path::new("m.gguf"), |_, _: &mut TensorSink<'_>| {
            Ok::<(), GgufWriteError>(())
        })
        .unwrap();
        let p = parse(&bytes).unwrap();
        assert_eq!(
            p.get("gemma3.rope.scaling.type"),
            Some(&GgufValue::from("linear"))
        );
        assert_eq!(p.get("gemma3.rope.scaling.factor"), Some(&GgufValue::F32(8.0)));
        assert_eq!(u32_of(&p, "gemma3.context_length"), 131_072);
        assert_eq!(u32_of(&p, "gemma3.attention.sliding_window"), 1024);
        assert_eq!(u32_of(&p, "gemma3.attention.head_count_kv"), 4);
        assert_eq!(u32_of(&p, "general.file_type"), 32);
        let Some(GgufValue::Array(tokens)) = p.get("tokenizer.ggml.tokens") else {
            panic!("no token list");
        };
        assert_eq!(tokens.len(), 262_208);
    }

    #[test]
    fn vocabulary_matches_the_published_layout() {
        let (tokens, scores, types) = vocabulary(262_208);
        assert_eq!(tokens.len(), 262_208);
        assert_eq!(
            tokens.iter().collect::<std::collections::HashSet<_>>().len(),
            tokens.len()
        );
        assert_eq!(
            (tokens[5].as_str(), tokens[107].as_str(), tokens[138].as_str()),
            ("[multimodal]", "\n", "  ")
        );
        assert_eq!(
            (tokens[168].as_str(), tokens[237].as_str()),
            ("<table>", "</footer>")
        );
        assert_eq!(tokens[494], "\u{2581}");
        assert_eq!(
            (tokens[255_999].as_str(), types[255_999]),
            ("<start_of_image>", 4)
        );
        assert_eq!((tokens[256_001].as_str(), types[256_001]), ("<unused99>", 3));
        assert_eq!(tokens[262_143], "<unused6241>");
        assert_eq!(
            (tokens[262_144].as_str(), types[262_144]),
            ("<image_soft_token>", 3)
        );
        assert_eq!((tokens[262_207].as_str(), types[262_207]), ("[PAD262207]", 5));
        assert_eq!((tokens[255_968].as_str(), types[255_968]), ("\t", 4));
        assert_eq!((scores[255_967], scores[255_968]), (-255_473.0, -1000.0));
        assert_eq!(types[255_967], 1);
        let count = |ty| types.iter().filter(|&&t| t == ty).count();
        // The published 262 144-token vocabulary has 6249 control, 165 user-defined, 256 byte tokens.
        assert_eq!((count(3), count(4), count(6)), (6249 + 1, 165, 256));
        assert_eq!(vocabulary(262_144).0.len(), 262_144);
    }
}
