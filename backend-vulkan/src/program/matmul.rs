//! Which kernel runs a matmul, and why: the one place that decides it.

use tandem_backend_api::kit::plan::value_rows;
use tandem_backend_api::{BackendError, DType, ValueId, ValueShape, WeightRef};
use tandem_gpu_kit::launch::{div_up, spread};
use tandem_gpu_kit::matmul::{dot_columns, dot_rows, q4k_matvec_shape, DECODE_ROWS};

use super::cmd::{Access, Cmd, Push, Span};
use super::{format_name, Ctx, WG};
use crate::memory::Place;
use crate::VulkanBackend;

/// Rows from which a matmul takes the tiled matrix-matrix kernel instead of the matrix-vector
/// one (block formats other than q4_k: at 32 rows on the H100 the tiled kernel took 5.5 ms per
/// step for a 4B model's q8_0 logits, `matvec_q8_0` 14.4): where decode ends for both backends.
const TILED_ROWS: usize = DECODE_ROWS;

/// The same for q4_k and the float formats: up to a tile's worth of rows (batched decode) their
/// matrix-vector kernels, reading each weight once per 8 rows, beat the tiled kernel on the
/// H100 (4B f16 at 32 rows: 41.7 ms of matmul per step against 86.6).
const TILED_ROWS_WIDE: usize = 64;

/// `matvec_<fmt>`'s weight rows per workgroup in split mode (block formats, one input row): the
/// workgroup's 128 invocations split the k of 4 rows, which share each slot of x loaded; a 4B
/// model's smallest matrix (2560 rows) still makes 640 workgroups. On the H100 (4B q4_k, one
/// row) 4 rows took 2.58 ms of q4_k matmul per step, 2 rows 3.62, 8 rows 3.04.
const MATVEC_COLS: usize = 4;

/// `matvec_<fmt>`'s subgroup mode (float formats, and several input rows): each subgroup takes
/// its own weight rows, two at a time.
const MATVEC_SUBGROUP_ROWS: u32 = 256;

/// `matvec_<fmt>`'s slots per invocation and loop trip for one input row of float weights, with
/// 8 weight rows per workgroup (two per subgroup) whatever the product's size. H200, 4B f16
/// decode at batch 1 (`bench/f16-decode-tune.sh`, bench/results/2026-11-29-f16-decode): 231.8
/// tok/s against 216.9 with the kernel's default (two slots, and 4 rows per workgroup below 8192
/// weight rows); four slots 200.9, 16 rows per workgroup 203.7.
const FLOAT_ONE_ROW_SLOTS: u32 = 1;

/// Rows from which a matmul takes the cooperative-matrix kernel (`matmul_coopmat_<fmt>`) where
/// the device has it (prefill).
const COOPMAT_ROWS: usize = 64;

/// The tuning variable `name` as a whole number within `range`; `None` when unset, unparsable
/// or out of range (the knobs below).
fn env_usize(name: &str, range: std::ops::RangeInclusive<usize>) -> Option<usize> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|v| range.contains(v))
}

/// `TANDEM_VULKAN_MATVEC_COLS` (1 to 16): a fixed `matvec_<fmt>` rows per workgroup, for tuning
/// runs.
fn matvec_cols_override() -> Option<usize> {
    env_usize("TANDEM_VULKAN_MATVEC_COLS", 1..=16)
}

/// `TANDEM_VULKAN_MATVEC_U` (1 to 4): `matvec_<fmt>`'s slots per invocation and loop trip (by
/// default two for one input row and at most two weight rows in hand, else one), for tuning
/// runs.
fn matvec_slots_override() -> Option<u32> {
    env_usize("TANDEM_VULKAN_MATVEC_U", 1..=4).map(|u| u as u32)
}

/// `TANDEM_VULKAN_TILED_ROWS`: a fixed row count from which matmuls take the tiled kernel, for
/// tuning runs.
fn tiled_rows_override() -> Option<usize> {
    env_usize("TANDEM_VULKAN_TILED_ROWS", 0..=usize::MAX)
}

/// `matmul_coopmat_<fmt>`'s tile for a product of `rows` x `n`: (input rows, weight rows) per
/// workgroup. 128 x 128 where there are 128 rows (each subgroup 64 x 64: sixteen 16x16
/// accumulators), else the rows rounded up to 32 or 64 by 128 weight rows; 64 weight rows where
/// `n` is no more than 64. `TANDEM_VULKAN_COOPMAT_TILE=<bx>x<bw>` (bx 32, 64 or 128; bw 64 or
/// 128) fixes it, for tuning runs.
fn coopmat_tile(rows: usize, n: usize) -> (usize, usize) {
    let forced = std::env::var("TANDEM_VULKAN_COOPMAT_TILE").ok().and_then(|v| {
        let (a, b) = v.split_once('x')?;
        let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
        (matches!(a, 32 | 64 | 128) && matches!(b, 64 | 128)).then_some((a, b))
    });
    forced.unwrap_or_else(|| {
        let bx = if rows > 64 {
            128
        } else if rows > 32 {
            64
        } else {
            32
        };
        (bx, if n <= 64 { 64 } else { 128 })
    })
}

/// `matmul_coopmat`'s MODE bits (see the kernel): `TANDEM_VULKAN_COOPMAT_MODE` (0 to 31), for
/// tuning runs that measure where its time goes; 0 otherwise.
fn coopmat_mode() -> u32 {
    env_usize("TANDEM_VULKAN_COOPMAT_MODE", 0..=31).unwrap_or(0) as u32
}

/// Workgroups a `matmul_coopmat` grid should reach before its k is split: two per SM of the
/// H100's 132. `TANDEM_VULKAN_COOPMAT_GROUPS` changes it, for tuning runs.
const COOPMAT_TARGET_GROUPS: usize = 264;

/// Fewest k elements of a `matmul_coopmat` split-k slice.
const COOPMAT_KSLICE_MIN: usize = 512;

/// Most `matmul_coopmat` split-k slices.
const COOPMAT_MAX_KSLICES: usize = 8;

/// The k elements per slice of a split-k `matmul_coopmat` whose grid has `groups` tiles, a
/// multiple of 64 (of its BK, 32 or 64, and of the block formats' unit), or 0: k unsplit. Enough slices for
/// [`COOPMAT_TARGET_GROUPS`] workgroups, each at least [`COOPMAT_KSLICE_MIN`] long.
/// `TANDEM_VULKAN_COOPMAT_KSPLIT=n` asks for n slices (0 or 1: none), for tuning runs.
fn coopmat_kslice(groups: usize, k: usize) -> usize {
    let target = env_usize("TANDEM_VULKAN_COOPMAT_GROUPS", 1..=1 << 20).unwrap_or(COOPMAT_TARGET_GROUPS);
    let slices = env_usize("TANDEM_VULKAN_COOPMAT_KSPLIT", 0..=64).unwrap_or_else(|| {
        target
            .div_ceil(groups.max(1))
            .min(k / COOPMAT_KSLICE_MIN)
            .min(COOPMAT_MAX_KSLICES)
    });
    if slices <= 1 {
        return 0;
    }
    let kslice = k.div_ceil(64).div_ceil(slices) * 64;
    if kslice >= k {
        0
    } else {
        kslice
    }
}

/// Whether a `matmul_coopmat` over block-format weights dequantises them to f16 first (one
/// pass over the matrix, into the program scratch) and runs `matmul_coopmat_f16`:
/// `TANDEM_VULKAN_COOPMAT_DEQUANT=1`, for tuning runs.
fn coopmat_dequant(dt: DType) -> bool {
    let block = !matches!(dt, DType::F32 | DType::F16 | DType::Bf16);
    block && std::env::var("TANDEM_VULKAN_COOPMAT_DEQUANT").is_ok_and(|v| v == "1")
}

