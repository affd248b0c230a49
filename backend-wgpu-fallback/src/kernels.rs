//! The WGSL kernels (`shaders/wgsl/`): each module is assembled from shared parts, a weight
//! format's decoder where the kernel reads weights, and the kernel itself; pipelines are made
//! once per (kernel, format, override constants) and kept.
//!
//! Variants by adapter feature, chosen when a module is put together (the backend's
//! [`Variant`], fixed when the device opens): with `subgroups` (`wgpu::Features::SUBGROUP`) the
//! reductions of the norms, attention and matvec run on subgroup operations
//! (`parts/reduce_subgroup.wgsl`, `matvec_subgroup.wgsl`, and for q4_k weights
//! `matvec_q4k.wgsl`, both around `parts/matvec_subgroup_main.wgsl`); without, the portable tree in
//! workgroup memory (`parts/reduce.wgsl`, `matvec.wgsl`) that any adapter runs (in every
//! variant, q4_k weights against one input row take `matvec_q4k_rows.wgsl`); with `f16`
//! (`wgpu::Features::SHADER_F16`) the prefill matmul stages its tiles in f16
//! (`matmul_tiled_f16.wgsl`), without it in f32 (`matmul_tiled.wgsl`); with `coopmat`
//! (`wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX` offering 16x16x16 f16 x f16 -> f32, with
//! f16 and 32-wide subgroups) it runs on cooperative matrices: `matmul_half.wgsl` on f16 rows
//! staged once per step in a buffer of their own (`stage_half.wgsl`, `dequant_half.wgsl`; f16
//! weights in place), or, where that buffer would be too large or for A/B runs,
//! `matmul_coopmat.wgsl`, staging in workgroup memory (tiles of [`Variant::matmul_tile`]); with
//! `int_dot` (the Vulkan device's `shaderIntegerDotProduct`, by default where its packed 8-bit
//! dot product is accelerated) decode's matvecs on block-format weights quantise their input
//! once (`quantize_q8.wgsl`) and take `dot4I8Packed` (`matvec_dot.wgsl` with the format's
//! `dot/<format>.wgsl`).

use std::collections::HashMap;

use tandem_backend_api::{BackendError, DType};

const COMMON: &str = include_str!("../../shaders/wgsl/common.wgsl");
const WEIGHTS: &str = include_str!("../../shaders/wgsl/weights.wgsl");
const MATMUL_COMMON: &str = include_str!("../../shaders/wgsl/matmul_common.wgsl");
const REDUCE: &str = include_str!("../../shaders/wgsl/parts/reduce.wgsl");
const REDUCE_SUBGROUP: &str = include_str!("../../shaders/wgsl/parts/reduce_subgroup.wgsl");
const KV_READ: &str = include_str!("../../shaders/wgsl/parts/kv_read.wgsl");
const ATTENTION_PARAMS: &str = include_str!("../../shaders/wgsl/parts/attention_params.wgsl");
const KV_STORE: &str = include_str!("../../shaders/wgsl/parts/kv_store.wgsl");
const NO_KV_STORE: &str = include_str!("../../shaders/wgsl/parts/no_kv_store.wgsl");
const SLOT_BLOCK: &str = include_str!("../../shaders/wgsl/parts/slot_block.wgsl");
const X_GROUP: &str = include_str!("../../shaders/wgsl/parts/x_group.wgsl");
const HALF: &str = include_str!("../../shaders/wgsl/parts/half.wgsl");
const COOP_OUT: &str = include_str!("../../shaders/wgsl/parts/coop_out.wgsl");
const MATVEC_SUBGROUP_MAIN: &str = include_str!("../../shaders/wgsl/parts/matvec_subgroup_main.wgsl");
const Q4K_PAIR: &str = include_str!("../../shaders/wgsl/parts/q4k_pair.wgsl");
const VIEWS16: &str = include_str!("../../shaders/wgsl/parts/views16.wgsl");
const DOT_INPUT: &str = include_str!("../../shaders/wgsl/parts/dot_input.wgsl");
const NIBBLES: &str = include_str!("../../shaders/wgsl/dot/nibbles.wgsl");

/// The optional adapter features the kernels use, fixed when the device opens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Variant {
    /// Subgroup reductions (`wgpu::Features::SUBGROUP`).
    pub subgroups: bool,
    /// f16 tiles in workgroup memory for the prefill matmul (`wgpu::Features::SHADER_F16`,
    /// WGSL `enable f16`).
    pub f16: bool,
    /// The prefill matmul on cooperative matrices (`wgpu::Features::
    /// EXPERIMENTAL_COOPERATIVE_MATRIX`, WGSL `enable wgpu_cooperative_matrix`); needs `f16`
    /// and `subgroups` too.
    pub coopmat: bool,
    /// Decode's matvecs on block-format weights through packed 8-bit integer dot products
    /// (WGSL's `dot4I8Packed`, lowered to SPIR-V's OpSDot where the Vulkan device has
    /// `shaderIntegerDotProduct`): `quantize_q8.wgsl` and `matvec_dot.wgsl`.
    pub int_dot: bool,
}

impl Variant {
    /// The portable variant: no optional feature.
    pub const PORTABLE: Variant = Variant {
        subgroups: false,
        f16: false,
        coopmat: false,
        int_dot: false,
    };

    /// The prefill matmul's output tile: (weight rows, input rows) per workgroup.
    pub fn matmul_tile(self) -> (usize, usize) {
        if self.coopmat {
            (128, 64)
        } else {
            (64, 64)
        }
    }

