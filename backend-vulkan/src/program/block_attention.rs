//! `Op::BlockAttention` (the vision tower's bidirectional attention over each image's rows):
//! `block_attention_coopmat` on KHR cooperative matrices where the device has them and the head
//! suits, after `to_f16` of the keys and values into the program scratch; else
//! `block_attention_tiled` (heads up to 256) or `block_attention` (a workgroup per head and row).

use tandem_backend_api::{BackendError, Graph, Op, ValueId};
use tandem_gpu_kit::attention::{TILED_BLOCK_ROWS, TILED_MAX_HEAD_DIM};
use tandem_gpu_kit::launch::{div_up, spread};

use super::cmd::{Access, Cmd, Push};
use super::Ctx;

/// Query rows one workgroup of `block_attention_coopmat` attends.
const COOPMAT_ROWS: usize = 128;

/// The largest head `block_attention_coopmat` takes (8 fragments of 16: its registers and
/// shared memory are sized for up to that).
const COOPMAT_MAX_HEAD_DIM: usize = 128;

/// Whether a block attention of heads of `head_dim` takes `block_attention_coopmat`: where the
/// device has cooperative matrices, the head has a multiple of 4 dimensions up to 128 (the
/// kernel pads it to a multiple of 16 in shared memory) and q is 16-byte aligned (vec4 loads).
/// `TANDEM_VULKAN_ATTN_COOPMAT=0` keeps `block_attention_tiled`, for A/B runs.
fn takes_coopmat(coopmat: bool, head_dim: usize, q_aligned: bool) -> bool {
    let off = std::env::var("TANDEM_VULKAN_ATTN_COOPMAT").is_ok_and(|v| v == "0");
    coopmat && !off && q_aligned && head_dim.is_multiple_of(4) && head_dim <= COOPMAT_MAX_HEAD_DIM
}

/// Bytes of `n` f16 values, rounded up to 16 (where the next area may start).
fn f16_bytes(n: usize) -> u64 {
    (n as u64 * 2).next_multiple_of(16)
}

/// Bytes of scratch the block attentions of `graph` need on a device with (`coopmat`) or without
/// cooperative matrices: the f16 keys and values of the largest.
pub(super) fn scratch_bytes(graph: &Graph, coopmat: bool) -> u64 {
    graph
        .nodes
        .iter()
        .filter_map(|n| match n.op {
            Op::BlockAttention { heads, head_dim, .. } if takes_coopmat(coopmat, head_dim, true) => {
                Some(2 * f16_bytes(graph.rows * heads * head_dim))
            }
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// The fields of one `Op::BlockAttention`.
pub(super) struct BlockAttention {
    pub q: ValueId,
    pub k: ValueId,
    pub v: ValueId,
    pub heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub block: usize,
}

/// The commands of a block attention writing `out`.
pub(super) fn lower(
    ctx: &Ctx,
    coopmat: bool,
    a: &BlockAttention,
    out: ValueId,
) -> Result<Vec<Cmd>, BackendError> {
    let rows = ctx.rows(a.q);
    let push = |k: u64, v: u64| -> Result<Vec<u8>, BackendError> {
        Ok(Push::default()
            .u64(ctx.addr(a.q)?)
            .u64(k)
            .u64(v)
            .u64(ctx.addr(out)?)
            .u32(a.heads as u32)
            .u32(a.head_dim as u32)
            .u32(rows as u32)
            .u32(a.block as u32)
            .f32(a.scale)
            .0)
    };
    let (q, out_span) = (ctx.span(a.q)?, ctx.span(out)?);
    if takes_coopmat(coopmat, a.head_dim, ctx.addr(a.q)?.is_multiple_of(16)) {
        let count = rows * a.heads * a.head_dim;
        let k16 = (ctx.scratch.0, ctx.scratch.0 + f16_bytes(count));
        let v16 = (k16.1, k16.1 + f16_bytes(count));
        if v16.1 > ctx.scratch.1 {
            return Err(BackendError::internal(format!(
                "block_attention_coopmat's f16 keys and values ({rows} x {}) do not fit the program's scratch",
                a.heads * a.head_dim
            )));
        }
        // Its head in fragments of 16 (specialisation constant 1) and the probe bits (0).
        let frags = a.head_dim.div_ceil(16) as u32;
        return Ok(vec![
            super::matmul::to_f16(ctx.span(a.k)?, k16, count),
            super::matmul::to_f16(ctx.span(a.v)?, v16, count),
            Cmd::Dispatch {
                kernel: "block_attention_coopmat".into(),
                spec: [super::attention::coopmat_mode(), frags],
                push: push(k16.0, v16.0)?,
                groups: [a.heads as u32, div_up(rows, COOPMAT_ROWS), 1],
                access: Access::new([q, k16, v16], [out_span]),
            },
        ]);
    }
    // Heads up to 256: tiles of 32 query rows sharing each key tile (attention_tiled's
    // scheme); larger heads a workgroup per (head, row).
    let (kernel, groups) = if a.head_dim <= TILED_MAX_HEAD_DIM {
        (
            "block_attention_tiled",
            [a.heads as u32, div_up(rows, TILED_BLOCK_ROWS), 1],
        )
    } else {
        let [gx, gy] = spread((rows * a.heads) as u32);
        ("block_attention", [gx, gy, 1])
    };
    Ok(vec![Cmd::Dispatch {
        kernel: kernel.into(),
        spec: [0, 0],
        push: push(ctx.addr(a.k)?, ctx.addr(a.v)?)?,
        groups,
        access: Access::new([q, ctx.span(a.k)?, ctx.span(a.v)?], [out_span]),
    }])
}