/// Whether `matmul_coopmat` takes its input as f16, converted once per matmul by `to_f16` into
/// the program scratch (MODE bit 3), rather than converting f32 in every workgroup's loads (half
/// the bytes and none of the conversions in the tile loads; H200, 1B q4_k, 512 rows: 7.7 ms of
/// q5_0 products against 8.4). `TANDEM_VULKAN_COOPMAT_X16=0` turns it off, for tuning runs.
fn coopmat_x16() -> bool {
    std::env::var("TANDEM_VULKAN_COOPMAT_X16").map_or(true, |v| v != "0")
}

/// Whether `matmul_coopmat` takes k 64 at a time (MODE bit 5) rather than 32:
/// `TANDEM_VULKAN_COOPMAT_BK=64`, for tuning runs.
fn coopmat_bk64() -> bool {
    std::env::var("TANDEM_VULKAN_COOPMAT_BK").is_ok_and(|v| v == "64")
}

/// Invocations of `to_f16`'s workgroups (`local_size_x`), each converting 4 values.
const TO_F16_WG: usize = 256;

/// `to_f16` of the `count` f32 values at `src` into `dst` (2 bytes each), one invocation per 4
/// values: `matmul_cm2`'s and `matmul_khr`'s f16 inputs, block attention's f16 keys and values.
pub(super) fn to_f16(src: Span, dst: Span, count: usize) -> Cmd {
    let [gx, gy] = spread(div_up(count, 4 * TO_F16_WG));
    Cmd::Dispatch {
        kernel: "to_f16".into(),
        spec: [0, 0],
        push: Push::default().u64(src.0).u64(dst.0).u32(count as u32).0,
        groups: [gx, gy, 1],
        access: Access::new([src], [dst]),
    }
}

/// Rows from which a product on the KHR path takes `matmul_khr` (one 128 x 128 tile shape,
/// loads two k steps ahead) rather than `matmul_coopmat` (tile shapes chosen by size, tuning
/// branches). Measured at 512 rows (H200, prefill 512, bench/results/2026-11-28-prefill-khr2):
/// 4B q4_k 11,430 tok/s against 7,496, 1B 24,728 against 22,023; below 128 rows a 128-row tile
/// would be mostly empty, and `matmul_coopmat`'s 32- and 64-row tiles are kept.
const KHR_ROWS: usize = 128;

/// The KHR cooperative-matrix prefill kernel for `rows` rows of weights in format `dt`: from
/// [`KHR_ROWS`] rows `matmul_khr` for q4_k and `matmul_khr64` for every other format (k 64 at a
/// time, whole 128-byte pieces of f16 rows; H200, KHR path, prefill 512, same calls
/// (bench/results/2026-11-29-khr64): 4B f16's products 30.2 ms a step against 46.6 on
/// `matmul_khr`, 1B's q5_0 products 7.0 against 8.3, but 4B q4_k's 32.9 against 31.0),
/// `matmul_coopmat` below. `TANDEM_VULKAN_COOPMAT_KERNEL=coopmat`, `=khr` or `=khr64` forces
/// one, for A/B runs and for the tuning variables that only `matmul_coopmat` reads (tile shapes,
/// `_X16`, `_BK`, `_MODE`); `=khrp` takes `matmul_khrp_f16`, `matmul_khr` without its f16
/// weight loads, a probe of where the f16 products' time goes (f16 weights only; wrong results).
fn coopmat_kernel(rows: usize, dt: DType) -> &'static str {
    match std::env::var("TANDEM_VULKAN_COOPMAT_KERNEL").as_deref() {
        Ok("coopmat") => "matmul_coopmat",
        Ok("khr") => "matmul_khr",
        Ok("khr64") => "matmul_khr64",
        // The probe build without weight loads (f16 weights only; wrong results).
        Ok("khrp") => "matmul_khrp",
        _ if rows >= KHR_ROWS && dt == DType::Q4K => "matmul_khr",
        _ if rows >= KHR_ROWS => "matmul_khr64",
        _ => "matmul_coopmat",
    }
}

/// Whether `kernel` is one of the KHR cooperative-matrix prefill kernels.
fn is_coopmat(kernel: &str) -> bool {
    kernel.starts_with("matmul_coopmat") || kernel.starts_with("matmul_khr")
}

/// Whether a KHR cooperative-matrix product reads its input as f16 (`matmul_khr` always does).
fn takes_x16(kernel: &str) -> bool {
    coopmat_x16() || kernel.starts_with("matmul_khr")
}

/// What a tensor-core product (`matmul_cm2*`, `matmul_coopmat*`, `matmul_khr*`) stages in the
/// program scratch, in this order: its f16 input (`to_f16`), its weight dequantised to f16
/// (`dequant_f16_<fmt>`, after which the f16 build of the kernel runs), its split-k partial
/// tiles. [`scratch_bytes`] sizes the scratch from it and the lowering lays it out by it.
struct Staging {
    /// Bytes of the f16 input (0: the kernel reads the f32 input itself).
    x16: u64,
    /// Bytes of the dequantised weight (0: the kernel decodes the weight itself).
    w16: u64,
    /// Bytes of the split-k partial tiles (0: k whole).
    part: u64,
    /// The kernel and specialisation constants that multiply the dequantised weight.
    f16_kernel: (String, [u32; 2]),
}

impl Staging {
    /// The staging of product `c` (`None` for the other kernels).
    fn of(c: &Choice, dt: DType, rows: usize, n: usize, k: usize) -> Option<Staging> {
        let (x16, dequant, f16_kernel) = if c.kernel.starts_with("matmul_cm2") {
            // The same family (`matmul_cm2` or `matmul_cm2h`: the name without its format).
            let family = c
                .kernel
                .strip_suffix(&format!("_{}", format_name(dt)))
                .unwrap_or(&c.kernel);
            let spec = [c.spec[0], (c.spec[1] & 0xFFFF) | cm2_mode(DType::F16) << 16];
            (true, cm2_dequant(dt, rows), (format!("{family}_f16"), spec))
        } else if is_coopmat(&c.kernel) {
            let family = if c.kernel.starts_with("matmul_khr") {
                "matmul_khr64"
            } else {
                "matmul_coopmat"
            };
            let kernel = format!("{family}_f16");
            (takes_x16(&c.kernel), coopmat_dequant(dt), (kernel, c.spec))
        } else {
            return None;
        };
        Some(Staging {
            x16: if x16 { cm2_input_bytes(rows, k) } else { 0 },
            w16: if dequant { (n * k * 2) as u64 } else { 0 },
            part: cm2_part_bytes(rows, n, k, c.kslice),
            f16_kernel,
        })
    }

    /// Bytes of scratch it takes.
    fn bytes(&self) -> u64 {
        self.x16 + self.w16.next_multiple_of(256) + self.part
    }
}