    /// Names of the variants in use, for `engine backends` (`portable` when none).
    pub fn names(self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.subgroups {
            v.push("subgroups");
        }
        if self.f16 {
            v.push("f16");
        }
        if self.coopmat {
            v.push("coopmat");
        }
        if self.int_dot {
            v.push("int_dot");
        }
        if v.is_empty() {
            v.push("portable");
        }
        v
    }
}

/// A kernel: its source and the bindings its entry point uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    Embed,
    RmsNorm,
    MatVec,
    MatMulTiled,
    Rope,
    KvStore,
    Attention,
    AttentionCombine,
    Eltwise,
    SelectRows,
    /// Fused RmsNorm, Add and optionally the next RmsNorm (`fuse::Group::NormAdd`).
    NormAdd,
    /// Fused per-head RmsNorm and Rope (`fuse::Group::NormRope` without a store), one or two
    /// of them (`NormRopePair`).
    NormRope,
    /// Fused per-head RmsNorm and Rope that also stores K and V in the cache.
    NormRopeStore,
    /// Decode attention by KV head (grouped queries).
    AttentionGqa,
    /// matvec computing a GeGlu of its two halves (`fuse::Group::MatMulGeGlu`).
    MatVecGeGlu,
    /// One pass of Op::TopK's sorts (`kit::top_k`).
    TopK,
    /// Prefill attention, flash-attention style: blocks of rows of one slot over key tiles in
    /// workgroup memory (`attention_tiled.wgsl`).
    AttentionTiled,
    /// Prefill matmul input rows as f16 in the staging buffer (`stage_half.wgsl`).
    StageHalf,
    /// Prefill matmul weight rows decoded to f16 in the staging buffer (`dequant_half.wgsl`).
    DequantHalf,
    /// The cooperative-matrix prefill matmul on staged f16 rows (`matmul_half.wgsl`).
    MatMulHalf,
    /// The same with f16 weights read where they are stored (binding 3).
    MatMulHalfNative,
    /// Decode's matvec on q4_k weights for one input row, a workgroup per 4 NR output columns
    /// (`matvec_q4k_rows.wgsl`), optionally with the fused GeGlu.
    MatVecQ4kRows,
    /// Decode's input rows quantised to blocks of 32 integers for `MatVecDot`
    /// (`quantize_q8.wgsl`).
    QuantizeQ8,
    /// Decode's matvec on block-format weights through packed integer dot products
    /// (`matvec_dot.wgsl` with the format's `dot/<format>.wgsl`), optionally with the fused
    /// GeGlu.
    MatVecDot,
    /// Decode's subgroup matvec on f16 weights with rows of a multiple of 8 values, items of 8
    /// (`matvec_f16.wgsl`), optionally with the fused GeGlu.
    MatVecF16,
    /// The vision tower's `Op::LayerNorm` (`layer_norm.wgsl`): weight at binding 3, bias at 6.
    LayerNorm,
    /// The vision tower's `Op::Bias` (`bias.wgsl`).
    Bias,
    /// The vision tower's `Op::Gelu` (`gelu.wgsl`).
    Gelu,
    /// The vision tower's `Op::BlockAttention` (`block_attention.wgsl`).
    BlockAttention,
    /// `Op::BlockAttention` for heads up to 256 on `attention_tiled.wgsl`'s scheme
    /// (`block_attention_tiled.wgsl`).
    BlockAttentionTiled,
}

impl Kernel {
    /// Every kernel.
    #[cfg(test)]
    pub const ALL: [Kernel; 30] = [
        Kernel::Embed,
        Kernel::RmsNorm,
        Kernel::MatVec,
        Kernel::MatMulTiled,
        Kernel::Rope,
        Kernel::KvStore,
        Kernel::Attention,
        Kernel::AttentionCombine,
        Kernel::Eltwise,
        Kernel::SelectRows,
        Kernel::NormAdd,
        Kernel::NormRope,
        Kernel::NormRopeStore,
        Kernel::AttentionGqa,
        Kernel::MatVecGeGlu,
        Kernel::TopK,
        Kernel::AttentionTiled,
        Kernel::StageHalf,
        Kernel::DequantHalf,
        Kernel::MatMulHalf,
        Kernel::MatMulHalfNative,
        Kernel::MatVecQ4kRows,
        Kernel::QuantizeQ8,
        Kernel::MatVecDot,
        Kernel::MatVecF16,
        Kernel::LayerNorm,
        Kernel::Bias,
        Kernel::Gelu,
        Kernel::BlockAttention,
        Kernel::BlockAttentionTiled,
    ];

    /// The kernel's name (its pipeline label).
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Embed => "embed",
            Kernel::RmsNorm => "rms_norm",
            Kernel::MatVec => "matvec",
            Kernel::MatMulTiled => "matmul_tiled",
            Kernel::Rope => "rope",
            Kernel::KvStore => "kv_store",
            Kernel::Attention => "attention",
            Kernel::AttentionCombine => "attention_combine",
            Kernel::Eltwise => "eltwise",
            Kernel::SelectRows => "select_rows",
            Kernel::NormAdd => "norm_add",
            Kernel::NormRope => "norm_rope",
            Kernel::NormRopeStore => "norm_rope_store",
            Kernel::AttentionGqa => "attention_gqa",
            Kernel::MatVecGeGlu => "matvec_geglu",
            Kernel::TopK => "top_k",
            Kernel::AttentionTiled => "attention_tiled",
            Kernel::StageHalf => "stage_half",
            Kernel::DequantHalf => "dequant_half",
            Kernel::MatMulHalf => "matmul_half",
            Kernel::MatMulHalfNative => "matmul_half_native",
            Kernel::MatVecQ4kRows => "matvec_q4k_rows",
            Kernel::QuantizeQ8 => "quantize_q8",
            Kernel::MatVecDot => "matvec_dot",
            Kernel::MatVecF16 => "matvec_f16",
            Kernel::LayerNorm => "layer_norm",
            Kernel::Bias => "bias",
            Kernel::Gelu => "gelu",
            Kernel::BlockAttention => "block_attention",
            Kernel::BlockAttentionTiled => "block_attention_tiled",
        }
    }

    /// Whether a matvec on weights in `format` takes `matvec_q4k.wgsl` in `variant`.
    fn q4k_subgroup(format: Option<Format>, variant: Variant) -> bool {
        variant.subgroups && format.is_some_and(|f| f.dtype == DType::Q4K)
    }

    /// The kernel's own source, for weights in `format` where it reads them.
    fn source(self, format: Option<Format>, variant: Variant) -> &'static str {
        match self {
            Kernel::MatVec | Kernel::MatVecGeGlu if Self::q4k_subgroup(format, variant) => {
                include_str!("../../shaders/wgsl/matvec_q4k.wgsl")
            }
            Kernel::MatVec | Kernel::MatVecGeGlu if variant.subgroups => {
                include_str!("../../shaders/wgsl/matvec_subgroup.wgsl")
            }
            Kernel::MatMulTiled if variant.coopmat => {
                include_str!("../../shaders/wgsl/matmul_coopmat.wgsl")
            }
            Kernel::MatMulTiled if variant.f16 => include_str!("../../shaders/wgsl/matmul_tiled_f16.wgsl"),
            Kernel::AttentionGqa if variant.subgroups => {
                include_str!("../../shaders/wgsl/attention_gqa_subgroup.wgsl")
            }
            Kernel::Embed => include_str!("../../shaders/wgsl/embed.wgsl"),
            Kernel::RmsNorm => include_str!("../../shaders/wgsl/rms_norm.wgsl"),
            Kernel::MatVec | Kernel::MatVecGeGlu => include_str!("../../shaders/wgsl/matvec.wgsl"),
            Kernel::MatMulTiled => include_str!("../../shaders/wgsl/matmul_tiled.wgsl"),
            Kernel::Rope => include_str!("../../shaders/wgsl/rope.wgsl"),
            Kernel::KvStore => include_str!("../../shaders/wgsl/kv_store.wgsl"),
            Kernel::Attention => include_str!("../../shaders/wgsl/attention.wgsl"),
            Kernel::AttentionCombine => include_str!("../../shaders/wgsl/attention_combine.wgsl"),
            Kernel::Eltwise => include_str!("../../shaders/wgsl/eltwise.wgsl"),
            Kernel::SelectRows => include_str!("../../shaders/wgsl/select_rows.wgsl"),
            Kernel::NormAdd => include_str!("../../shaders/wgsl/norm_add.wgsl"),
            Kernel::NormRope | Kernel::NormRopeStore => include_str!("../../shaders/wgsl/norm_rope.wgsl"),
            Kernel::AttentionGqa => include_str!("../../shaders/wgsl/attention_gqa.wgsl"),
            Kernel::TopK => include_str!("../../shaders/wgsl/top_k.wgsl"),
            Kernel::AttentionTiled => include_str!("../../shaders/wgsl/attention_tiled.wgsl"),
            Kernel::StageHalf => include_str!("../../shaders/wgsl/stage_half.wgsl"),
            Kernel::DequantHalf => include_str!("../../shaders/wgsl/dequant_half.wgsl"),
            Kernel::MatMulHalf | Kernel::MatMulHalfNative => {
                include_str!("../../shaders/wgsl/matmul_half.wgsl")
            }
            Kernel::MatVecQ4kRows => include_str!("../../shaders/wgsl/matvec_q4k_rows.wgsl"),
            Kernel::QuantizeQ8 => include_str!("../../shaders/wgsl/quantize_q8.wgsl"),
            Kernel::MatVecDot => include_str!("../../shaders/wgsl/matvec_dot.wgsl"),
            Kernel::MatVecF16 => include_str!("../../shaders/wgsl/matvec_f16.wgsl"),
            Kernel::LayerNorm => include_str!("../../shaders/wgsl/layer_norm.wgsl"),
            Kernel::Bias => include_str!("../../shaders/wgsl/bias.wgsl"),
            Kernel::Gelu => include_str!("../../shaders/wgsl/gelu.wgsl"),
            Kernel::BlockAttention => include_str!("../../shaders/wgsl/block_attention.wgsl"),
            Kernel::BlockAttentionTiled => include_str!("../../shaders/wgsl/block_attention_tiled.wgsl"),
        }
    }

    /// Whether the kernel decodes a weight format (binding 3 and a format's `load_group`).
    pub fn reads_format(self) -> bool {
        matches!(
            self,
            Kernel::Embed | Kernel::MatVec | Kernel::MatVecGeGlu | Kernel::MatMulTiled | Kernel::DequantHalf
        )
    }

    /// Whether the kernel needs the `subgroups` variant (made only in one with it).
    pub fn needs_subgroups(self) -> bool {
        self == Kernel::MatVecF16
    }

    /// Whether the kernel belongs to the cooperative-matrix prefill path (staging buffer,
    /// f16): made only in a variant with `coopmat`.
    pub fn needs_coopmat(self) -> bool {
        matches!(
            self,
            Kernel::StageHalf | Kernel::DequantHalf | Kernel::MatMulHalf | Kernel::MatMulHalfNative
        )
    }

    /// Whether the kernel reduces through the reduce part (`parts/reduce*.wgsl`), which gives it
    /// its entry point.
    fn reduces(self) -> bool {
        matches!(
            self,
            Kernel::RmsNorm
                | Kernel::NormAdd
                | Kernel::NormRope
                | Kernel::NormRopeStore
                | Kernel::Attention
                | Kernel::LayerNorm
                | Kernel::BlockAttention
        )
    }

    /// The bindings its entry point uses (see `common.wgsl`) in `variant`, with weights in
    /// `format`: the q4_k subgroup matvec also reads the arena (8) and its weights (9) through
    /// 16-byte views.
    pub fn bindings(self, format: Option<Format>, variant: Variant) -> &'static [u32] {
        match self {
            Kernel::MatVec | Kernel::MatVecGeGlu if Self::q4k_subgroup(format, variant) => &[0, 1, 3, 8, 9],
            Kernel::Embed => &[0, 1, 2, 3],
            Kernel::NormRope => &[0, 1, 2, 3, 6],
            Kernel::RmsNorm | Kernel::MatVec | Kernel::MatVecGeGlu | Kernel::MatMulTiled => &[0, 1, 3],
            Kernel::NormAdd => &[0, 1, 3, 6],
            Kernel::Rope | Kernel::SelectRows => &[0, 1, 2],
            Kernel::KvStore | Kernel::Attention | Kernel::AttentionGqa | Kernel::AttentionTiled => {
                &[0, 1, 2, 4, 5]
            }
            Kernel::NormRopeStore => &[0, 1, 2, 3, 4, 5, 6],
            Kernel::AttentionCombine => &[0, 1, 2],
            Kernel::Eltwise | Kernel::TopK => &[0, 1],
            Kernel::StageHalf | Kernel::MatMulHalf => &[0, 1, 7],
            Kernel::DequantHalf => &[0, 3, 7],
            Kernel::MatMulHalfNative => &[0, 1, 3, 7],
            Kernel::MatVecQ4kRows => &[0, 1, 8, 9],
            Kernel::QuantizeQ8 => &[0, 1, 10],
            // q4_k units are read through the 16-byte view.
            Kernel::MatVecDot if format.is_some_and(|f| f.dtype == DType::Q4K) => &[0, 1, 9, 10],
            Kernel::MatVecDot => &[0, 1, 3, 10],
            Kernel::MatVecF16 => &[0, 1, 8, 9],
            Kernel::LayerNorm => &[0, 1, 3, 6],
            Kernel::Bias => &[0, 1, 3],
            Kernel::Gelu | Kernel::BlockAttention | Kernel::BlockAttentionTiled => &[0, 1],
        }
    }
}