/// The largest of `f(rows, n, k, format)` over the matmuls of `graph` (0 without any).
fn max_over_matmuls(
    graph: &tandem_backend_api::Graph,
    shapes: &[ValueShape],
    f: impl Fn(usize, usize, usize, DType) -> Option<u64>,
) -> u64 {
    graph
        .nodes
        .iter()
        .filter_map(|node| match &node.op {
            tandem_backend_api::Op::MatMul { x, weight, .. } => {
                let rows = value_rows(graph, shapes.get(x.0 as usize)?);
                f(
                    rows,
                    weight.desc.shape[0],
                    weight.desc.shape[1],
                    weight.desc.dtype,
                )
            }
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// Bytes of scratch the KHR cooperative-matrix products of `graph` stage (0 without cooperative
/// matrices): the largest [`Staging`].
pub fn coopmat_scratch_bytes(graph: &tandem_backend_api::Graph, shapes: &[ValueShape], unit: Unit) -> u64 {
    if !unit.coopmat {
        return 0;
    }
    let unit = Unit { cm2: false, ..unit };
    max_over_matmuls(graph, shapes, |rows, n, k, dt| {
        Staging::of(&choose(rows, n, k, dt, unit), dt, rows, n, k).map(|s| s.bytes())
    })
}

/// `TANDEM_VULKAN_COOPMAT_ROWS`: a fixed row count from which matmuls take the
/// cooperative-matrix kernel, for tuning runs (batched decode).
fn coopmat_rows_override() -> Option<usize> {
    env_usize("TANDEM_VULKAN_COOPMAT_ROWS", 1..=usize::MAX)
}

/// `TANDEM_VULKAN_ROWS_NC` (1 to 8: the kernel writes NC x R <= 64 sums): `matvec_rows_q4_k`'s
/// weight rows per workgroup, for tuning runs (4 by default).
fn rows_nc_override() -> Option<usize> {
    env_usize("TANDEM_VULKAN_ROWS_NC", 1..=8)
}

/// `matmul_cm2_<fmt>`'s weight rows per tile from [`CM2_SMALL_ROWS`] rows: every split
/// boundary must be a multiple of the tile's rows.
pub const CM2_BM: usize = 128;

/// Rows below which `matmul_cm2_<fmt>` takes tiles of [`CM2_SMALL_BM`] weight rows: batched
/// decode, whose 32 rows make one column of tiles, so the grid is the weight rows over the
/// tile's (1B's 1152-wide outputs: 9 workgroups of 128 rows on the H100's 132 SMs). H100, 32
/// sequences, 512 + 64 tokens: 1B q4_k 1,223 tok/s against 1,090 with 128-row tiles, 4B q4_k
/// 719 against 628 (`bench/results/2026-11-25-vulkan-batched/`).
const CM2_SMALL_ROWS: usize = 128;

/// `matmul_cm2_<fmt>`'s weight rows per tile below [`CM2_SMALL_ROWS`] rows.
const CM2_SMALL_BM: usize = 64;

/// `matmul_cm2_<fmt>`'s weight rows per tile for a product of `rows` rows: [`CM2_SMALL_BM`]
/// below [`CM2_SMALL_ROWS`] rows, else [`CM2_BM`]; `TANDEM_VULKAN_CM2_BM` (64, 128 or 256)
/// fixes it, for tuning runs.
fn cm2_bm(rows: usize) -> usize {
    std::env::var("TANDEM_VULKAN_CM2_BM")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|b| matches!(b, 64 | 128 | 256))
        .unwrap_or(if rows < CM2_SMALL_ROWS {
            CM2_SMALL_BM
        } else {
            CM2_BM
        })
}

/// Workgroups a `matmul_cm2` grid of fewer than [`CM2_SMALL_ROWS`] rows should reach before its
/// k is split: four per SM of the H100's 132. Batched decode's grids are small (32 rows of
/// 1B's 1152-wide outputs make 18 tiles). H100, 4B q4_k, 32 sequences: 16 slices everywhere
/// decoded 1,339 tok/s, 4 slices 1,243, enough slices for 264 workgroups 1,267.
const CM2_TARGET_GROUPS: usize = 528;

/// Fewest k elements of a split-k slice.
const CM2_KSLICE_MIN: usize = 256;

/// Most split-k slices.
const CM2_MAX_KSLICES: usize = 16;

/// The k elements per slice of a split-k `matmul_cm2` of `rows` rows whose grid has `groups`
/// tiles, a multiple of 64 (so of every BK; of 256 for q4_k, whose tile loop walks k a block at
/// a time), or 0: k unsplit. Split only below
/// [`CM2_SMALL_ROWS`] rows, into enough slices for [`CM2_TARGET_GROUPS`] workgroups, each at
/// least [`CM2_KSLICE_MIN`] long. `TANDEM_VULKAN_CM2_KSPLIT=0` turns it off, `=n` asks for n
/// slices at every row count (tuning runs).
fn cm2_kslice(rows: usize, groups: usize, k: usize, dt: DType) -> usize {
    let forced = std::env::var("TANDEM_VULKAN_CM2_KSPLIT")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let slices = match forced {
        Some(n) => n.min(CM2_MAX_KSLICES),
        None if rows < CM2_SMALL_ROWS => CM2_TARGET_GROUPS
            .div_ceil(groups.max(1))
            .min(k / CM2_KSLICE_MIN)
            .min(CM2_MAX_KSLICES),
        None => 1,
    };
    if slices <= 1 {
        return 0;
    }
    // q4_k's tile loop walks k a block (256) at a time, its scales staged once per block.
    let unit = if dt == DType::Q4K { 256 } else { 64 };
    let kslice = k.div_ceil(unit).div_ceil(slices) * unit;
    if kslice >= k {
        0
    } else {
        kslice
    }
}

/// Bytes of f32 partial tiles a split-k `matmul_cm2` (`kslice` nonzero) of `rows` x `n` over
/// `k` writes: `[slices][rows][n]`.
fn cm2_part_bytes(rows: usize, n: usize, k: usize, kslice: usize) -> u64 {
    if kslice == 0 {
        0
    } else {
        (k.div_ceil(kslice) * rows * n * 4) as u64
    }
}

/// Rows from which a matmul takes `matmul_cm2_<fmt>` where the device has it: batched decode of
/// 16 sequences and more. H100, 16 sequences, with split k: 1B q4_k 1,893 tok/s against 1,141
/// with `matvec_rows_q4_k` and `matvec_q5_0`, 4B 710 against 622; at 8 sequences 1B 1,088
/// against 1,009 but 4B 384 against 542 (before `matvec_dot`).
const CM2_ROWS: usize = 16;

/// `TANDEM_VULKAN_CM2_ROWS`: a fixed row count from which matmuls take `matmul_cm2_<fmt>` where
/// the device has it, for tuning runs (batched decode).
fn cm2_rows_override() -> Option<usize> {
    env_usize("TANDEM_VULKAN_CM2_ROWS", 1..=usize::MAX)
}

/// Whether a product of `rows` rows takes the KHR path's kernel even where the device has
/// cooperative matrix 2: only in comparison runs, `TANDEM_VULKAN_CM2_KHR=1` (q4_k on
/// `matmul_khr`, f16 on `matmul_khr64`, from [`KHR_ROWS`] rows; f16 keeps `matmul_cm2h` under
/// f16 accumulators). Until `matmul_cm2` told NVIDIA's compiler that its interior tiles are
/// aligned (MODE bit 3) these were the faster kernels there; since, on the H200 (4B, prefill
/// 512, products a step): f16 18.24 ms on `matmul_cm2` against 30.13 on `matmul_khr64`, q4_k
/// 28.17 decoded in `matmul_cm2`'s loads against 29.45 on `matmul_khr`
/// (bench/results/2026-11-29-cm2-hints/); q4_k's prefill dequantises first ([`cm2_dequant`]).
fn takes_khr(dt: DType, rows: usize, f16_acc: bool) -> bool {
    rows >= KHR_ROWS
        && std::env::var("TANDEM_VULKAN_CM2_KHR").is_ok_and(|v| v == "1")
        && match dt {
            DType::Q4K => true,
            DType::F16 => !f16_acc,
            _ => false,
        }
}

/// `matmul_cm2_<fmt>`'s input rows per tile: 128, or the rows rounded up to 32 below that.
/// `TANDEM_VULKAN_CM2_BN` (32, 64, 96, ... 256) fixes it, for tuning runs.
fn cm2_bn(rows: usize) -> usize {
    std::env::var("TANDEM_VULKAN_CM2_BN")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|b| (32..=256).contains(b) && b.is_multiple_of(32))
        .unwrap_or_else(|| rows.next_multiple_of(32).min(128))
}

/// `matmul_cm2`'s MODE bits (see the kernel) for weights of format `dt`: the interior tiles
/// unclamped and with their alignment hints, k 64 at a time, and for f16 weights (which
/// dequantised formats are multiplied as) 8 slices unrolled. H200, 4B, 512 rows, products a
/// step (bench/results/2026-11-29-cm2-hints/): f16 18.24 ms (MODE 14) against 19.51 (10), 32.15
/// with every load clamped and no hints (3, the default before) and 107.95 unclamped without
/// hints (2); q4_k decoded in the loads 28.17 (10) against 61.47 (2); batched decode of 32
/// sequences 2,786 tok/s (10) against 2,007 (2).
/// `TANDEM_VULKAN_CM2_MODE` (0 to 63) fixes it, for tuning runs.
fn cm2_mode(dt: DType) -> u32 {
    std::env::var("TANDEM_VULKAN_CM2_MODE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|m| *m <= 63)
        .unwrap_or(if dt == DType::F16 { 14 } else { 10 })
}

/// Whether a `matmul_cm2` of `rows` rows over block-format weights dequantises them to f16
/// first (one pass over the matrix, into the program scratch) and runs `matmul_cm2_f16`, rather
/// than decoding each element inside the tile loads: from [`CM2_DEQUANT_ROWS`] rows.
/// `TANDEM_VULKAN_CM2_DEQUANT=0|1` overrides it, for tuning runs.
fn cm2_dequant(dt: DType, rows: usize) -> bool {
    let block = !matches!(dt, DType::F32 | DType::F16 | DType::Bf16);
    block && std::env::var("TANDEM_VULKAN_CM2_DEQUANT").map_or(rows >= CM2_DEQUANT_ROWS, |v| v != "0")
}

/// The NV cooperative-matrix-2 kernel: `matmul_cm2`, or with f16 accumulators (`f16_acc`,
/// option `precision = "fast"`: llama.cpp's default precision for these products)
/// `matmul_cm2h`. `TANDEM_VULKAN_CM2_ACC=f16|f32` forces either, for speed and KL-divergence
/// runs.
fn cm2_kernel(f16_acc: bool) -> &'static str {
    match std::env::var("TANDEM_VULKAN_CM2_ACC").as_deref() {
        Ok("f16") => "matmul_cm2h",
        Ok("f32") => "matmul_cm2",
        _ if f16_acc => "matmul_cm2h",
        _ => "matmul_cm2",
    }
}

/// Rows from which [`cm2_dequant`] dequantises. H100, q4_k, 512 rows: 4B prefill 5,843 tok/s
/// against 5,021 decoding in the loads, 1B 15,093 against 11,472; at 32 rows (batched decode)
/// 519 against 630.
const CM2_DEQUANT_ROWS: usize = 128;

/// `TANDEM_VULKAN_Q4K_MATVEC`: `old` sends one-row q4_k matmuls back to `matvec_q4_k`'s split
/// mode; `<nr>x<warps>` (nr 1, 2 or 4; warps 1 to 8) fixes `matvec_q4k`'s shape, for tuning and
/// test runs.
fn q4k_matvec_override() -> Option<Option<(u32, u32)>> {
    let v = std::env::var("TANDEM_VULKAN_Q4K_MATVEC").ok()?;
    if v == "old" {
        return Some(None);
    }
    let (nr, w) = v.split_once('x')?;
    let (nr, w): (u32, u32) = (nr.parse().ok()?, w.parse().ok()?);
    (matches!(nr, 1 | 2 | 4) && (1..=8).contains(&w)).then_some(Some((nr, w)))
}

/// What the device offers a matmul: cooperative matrices (`coopmat`), NV cooperative matrix 2
/// where the node suits it (`cm2`), packed 8-bit integer dot products (`int_dot`), whether
/// those take their input at 8 bits (`narrow`) rather than 16, and whether the
/// cooperative-matrix-2 kernels accumulate in f16 (`f16_acc`) rather than f32; the last two are
/// option `precision = "fast"` (docs/precision.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Unit {
    pub coopmat: bool,
    pub cm2: bool,
    pub int_dot: bool,
    pub narrow: bool,
    pub f16_acc: bool,
}

/// `matvec_dot_<fmt>`'s weight rows per workgroup (4, 2 or 1) are the most that leave
/// `tandem_gpu_kit::matmul::DOT_MIN_GROUPS` (1024) workgroups below 4 input rows per
/// workgroup; from 4 it takes 1 (H100, 8 sequences, 8-bit input, 1B 1,791 tok/s against 1,552
/// with 4 rows, 4B 933 against 832): 1B's 1152-wide products at one row take 1 (1,152
/// workgroups).
const DOT_MOST_COLUMNS_FROM_4_ROWS: usize = 1;

/// `TANDEM_VULKAN_DOT_NC` (1 to 8): `matvec_dot_<fmt>`'s weight rows per workgroup, for tuning
/// runs.
fn dot_nc_override() -> Option<usize> {
    env_usize("TANDEM_VULKAN_DOT_NC", 1..=8)
}

/// Weight elements (n x k) from which a one-row q4_k product takes `matvec_dot_q4_k` (its input
/// quantised by a `quantize_q8` dispatch first) rather than `matvec_q4k`. The integer dots
/// decode a value in fewer instructions than `matvec_q4k`'s float decode, which stays near
/// 1.3 TB/s on the H200, but they lose on the smaller products. H200, decode at batch 1
/// (`bench/decode-probe.sh`, bench/results/2026-11-29-decode-norm-dot): 27B, whose products
/// are 22M to 231M elements, 76.2 tok/s with none on the dots, 86.0 with all, 85.9 from 100M
/// (its FFN); 4B (5M to 52M) 277.8 with none, 259.3 with all, 270.8 from 40M (its FFN up).
const DOT_Q4K_ONE_ROW_FROM: usize = 100 << 20;

/// Whether a one-row q4_k product of `n x k` takes `matvec_dot_q4_k` ([`DOT_Q4K_ONE_ROW_FROM`]).
/// For tuning runs: `TANDEM_VULKAN_DOT_Q4K1=1` sends every one of them there, `=0` none;
/// `TANDEM_VULKAN_DOT_Q4K1_FROM=<elements>` moves the threshold.
fn dot_q4k_one_row(n: usize, k: usize) -> bool {
    match std::env::var("TANDEM_VULKAN_DOT_Q4K1").as_deref() {
        Ok("1") => return true,
        Ok("0") => return false,
        _ => {}
    }
    let from = env_usize("TANDEM_VULKAN_DOT_Q4K1_FROM", 0..=usize::MAX).unwrap_or(DOT_Q4K_ONE_ROW_FROM);
    n.saturating_mul(k) >= from
}

/// Whether a `matvec_dot` choice takes its input at 16 bits (two byte planes, twice the dot
/// products; as exact as the CPU backend's activations: `precision = "exact"`) rather than 8
/// (ggml's q8_1, `precision = "fast"`; docs/precision.md): bit 16 of its second constant.
fn dot_wide(c: &Choice) -> bool {
    c.spec[1] >> 16 & 1 == 1
}

/// Bytes of scratch the integer-dot-product matmuls of `graph` need (0 without `int_dot`): the
/// largest quantised input. Counted as if no node took cooperative matrix 2, which only makes
/// more nodes take `matvec_dot`.
pub fn dot_scratch_bytes(graph: &tandem_backend_api::Graph, shapes: &[ValueShape], unit: Unit) -> u64 {
    if !unit.int_dot {
        return 0;
    }
    let unit = Unit { cm2: false, ..unit };
    max_over_matmuls(graph, shapes, |rows, n, k, dt| {
        let c = choose(rows, n, k, dt, unit);
        c.kernel
            .starts_with("matvec_dot")
            .then(|| tandem_gpu_kit::matmul::dot_input_bytes(rows, k, dot_wide(&c)))
    })
}

/// The kernel a matmul of `rows` input rows over an `n x k` weight of format `dt` takes, and its
/// specialisation constants and grid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub kernel: String,
    pub spec: [u32; 2],
    pub groups: [u32; 3],
    /// `matmul_cm2`'s split-k slice (k elements; `groups[2]` slices), 0 when k is whole.
    pub kslice: usize,
}