/// A weight decoder (`shaders/wgsl/formats/`): a storage format, and for the float formats
/// whether four values are read per group (rows of a multiple of 4 values; the block formats
/// always decode groups of 4 neighbouring values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Format {
    pub dtype: DType,
    pub wide: bool,
}

impl Format {
    /// The decoder for `dtype` rows of `k` values, or `None` where there is none.
    pub fn for_rows(dtype: DType, k: usize) -> Option<Format> {
        let wide = matches!(dtype, DType::F32 | DType::F16 | DType::Bf16) && k.is_multiple_of(4);
        format_source(dtype, wide).map(|_| Format { dtype, wide })
    }

    /// Values one call of `load_group` decodes.
    pub fn group(self) -> usize {
        match self.dtype {
            DType::F32 | DType::F16 | DType::Bf16 => {
                if self.wide {
                    4
                } else {
                    1
                }
            }
            _ => 4,
        }
    }
}

fn format_source(dtype: DType, wide: bool) -> Option<&'static str> {
    Some(match (dtype, wide) {
        (DType::F32, false) => include_str!("../../shaders/wgsl/formats/f32.wgsl"),
        (DType::F32, true) => include_str!("../../shaders/wgsl/formats/f32x4.wgsl"),
        (DType::F16, false) => include_str!("../../shaders/wgsl/formats/f16.wgsl"),
        (DType::F16, true) => include_str!("../../shaders/wgsl/formats/f16x4.wgsl"),
        (DType::Bf16, false) => include_str!("../../shaders/wgsl/formats/bf16.wgsl"),
        (DType::Bf16, true) => include_str!("../../shaders/wgsl/formats/bf16x4.wgsl"),
        (DType::Q4_0, _) => include_str!("../../shaders/wgsl/formats/q4_0.wgsl"),
        (DType::Q4_1, _) => include_str!("../../shaders/wgsl/formats/q4_1.wgsl"),
        (DType::Q5_0, _) => include_str!("../../shaders/wgsl/formats/q5_0.wgsl"),
        (DType::Q5_1, _) => include_str!("../../shaders/wgsl/formats/q5_1.wgsl"),
        (DType::Q8_0, _) => include_str!("../../shaders/wgsl/formats/q8_0.wgsl"),
        (DType::Q4K, _) => include_str!("../../shaders/wgsl/formats/q4_k.wgsl"),
        (DType::Q6K, _) => include_str!("../../shaders/wgsl/formats/q6_k.wgsl"),
        _ => return None,
    })
}