/// Every kernel variant (name, specialisation constants) a matmul of `graph` may take at any
/// row count from 1 to `most_rows` on a unit like `unit` (with and without cooperative matrix
/// 2 where the device has it: a node takes it only where its splits suit it): what a server's
/// step shapes will ask for, created together up front ([`crate::pipelines::Pipelines::prepare`])
/// rather than one shape at a time. Each distinct weight shape and format is counted once.
pub fn variants(graph: &tandem_backend_api::Graph, unit: Unit, most_rows: usize) -> Vec<(String, [u32; 2])> {
    let mut shapes: Vec<(usize, usize, DType)> = Vec::new();
    for node in &graph.nodes {
        if let tandem_backend_api::Op::MatMul { weight, .. } = &node.op {
            if let [n, k] = weight.desc.shape[..] {
                let key = (n, k, weight.desc.dtype);
                if !shapes.contains(&key) {
                    shapes.push(key);
                }
            }
        }
    }
    let units: &[Unit] = if unit.cm2 {
        &[unit, Unit { cm2: false, ..unit }]
    } else {
        &[unit]
    };
    let mut out: Vec<(String, [u32; 2])> = Vec::new();
    for &(n, k, dt) in &shapes {
        for &u in units {
            for rows in 1..=most_rows.max(1) {
                let c = choose(rows, n, k, dt, u);
                let mut add = |key: (String, [u32; 2])| {
                    if !out.contains(&key) {
                        out.push(key);
                    }
                };
                match Staging::of(&c, dt, rows, n, k) {
                    // What a tensor-core product dispatches: its f16 input, the dequantised
                    // weight multiplied by the f16 kernel (as the lowering rewrites it) or the
                    // format's own kernel, the split-k reduction.
                    Some(st) => {
                        if st.x16 > 0 {
                            add(("to_f16".into(), [0, 0]));
                        }
                        if st.w16 > 0 {
                            add((format!("dequant_f16_{}", format_name(dt)), [0, 0]));
                            add(st.f16_kernel);
                        } else {
                            add((c.kernel, c.spec));
                        }
                        if st.part > 0 {
                            add(("matmul_reduce".into(), [0, 0]));
                        }
                    }
                    None => add((c.kernel, c.spec)),
                }
            }
        }
    }
    out
}

/// Decode (few rows) takes a matrix-vector kernel, from TILED_ROWS(_WIDE) rows the tiled one,
/// from COOPMAT_ROWS the cooperative-matrix one where the device has it: `matmul_cm2_<fmt>`
/// where `cm2` says the device has NV cooperative matrix 2 and the node suits it (split
/// boundaries multiples of [`CM2_BM`], 16-byte aligned addresses), else `matmul_khr_<fmt>` from
/// [`KHR_ROWS`] rows and `matmul_coopmat_<fmt>` below.
/// - float rows whose k is not a multiple of 16: `matmul_<fmt>`, one weight row per workgroup;
/// - q4_k, one row: `matvec_q4k` (`TANDEM_VULKAN_Q4K_MATVEC=old`: split-mode `matvec_q4_k`);
/// - q4_k, several rows: `matvec_rows_q4_k`, 4 weight rows x 8 input rows per workgroup (at 32
///   rows on the H100 28.9 ms of a 4B step against 36.0 for `matvec_q4_k`'s subgroup mode);
/// - else `matvec_<fmt>`: split mode for block formats with one row, subgroup mode otherwise
///   (f16 one row: 3.64 ms a 4B step against 3.99 in split mode), R = 1, 2, 4 or 8 input rows
///   per workgroup.
pub fn choose(rows: usize, n: usize, k: usize, dt: DType, unit: Unit) -> Choice {
    let Unit {
        coopmat,
        cm2,
        int_dot,
        narrow,
        f16_acc,
    } = unit;
    let fmt = format_name(dt);
    let float = matches!(dt, DType::F32 | DType::F16 | DType::Bf16);
    let wide = float || dt == DType::Q4K;
    let tiled_from = tiled_rows_override().unwrap_or(if wide { TILED_ROWS_WIDE } else { TILED_ROWS });
    let r: u32 = if rows == 1 {
        1
    } else if rows <= 4 {
        4
    } else {
        8
    };
    if cm2 && coopmat && rows >= cm2_rows_override().unwrap_or(CM2_ROWS) && !takes_khr(dt, rows, f16_acc) {
        let (bm, bn) = (cm2_bm(rows), cm2_bn(rows));
        let (gx, gy) = (div_up(n, bm), div_up(rows, bn));
        let kslice = cm2_kslice(rows, (gx * gy) as usize, k, dt);
        return Choice {
            kernel: format!("{}_{fmt}", cm2_kernel(f16_acc)),
            spec: [bm as u32, bn as u32 | cm2_mode(dt) << 16],
            groups: [gx, gy, if kslice == 0 { 1 } else { k.div_ceil(kslice) as u32 }],
            kslice,
        };
    }
    if rows >= coopmat_rows_override().unwrap_or(COOPMAT_ROWS) && coopmat {
        // Prefill on KHR cooperative matrices: BX input rows x BW weight rows per workgroup,
        // k split where the grid is small.
        // (`matmul_khr` has a compile-time 128 x 128 tile.)
        let kernel = coopmat_kernel(rows, dt);
        let khr = kernel.starts_with("matmul_khr");
        let (bx, bw) = if khr { (128, 128) } else { coopmat_tile(rows, n) };
        let (gx, gy) = (div_up(rows, bx), div_up(n, bw));
        let kslice = coopmat_kslice((gx * gy) as usize, k);
        return Choice {
            kernel: format!("{kernel}_{fmt}"),
            spec: if khr {
                [bw as u32, bx as u32]
            } else {
                [
                    bw as u32
                        | (coopmat_mode() | u32::from(coopmat_x16()) << 3 | u32::from(coopmat_bk64()) << 5)
                            << 16,
                    bx as u32,
                ]
            },
            groups: [gx, gy, if kslice == 0 { 1 } else { k.div_ceil(kslice) as u32 }],
            kslice,
        };
    }
    if rows >= tiled_from {
        return Choice {
            kernel: format!("matmul_tiled_{fmt}"),
            spec: [0, 0],
            groups: [div_up(n, 64), div_up(rows, 64), 1],
            kslice: 0,
        };
    }
    if float && !k.is_multiple_of(16) {
        let [gx, gy] = spread(n as u32);
        return Choice {
            kernel: format!("matmul_{fmt}"),
            spec: [r, 1],
            groups: [gx, gy, div_up(rows, r as usize)],
            kslice: 0,
        };
    }
    if int_dot && !float && k.is_multiple_of(32) && (dt != DType::Q4K || rows > 1 || dot_q4k_one_row(n, k)) {
        // Integer dot products on the quantised input: R = 1, 2, 4 or 8 input rows and NC
        // weight rows per workgroup.
        let r = dot_rows(rows);
        let slices = rows.div_ceil(r);
        let most = if r >= 4 { DOT_MOST_COLUMNS_FROM_4_ROWS } else { 4 };
        let nc = dot_nc_override().unwrap_or(dot_columns(n, slices, most));
        let [gx, gy] = spread(div_up(n, nc));
        return Choice {
            kernel: format!("matvec_dot_{fmt}"),
            spec: [r as u32, nc as u32 | u32::from(!narrow) << 16],
            groups: [gx, gy, slices as u32],
            kslice: 0,
        };
    }
    if dt == DType::Q4K && rows == 1 && k.is_multiple_of(256) {
        let shape = match q4k_matvec_override() {
            Some(forced) => forced,
            None => {
                let (nr, w) = q4k_matvec_shape(n, k / 256);
                Some((nr as u32, w as u32))
            }
        };
        if let Some((nr, w)) = shape {
            let [gx, gy] = spread(div_up(n, 4 * nr as usize));
            return Choice {
                kernel: "matvec_q4k".into(),
                spec: [nr, 32 * w],
                groups: [gx, gy, 1],
                kslice: 0,
            };
        }
    }
    if dt == DType::Q4K && rows > 1 {
        let nc = rows_nc_override().unwrap_or(4);
        let [gx, gy] = spread(div_up(n, nc));
        return Choice {
            kernel: "matvec_rows_q4_k".into(),
            spec: [r, nc as u32],
            groups: [gx, gy, div_up(rows, r as usize)],
            kslice: 0,
        };
    }
    // The ceil(rows / R) row slices of one weight block are neighbouring workgroups (its
    // weights shared through the L2).
    let r = rows.next_power_of_two().min(8);
    let slices = rows.div_ceil(r);
    let subgroup_mode = float || rows > 1;
    // Subgroup mode: 8 rows per workgroup (2 per subgroup) for one row of float weights and
    // where that leaves >= 1024 workgroups, else 4 (one per subgroup). One row of float weights
    // takes one slot a loop trip (FLOAT_ONE_ROW_SLOTS), the others the kernel's default.
    let one_float_row = float && rows == 1;
    let cols = if !subgroup_mode {
        MATVEC_COLS
    } else if one_float_row || div_up(n, 8) as usize * slices >= 1024 {
        8
    } else {
        4
    };
    let cols = matvec_cols_override().unwrap_or(cols);
    let slots = matvec_slots_override().unwrap_or(if one_float_row { FLOAT_ONE_ROW_SLOTS } else { 0 });
    let mode = cols as u32 | if subgroup_mode { MATVEC_SUBGROUP_ROWS } else { 0 } | slots << 9;
    let [gx, gy] = spread(div_up(n, cols).saturating_mul(slices as u32));
    Choice {
        kernel: format!("matvec_{fmt}"),
        spec: [r as u32, mode],
        groups: [gx, gy, 1],
        kslice: 0,
    }
}