/// `matvec_dot.wgsl`'s unit decoder for `dtype` (`shaders/wgsl/dot/`), where there is one.
fn dot_source(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::Q4_0 => include_str!("../../shaders/wgsl/dot/q4_0.wgsl"),
        DType::Q4_1 => include_str!("../../shaders/wgsl/dot/q4_1.wgsl"),
        DType::Q5_0 => include_str!("../../shaders/wgsl/dot/q5_0.wgsl"),
        DType::Q5_1 => include_str!("../../shaders/wgsl/dot/q5_1.wgsl"),
        DType::Q8_0 => include_str!("../../shaders/wgsl/dot/q8_0.wgsl"),
        DType::Q4K => include_str!("../../shaders/wgsl/dot/q4_k.wgsl"),
        DType::Q6K => include_str!("../../shaders/wgsl/dot/q6_k.wgsl"),
        _ => return None,
    })
}

/// Whether `matvec_dot.wgsl` takes weights stored in `dtype` (the block formats).
pub fn dot_supported(dtype: DType) -> bool {
    dot_source(dtype).is_some()
}

/// What the WGSL kernels cover, for the shared op support rule
/// ([`tandem_gpu_kit::op_support`]): the weight formats with a decoder ([`format_supported`]),
/// up to 4 output splits, heads up to 512, top-k of 1 to `TOP_K_MAX`, f16 KV caches of an even
/// width (two values per 32-bit word).
pub const COVERAGE: tandem_gpu_kit::Coverage = tandem_gpu_kit::Coverage {
    kernels: "WGSL",
    weight_format: format_supported,
    max_splits: 4,
    max_head_dim: 512,
    top_k_max: Some(tandem_backend_api::TOP_K_MAX),
    f16_kv_pairs: true,
    image_rows: true,
    vision_ops: true,
};

/// Whether the kernels decode weights stored in `dtype`.
pub fn format_supported(dtype: DType) -> bool {
    format_source(dtype, false).is_some()
}

/// The WGSL module of `kernel` in `variant` (with `format`'s decoder where it reads one).
pub fn module_source(
    kernel: Kernel,
    format: Option<Format>,
    variant: Variant,
) -> Result<String, BackendError> {
    // Naga takes subgroup operations without `enable subgroups` (it does not parse that
    // directive yet); the device's SUBGROUP feature is what allows them. `enable f16` leads the
    // module of a kernel that uses f16.
    let mut s = String::new();
    if kernel.needs_coopmat() && !variant.coopmat {
        return Err(BackendError::internal(format!(
            "kernel {} needs the coopmat variant",
            kernel.name()
        )));
    }
    if kernel.needs_subgroups() && !variant.subgroups {
        return Err(BackendError::internal(format!(
            "kernel {} needs the subgroups variant",
            kernel.name()
        )));
    }
    if (kernel == Kernel::MatMulTiled && (variant.f16 || variant.coopmat)) || kernel.needs_coopmat() {
        s.push_str("enable f16;\n");
    }
    if (kernel == Kernel::MatMulTiled && variant.coopmat)
        || matches!(kernel, Kernel::MatMulHalf | Kernel::MatMulHalfNative)
    {
        s.push_str("enable wgpu_cooperative_matrix;\n");
    }
    s.push_str(COMMON);
    let norm = matches!(
        kernel,
        Kernel::RmsNorm
            | Kernel::NormAdd
            | Kernel::NormRope
            | Kernel::NormRopeStore
            | Kernel::LayerNorm
            | Kernel::Bias
    );
    if kernel.reads_format() || norm || kernel == Kernel::MatVecDot {
        s.push_str(WEIGHTS);
    }
    if kernel == Kernel::MatVecDot {
        let dt = format
            .ok_or_else(|| BackendError::internal("kernel matvec_dot needs a weight format"))?
            .dtype;
        let src = dot_source(dt)
            .ok_or_else(|| BackendError::unsupported(kernel.name(), format!("no {dt} unit decoder")))?;
        if matches!(dt, DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1) {
            s.push_str(NIBBLES);
        }
        s.push_str(src);
    }
    if matches!(kernel, Kernel::MatVecDot | Kernel::QuantizeQ8) {
        s.push_str(DOT_INPUT);
    }
    if kernel.reads_format() {
        let f = format.ok_or_else(|| {
            BackendError::internal(format!("kernel {} needs a weight format", kernel.name()))
        })?;
        let src = format_source(f.dtype, f.wide)
            .ok_or_else(|| BackendError::unsupported(kernel.name(), format!("no {} decoder", f.dtype)))?;
        s.push_str(src);
    }
    if matches!(
        kernel,
        Kernel::MatVec
            | Kernel::MatVecGeGlu
            | Kernel::MatMulTiled
            | Kernel::MatVecQ4kRows
            | Kernel::MatVecDot
            | Kernel::QuantizeQ8
            | Kernel::MatVecF16
    ) || kernel.needs_coopmat()
    {
        s.push_str(MATMUL_COMMON);
    }
    if matches!(kernel, Kernel::MatVec | Kernel::MatVecGeGlu | Kernel::MatMulTiled) {
        s.push_str(X_GROUP);
    }
    if kernel.needs_coopmat() {
        s.push_str(HALF);
    }
    if (kernel == Kernel::MatMulTiled && variant.coopmat)
        || matches!(kernel, Kernel::MatMulHalf | Kernel::MatMulHalfNative)
    {
        s.push_str(COOP_OUT);
    }
    if kernel.reduces() {
        s.push_str(if variant.subgroups {
            REDUCE_SUBGROUP
        } else {
            REDUCE
        });
    }
    if matches!(
        kernel,
        Kernel::Attention | Kernel::AttentionGqa | Kernel::AttentionTiled
    ) {
        s.push_str(ATTENTION_PARAMS);
        s.push_str(KV_READ);
    }
    if matches!(
        kernel,
        Kernel::Attention | Kernel::AttentionTiled | Kernel::AttentionCombine
    ) {
        s.push_str(SLOT_BLOCK);
    }
    match kernel {
        Kernel::NormRope => s.push_str(NO_KV_STORE),
        Kernel::NormRopeStore => s.push_str(KV_STORE),
        _ => {}
    }
    if (matches!(kernel, Kernel::MatVec | Kernel::MatVecGeGlu) && variant.subgroups)
        || kernel == Kernel::MatVecF16
    {
        s.push_str(MATVEC_SUBGROUP_MAIN);
    }
    let q4k = format.is_some_and(|f| f.dtype == DType::Q4K);
    let q4k_kernel = kernel == Kernel::MatVecQ4kRows
        || (kernel == Kernel::MatVecDot && q4k)
        || (matches!(kernel, Kernel::MatVec | Kernel::MatVecGeGlu) && Kernel::q4k_subgroup(format, variant));
    if q4k_kernel || kernel == Kernel::MatVecF16 {
        s.push_str(VIEWS16);
    }
    if q4k_kernel {
        s.push_str(Q4K_PAIR);
    }
    match kernel {
        Kernel::MatMulHalf => s.push_str(&kernel.source(format, variant).replace("WSRC", "hs")),
        Kernel::MatMulHalfNative => {
            s.push_str("@group(0) @binding(3) var<storage, read> wh: array<f16>;\n");
            s.push_str(&kernel.source(format, variant).replace("WSRC", "wh"));
        }
        _ => s.push_str(kernel.source(format, variant)),
    }
    Ok(s)
}

/// The key of a pipeline: kernel, format, and matvec's override constants (R, its input rows
/// per workgroup, in the low byte; NC, the subgroup variant's output columns per workgroup,
/// in the next; its workgroup size over 64 from bit 16, where more than 1), or
/// matmul_half's (its subgroups along input rows in the low byte, along weight rows in the
/// next, each subgroup's 16-row blocks of input rows above), matvec_q4k_rows' (NR, W, GEGLU),
/// matvec_dot's (R, NC, WIDE at bit 16, GEGLU at 17) or quantize_q8's (WIDE), the attention
/// kernels' IMAGE_ROWS (1: images' blocks); 0 elsewhere.
pub type PipelineKey = (Kernel, Option<Format>, u32);

/// Pipelines made so far, all of one variant.
pub struct Pipelines {
    map: HashMap<PipelineKey, wgpu::ComputePipeline>,
    variant: Variant,
    /// The pipeline cache every pipeline is made with, where there is one
    /// (`pipeline_cache::DiskCache`).
    pub cache: Option<wgpu::PipelineCache>,
    /// Pipelines made.
    pub built: u64,
    /// Time spent making them (`create_compute_pipeline`).
    pub time: std::time::Duration,
}

impl Pipelines {
    /// No pipelines yet; those made will be of `variant`.
    pub fn new(variant: Variant) -> Self {
        Pipelines {
            map: HashMap::new(),
            variant,
            cache: None,
            built: 0,
            time: std::time::Duration::ZERO,
        }
    }

    /// The pipeline for `key`, made on first use. Shader errors surface through the device's
    /// error sink, which the caller checks.
    pub fn get(
        &mut self,
        device: &wgpu::Device,
        key: PipelineKey,
    ) -> Result<wgpu::ComputePipeline, BackendError> {
        if let Some(p) = self.map.get(&key) {
            return Ok(p.clone());
        }
        let (kernel, format, r) = key;
        let source = module_source(kernel, format, self.variant)?;
        let label = match format {
            Some(f) => format!("{}_{}{}", kernel.name(), f.dtype, if f.wide { "x4" } else { "" }),
            None => kernel.name().to_string(),
        };
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(&label),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        };
        let module = shader_module(device, desc, !crate::tuning::loop_bounds_forced());
        let constants: Vec<(&str, f64)> = match kernel {
            Kernel::MatVec | Kernel::MatVecGeGlu | Kernel::MatVecF16 => {
                // R in the low byte; NC (the subgroup variant's columns per workgroup) above;
                // matvec_f16's GEGLU at bit 24.
                let mut c = vec![("R", f64::from(r & 0xFF))];
                if kernel == Kernel::MatVecGeGlu || (r >> 24) & 1 == 1 {
                    c.push(("GEGLU", 1.0));
                }
                if (r >> 8) & 0xFF > 1 {
                    c.push(("NC", f64::from((r >> 8) & 0xFF)));
                }
                if (r >> 16) & 0xFF > 1 {
                    c.push(("WG", f64::from(64 * ((r >> 16) & 0xFF))));
                }
                c
            }
            Kernel::MatVecQ4kRows => {
                // NR in the low byte, the lane groups of 32 (W) in the next, GEGLU from bit 16.
                let mut c = vec![
                    ("NR", f64::from(r & 0xFF)),
                    ("WG", f64::from(32 * ((r >> 8) & 0xFF))),
                ];
                if (r >> 16) & 1 == 1 {
                    c.push(("GEGLU", 1.0));
                }
                c
            }
            Kernel::MatVecDot => {
                // R in the low byte, NC in the next, WIDE at bit 16, GEGLU at bit 17.
                let mut c = vec![
                    ("R", f64::from(r & 0xFF)),
                    ("NC", f64::from((r >> 8) & 0xFF)),
                    ("WIDE", f64::from((r >> 16) & 1)),
                ];
                if (r >> 17) & 1 == 1 {
                    c.push(("GEGLU", 1.0));
                }
                c
            }
            Kernel::QuantizeQ8 => vec![("WIDE", f64::from(r & 1))],
            // Images' blocks (`parts/attention_params.wgsl`): key 1.
            Kernel::Attention | Kernel::AttentionGqa | Kernel::AttentionTiled if r & 1 == 1 => {
                vec![("IMAGE_ROWS", 1.0)]
            }
            Kernel::MatMulHalf | Kernel::MatMulHalfNative => {
                // Subgroups along the input rows in the low byte, along the weight rows above.
                // FM (each subgroup's 16-row blocks of input rows) from bit 16.
                let (sgm, sgn, fm) = (r & 0xFF, (r >> 8) & 0xFF, (r >> 16) & 0xFF);
                vec![
                    ("SGM", f64::from(sgm)),
                    ("SGN", f64::from(sgn)),
                    ("WGS", f64::from(32 * sgm * sgn)),
                    ("FM", f64::from(fm)),
                ]
            }
            _ => Vec::new(),
        };
        let start = std::time::Instant::now();
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &constants,
                // Every kernel writes its workgroup memory before reading it.
                zero_initialize_workgroup_memory: false,
            },
            cache: self.cache.as_ref(),
        });
        self.time += start.elapsed();
        self.built += 1;
        self.map.insert(key, pipeline.clone());
        Ok(pipeline)
    }
}