/// Bytes of `matmul_cm2`'s f16 input of `rows` x `k`, as placed in the scratch (the
/// dequantised weight, if any, follows it).
fn cm2_input_bytes(rows: usize, k: usize) -> u64 {
    (rows * k * 2).next_multiple_of(256) as u64
}

/// Bytes of scratch `matmul_cm2` needs in `graph` (0 without cooperative matrix 2): the largest
/// f16 input of the matmuls with enough rows to take it, plus the f16 weight where one is
/// dequantised first. Matmuls of fewer rows (the logits of a prefill, over its selected rows)
/// count for nothing: the tied embedding alone would be 1.3 GB of f16 on a 4B model.
pub fn cm2_scratch_bytes(graph: &tandem_backend_api::Graph, shapes: &[ValueShape], unit: Unit) -> u64 {
    if !unit.cm2 {
        return 0;
    }
    let unit = Unit {
        coopmat: true,
        ..unit
    };
    max_over_matmuls(graph, shapes, |rows, n, k, dt| {
        if rows < cm2_rows_override().unwrap_or(CM2_ROWS) {
            return None;
        }
        Staging::of(&choose(rows, n, k, dt, unit), dt, rows, n, k).map(|s| s.bytes())
    })
}

impl VulkanBackend {
    /// An `Op::MatMul` node: `x` times the transposed weight, its columns split over `outputs`.
    pub(super) fn lower_matmul(
        &self,
        ctx: &Ctx,
        x: ValueId,
        weight: &WeightRef,
        splits: &[usize],
        outputs: &[ValueId],
    ) -> Result<Vec<Cmd>, BackendError> {
        let w = self.buffers.get(weight.buffer)?;
        let (n, k) = (weight.desc.shape[0], weight.desc.shape[1]);
        let rows = ctx.rows(x);
        let dt = weight.desc.dtype;
        let mut dsts = [0u64; 4];
        let mut ends = [n as u32; 3];
        let mut acc = 0usize;
        let mut writes = Vec::with_capacity(outputs.len());
        for (s, (width, out)) in splits.iter().zip(outputs).enumerate() {
            dsts[s] = ctx.addr(*out)?;
            writes.push(ctx.span(*out)?);
            acc += width;
            if s < 3 {
                ends[s] = acc as u32;
            }
        }
        // NV cooperative matrix 2: each tile stores into one split output, and the tensor
        // loads and stores need 16-byte aligned bases.
        let aligned = |a: u64| a.is_multiple_of(16);
        let cm2 = self.gpu.coopmat2
            && ends
                .iter()
                .all(|e| (*e as usize).is_multiple_of(cm2_bm(rows)) || *e as usize == n)
            && (w.mem.place == Place::Host || aligned(w.mem.address))
            && dsts[..outputs.len()].iter().all(|d| aligned(*d));
        // A cooperative-matrix-2 kernel still being compiled behind (option `prepare`): the
        // program takes the KHR kernel meanwhile and is rebuilt once that one is made.
        let cm2 = cm2 && {
            let unit = Unit {
                cm2: true,
                ..self.unit()
            };
            let want = choose(rows, n, k, dt, unit);
            let waiting = want.kernel.starts_with("matmul_cm2")
                && self.pipelines.waiting_for(&(want.kernel, want.spec));
            self.stand_in.set(self.stand_in.get() | waiting);
            !waiting
        };
        let unit = Unit { cm2, ..self.unit() };
        let mut c = choose(rows, n, k, dt, unit);
        let mut cmds = Vec::with_capacity(4);
        let mut input = (ctx.addr(x)?, ctx.span(x)?);
        let mut weights = (w.mem.address, dt.row_bytes(k).unwrap_or(0) as u32);
        let mut weight_reads = Vec::new();
        if w.mem.place == Place::Host {
            // A weight in host memory (a prefill op offload): one copy to the device, then the
            // product reads the copy.
            let Some((buffer, span)) = ctx.stream.filter(|s| s.1 .1 - s.1 .0 >= w.mem.size) else {
                return Err(BackendError::internal(format!(
                    "a product's weight ({n} x {k} {}) is in host memory and the program has no stream buffer for it",
                    dt.name()
                )));
            };
            let to = (span.0, span.0 + w.mem.size);
            cmds.push(Cmd::Copy {
                src: w.mem.buffer,
                src_offset: 0,
                dst: buffer,
                size: w.mem.size,
                access: Access::new(Vec::new(), [to]),
            });
            weights.0 = to.0;
            weight_reads.push(to);
        }
        // Split-k partial tiles: where and how large, when `c.kslice` is nonzero.
        let mut part = (0u64, 0u64);
        if c.kernel.starts_with("matmul_khr") && dt == DType::Q4K && !weights.0.is_multiple_of(16) {
            // matmul_khr stages q4_k blocks with 16-byte loads.
            c.kernel = "matmul_coopmat_q4_k".into();
            c.spec = [c.spec[0] | (u32::from(coopmat_x16()) << 3) << 16, c.spec[1]];
        }
        if let Some(st) = Staging::of(&c, dt, rows, n, k) {
            // Laid out as `Staging` says (and the scratch was sized by it): the f16 input, the
            // dequantised weight, the split-k partial tiles.
            let w16_at = ctx.scratch.0 + st.x16;
            let part_at = w16_at + st.w16.next_multiple_of(256);
            part = (part_at, part_at + st.part);
            if part.1 > ctx.scratch.1 {
                return Err(BackendError::internal(format!(
                    "{}'s f16 operands and split-k partials ({rows} x {n} x {k}) do not fit the program's scratch",
                    c.kernel
                )));
            }
            if st.x16 > 0 {
                let x16 = (ctx.scratch.0, ctx.scratch.0 + (rows * k * 2) as u64);
                cmds.push(to_f16(input.1, x16, rows * k));
                input = (x16.0, x16);
            }
            if st.w16 > 0 {
                let w16 = (w16_at, w16_at + st.w16);
                let units = n * (k / 32);
                let [gx, gy] = spread(div_up(units, WG as usize));
                cmds.push(Cmd::Dispatch {
                    kernel: format!("dequant_f16_{}", format_name(dt)),
                    spec: [0, 0],
                    push: Push::default()
                        .u64(weights.0)
                        .u64(w16.0)
                        .u32(k as u32)
                        .u32(n as u32)
                        .u32(weights.1)
                        .0,
                    groups: [gx, gy, 1],
                    access: Access::new(weight_reads.clone(), [w16]),
                });
                weights = (w16.0, (k * 2) as u32);
                weight_reads = vec![w16];
                (c.kernel, c.spec) = st.f16_kernel;
            }
        }
        if c.kernel.starts_with("matvec_dot") {
            // The input quantised into the scratch buffer first.
            let wide = dot_wide(&c);
            let q8 = (
                ctx.scratch.0,
                ctx.scratch.0 + tandem_gpu_kit::matmul::dot_input_bytes(rows, k, wide),
            );
            if q8.1 > ctx.scratch.1 {
                return Err(BackendError::internal(format!(
                    "matvec_dot's quantised input ({rows} x {k}) does not fit the program's scratch"
                )));
            }
            let blocks = rows * (k / 32);
            let [gx, gy] = spread(div_up(blocks, 256));
            cmds.push(Cmd::Dispatch {
                kernel: "quantize_q8".into(),
                spec: [u32::from(wide), 0],
                push: Push::default().u64(input.0).u64(q8.0).u32(blocks as u32).0,
                groups: [gx, gy, 1],
                access: Access::new([input.1], [q8]),
            });
            input = (q8.0, q8);
        }
        let mut push = Push::default()
            .u64(weights.0)
            .u64(input.0)
            .u64(dsts[0])
            .u64(dsts[1])
            .u64(dsts[2])
            .u64(dsts[3])
            .u32(k as u32)
            .u32(n as u32)
            .u32(rows as u32)
            .u32(weights.1)
            .u32(ends[0])
            .u32(ends[1])
            .u32(ends[2]);
        let reads = [input.1].into_iter().chain(weight_reads);
        if c.kslice == 0 {
            if c.kernel.starts_with("matmul_cm2") || is_coopmat(&c.kernel) {
                push = push.u64(0).u32(0);
            }
            cmds.push(Cmd::Dispatch {
                kernel: c.kernel,
                spec: c.spec,
                push: push.0,
                groups: c.groups,
                access: Access::new(reads, writes),
            });
            return Ok(cmds);
        }
        // Split k: the slices' partial tiles, then their sum into the outputs.
        cmds.push(Cmd::Dispatch {
            kernel: c.kernel,
            spec: c.spec,
            push: push.u64(part.0).u32(c.kslice as u32).0,
            groups: c.groups,
            access: Access::new(reads, [part]),
        });
        let [gx, gy] = spread(div_up(rows * n, 256));
        cmds.push(Cmd::Dispatch {
            kernel: "matmul_reduce".into(),
            spec: [0, 0],
            push: Push::default()
                .u64(part.0)
                .u64(dsts[0])
                .u64(dsts[1])
                .u64(dsts[2])
                .u64(dsts[3])
                .u32(n as u32)
                .u32(rows as u32)
                .u32(c.groups[2])
                .u32(ends[0])
                .u32(ends[1])
                .u32(ends[2])
                .0,
            groups: [gx, gy, 1],
            access: Access::new([part], writes),
        });
        Ok(cmds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device without integer dot products.
    fn u(coopmat: bool, cm2: bool) -> Unit {
        Unit {
            coopmat,
            cm2,
            ..Unit::default()
        }
    }

    #[test]
    fn decode_prefill_and_batches_take_their_kernels() {
        // One row of q4_k: its own kernel, 8 rows x 5 subgroups per workgroup at k = 2560.
        let c = choose(1, 2560, 2560, DType::Q4K, u(true, false));
        assert_eq!(
            (c.kernel.as_str(), c.spec, c.groups),
            ("matvec_q4k", [2, 160], [320, 1, 1])
        );
        // 1B's FFN down (1152 x 6912): 4 rows x 7 subgroups.
        let c = choose(1, 1152, 6912, DType::Q4K, u(true, true));
        assert_eq!((c.spec, c.groups), ([1, 224], [288, 1, 1]));
        // One row of f16 (4B's attention output, 2560 x 2048): 8 rows per workgroup in
        // subgroup mode, one slot a trip; 8 rows keep the kernel's own slots.
        if std::env::var_os("TANDEM_VULKAN_MATVEC_COLS").is_none()
            && std::env::var_os("TANDEM_VULKAN_MATVEC_U").is_none()
        {
            let c = choose(1, 2560, 2048, DType::F16, u(true, false));
            assert_eq!(
                (c.kernel.as_str(), c.spec, c.groups),
                ("matvec_f16", [1, 8 | 256 | 1 << 9], [320, 1, 1])
            );
            assert_eq!(
                choose(8, 2560, 2048, DType::F16, u(true, false)).spec,
                [8, 4 | 256]
            );
        }
        // One row of another block format: split-mode matvec.
        let c = choose(1, 2560, 2560, DType::Q8_0, u(true, true));
        assert_eq!(
            (c.kernel.as_str(), c.spec),
            ("matvec_q8_0", [1, MATVEC_COLS as u32])
        );
        // Batched q4_k decode: the rows kernel.
        assert_eq!(
            choose(8, 2560, 2560, DType::Q4K, u(true, false)).kernel,
            "matvec_rows_q4_k"
        );
        // With integer dot products: every block format's few-row products, but q4_k's one-row
        // ones (its own kernel); 4 rows per workgroup from 4 input rows.
        let dot = Unit {
            coopmat: true,
            int_dot: true,
            ..Unit::default()
        };
        if std::env::var_os("TANDEM_VULKAN_DOT_NC").is_none()
            && std::env::var_os("TANDEM_VULKAN_DOT_Q4K1").is_none()
        {
            let c = choose(8, 2560, 2560, DType::Q4K, dot);
            assert_eq!(
                (c.kernel.as_str(), c.spec, c.groups),
                ("matvec_dot_q4_k", [8, 1 | 1 << 16], [2560, 1, 1])
            );
            assert_eq!(choose(1, 2560, 2560, DType::Q4K, dot).kernel, "matvec_q4k");
            // Large one-row q4_k products (27B's FFN up, 43008 x 5376) take the dots.
            if std::env::var_os("TANDEM_VULKAN_DOT_Q4K1_FROM").is_none() {
                assert_eq!(choose(1, 43_008, 5376, DType::Q4K, dot).kernel, "matvec_dot_q4_k");
                assert_eq!(
                    choose(1, 43_008, 5376, DType::Q4K, u(true, true)).kernel,
                    "matvec_q4k"
                );
            }
            // One row of 1B's FFN down (q5_0): one weight row per workgroup, 1,152 of them.
            let c = choose(1, 1152, 6912, DType::Q5_0, dot);
            assert_eq!(
                (c.kernel.as_str(), c.spec, c.groups),
                ("matvec_dot_q5_0", [1, 1 | 1 << 16], [1152, 1, 1])
            );
            // 13 rows: two slices of 8 input rows.
            let c = choose(13, 262_144, 1152, DType::Q8_0, dot);
            assert_eq!((c.spec[0], c.groups[2]), (8, 2));
            // Float weights keep their kernels.
            assert_eq!(choose(8, 2560, 2560, DType::F16, dot).kernel, "matvec_f16");
        }
        // Prefill: cooperative matrices where the device has them (from 128 rows matmul_khr for
        // q4_k, matmul_khr64 for the other formats), else tiles.
        if ["TILE", "GROUPS", "KSPLIT", "MODE", "X16", "KERNEL"]
            .iter()
            .all(|v| std::env::var_os(format!("TANDEM_VULKAN_COOPMAT_{v}")).is_none())
        {
            assert_eq!(
                choose(127, 2560, 2560, DType::Q8_0, u(true, false)).kernel,
                "matmul_coopmat_q8_0"
            );
            assert_eq!(
                choose(128, 2560, 2560, DType::Q8_0, u(true, false)).kernel,
                "matmul_khr64_q8_0"
            );
            assert_eq!(
                choose(512, 2560, 2560, DType::F16, u(true, false)).kernel,
                "matmul_khr64_f16"
            );
            // 4B's gate and up at 512 rows: 128 x 128 tiles, a grid of 4 x 160, k whole; at 100
            // rows matmul_coopmat's 128 x 128 (f16 input: MODE bit 3), k in 2 (160 workgroups).
            let c = choose(512, 20480, 2560, DType::Q4K, u(true, false));
            assert_eq!(
                (c.kernel.as_str(), c.spec, c.groups, c.kslice),
                ("matmul_khr_q4_k", [128, 128], [4, 160, 1], 0)
            );
            let c = choose(100, 20480, 2560, DType::Q4K, u(true, false));
            assert_eq!((c.spec, c.groups), ([128 | 8 << 16, 128], [1, 160, 2]));
            // 4B's down: 80 tiles, so k in 4 slices of 2560 for 320 workgroups.
            let c = choose(512, 2560, 10240, DType::Q4K, u(true, false));
            assert_eq!((c.groups, c.kslice), ([4, 20, 4], 2560));
            // 70 rows: tiles of 128 input rows; 40 rows: 64; 33 weight rows: 64.
            assert_eq!(choose(70, 2560, 2560, DType::F16, u(true, false)).spec[1], 128);
            assert_eq!(coopmat_tile(40, 33), (64, 64));
            assert_eq!(coopmat_tile(20, 2560), (32, 128));
            // What they stage in the scratch: 4B's down (512 x 10240 in, 2560 out, 4 slices)
            // its f16 input and its partial tiles; with cooperative matrix 2 at 512 rows, q5_0's
            // gate and up their f16 input and their dequantised weight, k whole (q4_k's too).
            let c = choose(512, 2560, 10240, DType::Q4K, u(true, false));
            let st = Staging::of(&c, DType::Q4K, 512, 2560, 10240).unwrap();
            assert_eq!(
                (st.x16, st.w16, st.part),
                (512 * 10240 * 2, 0, 4 * 512 * 2560 * 4)
            );
            if [
                "CM2_DEQUANT",
                "CM2_ACC",
                "CM2_BM",
                "CM2_BN",
                "CM2_KSPLIT",
                "CM2_MODE",
            ]
            .iter()
            .all(|v| std::env::var_os(format!("TANDEM_VULKAN_{v}")).is_none())
            {
                let c = choose(512, 20480, 2560, DType::Q5_0, u(true, true));
                let st = Staging::of(&c, DType::Q5_0, 512, 20480, 2560).unwrap();
                assert_eq!((st.x16, st.w16, st.part), (512 * 2560 * 2, 20480 * 2560 * 2, 0));
                assert_eq!(st.f16_kernel.0, "matmul_cm2_f16");
                if std::env::var_os("TANDEM_VULKAN_CM2_KHR").is_none() {
                    // f16 and q4_k prefill take matmul_cm2 on a cooperative-matrix-2 device, q4_k
                    // dequantised first (f16's MODE: 8 slices unrolled); batched decode of 32
                    // sequences decodes q4_k in the loads.
                    let c = choose(512, 20480, 2560, DType::F16, u(true, true));
                    assert_eq!((c.kernel.as_str(), c.spec[1] >> 16), ("matmul_cm2_f16", 14));
                    let c = choose(512, 20480, 2560, DType::Q4K, u(true, true));
                    let st = Staging::of(&c, DType::Q4K, 512, 20480, 2560).unwrap();
                    assert_eq!(
                        (c.kernel.as_str(), st.w16, st.f16_kernel.0.as_str()),
                        ("matmul_cm2_q4_k", 20480 * 2560 * 2, "matmul_cm2_f16")
                    );
                    let c = choose(32, 20480, 2560, DType::Q4K, u(true, true));
                    assert_eq!((c.kernel.as_str(), c.spec[1] >> 16), ("matmul_cm2_q4_k", 10));
                }
                // Option `precision = "fast"` on a cooperative-matrix-2 device: matmul_cm2h (f16
                // accumulators), f16 weights on it too; what a dequantised weight is multiplied
                // by keeps the family's accumulators.
                let fast = |cm2| Unit {
                    f16_acc: true,
                    ..u(true, cm2)
                };
                if std::env::var_os("TANDEM_VULKAN_CM2_KHR").is_none() {
                    let kernel = |rows, dt, cm2| choose(rows, 20480, 2560, dt, fast(cm2)).kernel;
                    assert_eq!(kernel(512, DType::F16, true), "matmul_cm2h_f16");
                    assert_eq!(kernel(32, DType::Q4K, true), "matmul_cm2h_q4_k");
                    // q4_k's prefill too (dequantised first), and the KHR path its kernels.
                    assert_eq!(kernel(512, DType::Q4K, true), "matmul_cm2h_q4_k");
                    assert_eq!(kernel(512, DType::F16, false), "matmul_khr64_f16");
                    assert_eq!(kernel(512, DType::Q8_0, false), "matmul_khr64_q8_0");
                    let c = choose(512, 20480, 2560, DType::Q5_0, fast(true));
                    let st = Staging::of(&c, DType::Q5_0, 512, 20480, 2560).unwrap();
                    assert_eq!(st.f16_kernel.0, "matmul_cm2h_f16");
                }
            }
            let c = choose(1, 2560, 2560, DType::Q4K, u(true, false));
            assert!(Staging::of(&c, DType::Q4K, 1, 2560, 2560).is_none());
            // Split-k slices are whole multiples of 64 and at least 512 long.
            assert_eq!(coopmat_kslice(1, 1000), 0);
            assert_eq!(coopmat_kslice(1, 1152), 576);
            assert_eq!(coopmat_kslice(20, 2560), 512);
        }
        assert_eq!(
            choose(128, 2560, 2560, DType::Q8_0, u(false, true)).kernel,
            "matmul_tiled_q8_0"
        );
        // Float rows of awkward k: one weight row per workgroup.
        assert_eq!(
            choose(1, 100, 30, DType::F16, u(true, false)).kernel,
            "matmul_f16"
        );
        // NV cooperative matrix 2 where the node suits it: 128 weight rows x up to 128 rows.
        if std::env::var_os("TANDEM_VULKAN_CM2_BN").is_none()
            && std::env::var_os("TANDEM_VULKAN_CM2_BM").is_none()
            && std::env::var_os("TANDEM_VULKAN_CM2_ROWS").is_none()
        {
            let c = choose(512, 2560, 2560, DType::Q5_0, u(true, true));
            assert_eq!(c.kernel, "matmul_cm2_q5_0");
            assert_eq!((c.spec, c.groups), ([128, 128 | 10 << 16], [20, 4, 1]));
            // Batched decode (below 128 rows): tiles of 64 weight rows, twice the workgroups.
            assert_eq!(
                choose(70, 2560, 2560, DType::Q4K, u(true, true)).spec,
                [64, 96 | 10 << 16]
            );
            // ... and k split where the grid is that small: 18 tiles x 14 slices of 512 (q4_k's
            // slices are whole blocks of 256; q5_0's 16 of 448).
            let c = choose(32, 1152, 6912, DType::Q4K, u(true, true));
            if std::env::var_os("TANDEM_VULKAN_CM2_KSPLIT").is_none() {
                assert_eq!(
                    (c.spec, c.groups, c.kslice),
                    ([64, 32 | 10 << 16], [18, 1, 14], 512)
                );
                let c = choose(32, 1152, 6912, DType::Q5_0, u(true, true));
                assert_eq!((c.groups, c.kslice), ([18, 1, 16], 448));
                // Prefill keeps k whole.
                assert_eq!(choose(512, 1152, 6912, DType::Q5_0, u(true, true)).kslice, 0);
            }
            // Not without cooperative matrices at all.
            assert_eq!(
                choose(512, 2560, 2560, DType::Q4K, u(false, true)).kernel,
                "matmul_tiled_q4_k"
            );
        }
    }
}