/// A shader module from `desc`, with wgpu's runtime checks, less the loop counter where
/// `unbounded_loops` (the kernels' default, [`Pipelines`]).
pub(crate) fn shader_module(
    device: &wgpu::Device,
    desc: wgpu::ShaderModuleDescriptor<'_>,
    unbounded_loops: bool,
) -> wgpu::ShaderModule {
    if !unbounded_loops {
        return device.create_shader_module(desc);
    }
    let mut checks = wgpu::ShaderRuntimeChecks::checked();
    checks.force_loop_bounding = false;
    // SAFETY: the one check given up is wgpu's counter on every loop, there so that a loop
    // which never ends cannot be assumed away by the driver. Every loop of the kernels in
    // shaders/wgsl ends: each counts up by a positive constant, workgroup or subgroup size to a
    // bound taken from the dispatch's parameters (element counts of bound buffers, far below
    // u32::MAX less the step, so the counter cannot wrap), counts a stride down to 0 by
    // halving, or doubles up to an override constant (top_k's N, at most TOP_K_MAX). Bounds
    // checks and integer-division checks stay on.
    unsafe { device.create_shader_module_trusted(desc, checks) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cooperative-matrix prefill kernels through naga, as wgpu compiles them for Vulkan: parsed,
    /// validated and written as SPIR-V, for every weight format. No test adapter offers
    /// cooperative matrices (lavapipe of Mesa 22 lacks VK_KHR_cooperative_matrix), so this is
    /// what CI checks of it. `TANDEM_SPIRV_DUMP=dir` writes the SPIR-V there for a validator
    /// (`spirv-val --target-env vulkan1.3`, SPIRV-Tools 2024 or later).
    #[test]
    fn coopmat_kernels_compile_to_spirv_for_every_format() {
        let variant = Variant {
            subgroups: true,
            f16: true,
            coopmat: true,
            int_dot: false,
        };
        let dtypes = [
            DType::F32,
            DType::F16,
            DType::Bf16,
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
            DType::Q4K,
            DType::Q6K,
        ];
        let formats: Vec<Format> = dtypes
            .iter()
            .flat_map(|&d| [Format::for_rows(d, 256), Format::for_rows(d, 257)])
            .flatten()
            .collect();
        assert!(formats.len() >= 13, "{formats:?}");
        // The staged matmul and the weight decoder for every format; the rest once.
        let mut modules: Vec<(Kernel, Option<Format>)> = Vec::new();
        for f in &formats {
            modules.push((Kernel::MatMulTiled, Some(*f)));
            modules.push((Kernel::DequantHalf, Some(*f)));
        }
        for k in [Kernel::StageHalf, Kernel::MatMulHalf, Kernel::MatMulHalfNative] {
            modules.push((k, None));
        }
        for (kernel, f) in modules {
            let what = format!("{} {f:?}", kernel.name());
            let source = module_source(kernel, f, variant).unwrap();
            let coop = matches!(
                kernel,
                Kernel::MatMulTiled | Kernel::MatMulHalf | Kernel::MatMulHalfNative
            );
            assert_eq!(source.contains("coopMultiplyAdd"), coop, "{what}");
            assert!(
                !source.contains("WSRC"),
                "{what}: the weights' array is not named"
            );
            let module = naga::front::wgsl::parse_str(&source)
                .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&source)));
            let info = naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                naga::valid::Capabilities::all(),
            )
            .validate(&module)
            .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&source)));
            // The override constants as the widest workgroup the host asks for sets them.
            let constants: naga::back::PipelineConstants = match kernel {
                Kernel::MatMulHalf | Kernel::MatMulHalfNative => {
                    [("SGM", 2.0), ("SGN", 4.0), ("WGS", 256.0), ("FM", 4.0)]
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v))
                        .collect()
                }
                _ => Default::default(),
            };
            let (module, info) = naga::back::pipeline_constants::process_overrides(
                &module,
                &info,
                Some((naga::ShaderStage::Compute, "main")),
                &constants,
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            let options = naga::back::spv::Options {
                lang_version: (1, 3),
                ..Default::default()
            };
            let words = naga::back::spv::write_vec(&module, &info, &options, None)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            // OpCooperativeMatrixMulAddKHR (4459), one word count of 6, is in the matmuls.
            assert_eq!(
                words.contains(&((6 << 16) | 4459)),
                coop,
                "{what}: cooperative multiply-add in the SPIR-V"
            );
            if let Some(dir) = std::env::var_os("TANDEM_SPIRV_DUMP") {
                // For a look with a SPIR-V validator that knows SPV_KHR_cooperative_matrix.
                let name = match f {
                    Some(f) => format!(
                        "{}_{}{}.spv",
                        kernel.name(),
                        f.dtype,
                        if f.wide { "x4" } else { "" }
                    ),
                    None => format!("{}.spv", kernel.name()),
                };
                std::fs::write(
                    std::path::Path::new(&dir).join(name),
                    bytemuck::cast_slice::<u32, u8>(&words),
                )
                .unwrap();
            }
        }
        // Without the coopmat variant the path's kernels are refused, not half made.
        assert!(module_source(Kernel::MatMulHalf, None, Variant::PORTABLE).is_err());
    }

    /// The subgroup variant's matvecs on q4_k weights are the q4_k kernel (`matvec_q4k.wgsl`),
    /// parsed and validated by naga as wgpu does; other formats and the portable variant keep
    /// theirs.
    #[test]
    fn q4k_subgroup_matvec_is_its_own_kernel_and_validates() {
        let subgroups = Variant {
            subgroups: true,
            ..Variant::PORTABLE
        };
        let q4k = Format::for_rows(DType::Q4K, 256);
        let q6k = Format::for_rows(DType::Q6K, 256);
        for kernel in [Kernel::MatVec, Kernel::MatVecGeGlu] {
            for (format, variant, want) in [
                (q4k, subgroups, true),
                (q6k, subgroups, false),
                (q4k, Variant::PORTABLE, false),
            ] {
                let source = module_source(kernel, format, variant).unwrap();
                assert_eq!(
                    source.contains("struct Q4kX"),
                    want,
                    "{kernel:?} {format:?} {variant:?}"
                );
                let module = naga::front::wgsl::parse_str(&source)
                    .unwrap_or_else(|e| panic!("{kernel:?} {format:?}: {}", e.emit_to_string(&source)));
                naga::valid::Validator::new(
                    naga::valid::ValidationFlags::all(),
                    naga::valid::Capabilities::all(),
                )
                .validate(&module)
                .unwrap_or_else(|e| panic!("{kernel:?} {format:?}: {}", e.emit_to_string(&source)));
            }
        }
    }

    /// `matvec_dot` through naga as wgpu compiles it for Vulkan: with the capabilities wgpu
    /// enables where the device has `shaderIntegerDotProduct`, each `dot4I8Packed` is SPIR-V's
    /// OpSDot on packed 8-bit vectors (the hardware instruction); without them, naga's polyfill
    /// (shifts and multiplies), with no OpSDot left.
    #[test]
    fn matvec_dot_is_packed_sdot_where_the_device_has_integer_dot_products() {
        use naga::back::spv::Capability;
        let q4k = Format::for_rows(DType::Q4K, 256);
        let source = module_source(Kernel::MatVecDot, q4k, Variant::PORTABLE).unwrap();
        let module =
            naga::front::wgsl::parse_str(&source).unwrap_or_else(|e| panic!("{}", e.emit_to_string(&source)));
        let info = naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        )
        .validate(&module)
        .unwrap_or_else(|e| panic!("{}", e.emit_to_string(&source)));
        let constants: naga::back::PipelineConstants =
            [("R", 8.0), ("NC", 2.0), ("WIDE", 1.0), ("GEGLU", 1.0)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
        let (module, info) = naga::back::pipeline_constants::process_overrides(
            &module,
            &info,
            Some((naga::ShaderStage::Compute, "main")),
            &constants,
        )
        .unwrap();
        let spirv = |dot: bool| {
            let mut caps: naga::FastHashSet<Capability> = [Capability::Shader].into_iter().collect();
            if dot {
                caps.extend([
                    Capability::DotProductInputAll,
                    Capability::DotProductInput4x8Bit,
                    Capability::DotProductInput4x8BitPacked,
                    Capability::DotProduct,
                ]);
            }
            let options = naga::back::spv::Options {
                lang_version: (1, 3),
                capabilities: Some(caps),
                ..Default::default()
            };
            naga::back::spv::write_vec(&module, &info, &options, None).unwrap()
        };
        // OpSDot (4450): result type, result, two operands and the packed format, 6 words.
        let sdot = (6 << 16) | 4450;
        let with = spirv(true);
        assert!(
            with.iter().filter(|&&w| w == sdot).count() >= 16,
            "16 packed dot products per unit and row"
        );
        assert!(!spirv(false).contains(&sdot));
    }

    #[test]
    fn variants_name_what_they_use() {
        assert_eq!(Variant::PORTABLE.names(), ["portable"]);
        let all = Variant {
            subgroups: true,
            f16: true,
            coopmat: true,
            int_dot: true,
        };
        assert_eq!(all.names(), ["subgroups", "f16", "coopmat", "int_dot"]);
        assert_eq!(all.matmul_tile(), (128, 64));
        assert_eq!(Variant::PORTABLE.matmul_tile(), (64, 64));
    }
}
