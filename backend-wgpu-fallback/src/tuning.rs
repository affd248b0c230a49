//! Tuning knobs of the kernels' launch shapes: each default with the measurement that chose
//! it, and the environment variable that overrides it for A/B runs on a device (read once).

use std::sync::OnceLock;

use tandem_gpu_kit::matmul::q4k_matvec_shape;

/// Environment variable `name` parsed as `T`; `None` when unset or unparsable.
fn knob<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// `TANDEM_WGPU_MATVEC_NC=n` (1 to 16): the subgroup matvec's output columns per workgroup
/// on every matrix, for tuning runs.
pub(crate) fn matvec_columns_override() -> Option<usize> {
    static N: OnceLock<Option<usize>> = OnceLock::new();
    *N.get_or_init(|| knob("TANDEM_WGPU_MATVEC_NC").filter(|n| (1..=16).contains(n)))
}

/// Groups of a row (`Format::group` values each) from which the subgroup matvec takes 128
/// invocations per output column rather than 64. On the H100, 1B q4_k decode at batch 1 went
/// from 270.8 to 286.3 tok/s with 128 on its rows of 6,912 values (256 gave 278.3), and to
/// 289.9 with 128 on its rows of 1,152 values as well (from 256 groups; from 128: 283.6).
pub(crate) const MATVEC_WIDE_GROUPS: usize = 256;

/// [`MATVEC_WIDE_GROUPS`], or `TANDEM_WGPU_MATVEC_WIDE=n`, for tuning runs.
pub(crate) fn matvec_wide_groups() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| knob("TANDEM_WGPU_MATVEC_WIDE").unwrap_or(MATVEC_WIDE_GROUPS))
}

/// `TANDEM_WGPU_MATVEC_WIDTH=n` (1 to 4): the subgroup matvec's invocations over 64 on long
/// rows, for tuning runs.
pub(crate) fn matvec_width_override() -> Option<usize> {
    static N: OnceLock<Option<usize>> = OnceLock::new();
    *N.get_or_init(|| knob("TANDEM_WGPU_MATVEC_WIDTH").filter(|n| (1..=4).contains(n)))
}

/// The cooperative-matrix prefill matmul's workgroup (`matmul_half.wgsl`): subgroups along the
/// input rows and along the weight rows (64 each). On the H100 (4B, 512-token prefill, FM 4)
/// 1 x 2, 2 x 2, 2 x 1 and 1 x 4 came within 3% of each other (f16: 4,991, 5,021, 5,010,
/// 4,911 tok/s; q4_k: 4,664, 4,616, 4,707, 4,768).
pub(crate) const HALF_SUBGROUPS: (usize, usize) = (1, 2);

/// Each subgroup's blocks of 16 input rows in `matmul_half.wgsl` (2 or 4): with 4, half a
/// load per multiply-add instead of three quarters. On the H100, 4B prefill went 4,113 ->
/// 4,991 tok/s (f16) and 3,863 -> 4,664 (q4_k) from 2 to 4.
pub(crate) const HALF_FM: usize = 4;

/// [`HALF_FM`], or `TANDEM_WGPU_HALF_FM=2|4`, for tuning runs.
pub(crate) fn half_fm() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        knob("TANDEM_WGPU_HALF_FM")
            .filter(|n| *n == 2 || *n == 4)
            .unwrap_or(HALF_FM)
    })
}

/// [`HALF_SUBGROUPS`], or `TANDEM_WGPU_HALF_TILE=MxN` (each 1 to 8, at most 8 in all), for
/// tuning runs.
pub(crate) fn half_subgroups() -> (usize, usize) {
    static T: OnceLock<(usize, usize)> = OnceLock::new();
    *T.get_or_init(|| {
        std::env::var("TANDEM_WGPU_HALF_TILE")
            .ok()
            .and_then(|v| {
                let (a, b) = v.split_once('x')?;
                Some((a.parse().ok()?, b.parse().ok()?))
            })
            .filter(|&(a, b): &(usize, usize)| a >= 1 && b >= 1 && a * b <= 8)
            .unwrap_or(HALF_SUBGROUPS)
    })
}

/// `TANDEM_WGPU_COOPMAT=staged`: the prefill matmul stages its tiles in workgroup memory
/// (`matmul_coopmat.wgsl`) even where the f16 staging buffer would serve, for A/B runs.
pub(crate) fn coopmat_staged() -> bool {
    static S: OnceLock<bool> = OnceLock::new();
    *S.get_or_init(|| std::env::var("TANDEM_WGPU_COOPMAT").is_ok_and(|v| v == "staged"))
}

/// `matvec_q4k_rows.wgsl`'s shape for `n` output columns of `blocks` q4_k blocks: (NR, W), the
/// Vulkan backend's rule (`tandem_gpu_kit::matmul::q4k_matvec_shape`), or
/// `TANDEM_WGPU_Q4K_ROWS=NRxW` (NR 1, 2 or 4; W 1 to 8) for tuning runs.
///
/// On the H100 (decode at batch 1, loops unbounded) the rule gave 198.2 tok/s on 4B q4_k
/// against 188.1 (1 x 5), 193.7 (2 x 8), 185.0 (4 x 5) and 184.6 for the item kernel; 1B q4_k
/// 334.2 against 322.7, 323.3, 314.9 and 327.6.
pub(crate) fn q4k_rows_shape(n: usize, blocks: usize) -> (usize, usize) {
    static S: OnceLock<Option<(usize, usize)>> = OnceLock::new();
    let forced = *S.get_or_init(|| {
        let v = std::env::var("TANDEM_WGPU_Q4K_ROWS").ok()?;
        let (nr, w) = v.split_once('x')?;
        let (nr, w): (usize, usize) = (nr.parse().ok()?, w.parse().ok()?);
        (matches!(nr, 1 | 2 | 4) && (1..=8).contains(&w)).then_some((nr, w))
    });
    forced.unwrap_or_else(|| q4k_matvec_shape(n, blocks))
}

/// `TANDEM_WGPU_Q4K_ROWS=items`: one-row q4_k matvecs take the item kernel
/// (`matvec_q4k.wgsl`, or the portable `matvec.wgsl`) rather than `matvec_q4k_rows.wgsl`, for
/// A/B runs.
pub(crate) fn q4k_rows_off() -> bool {
    static S: OnceLock<bool> = OnceLock::new();
    *S.get_or_init(|| std::env::var("TANDEM_WGPU_Q4K_ROWS").is_ok_and(|v| v == "items"))
}

/// `TANDEM_WGPU_LOOP_BOUNDS=1`: wgpu's counter on every shader loop stays on (by default the
/// kernels are made without it: on the H100, decode at batch 1 went from 169.0 to 198.2 tok/s
/// on 4B q4_k, 288.3 to 334.2 on 1B q4_k, 146.8 to 153.7 on 4B f16 and 305.9 to 339.7 on 1B
/// f16, prefill by 5-8%), for A/B runs and for telling a hang apart.
pub(crate) fn loop_bounds_forced() -> bool {
    static S: OnceLock<bool> = OnceLock::new();
    *S.get_or_init(|| std::env::var("TANDEM_WGPU_LOOP_BOUNDS").is_ok_and(|v| v == "1"))
}

/// `TANDEM_WGPU_DOT_NC=n` (1, 2 or 4): `matvec_dot.wgsl`'s output columns per workgroup, for
/// tuning runs (a fused GeGlu takes at most 2).
pub(crate) fn dot_columns_override() -> Option<usize> {
    static N: OnceLock<Option<usize>> = OnceLock::new();
    *N.get_or_init(|| knob("TANDEM_WGPU_DOT_NC").filter(|n| matches!(n, 1 | 2 | 4)))
}

/// `TANDEM_WGPU_DOT_Q4K1=1`: one-row q4_k matvecs take `matvec_dot.wgsl` too (by default they
/// take `matvec_q4k_rows.wgsl`, as the Vulkan backend's take `matvec_q4k`), for A/B runs.
pub(crate) fn dot_q4k_one_row() -> bool {
    static S: OnceLock<bool> = OnceLock::new();
    *S.get_or_init(|| std::env::var("TANDEM_WGPU_DOT_Q4K1").is_ok_and(|v| v == "1"))
}

/// `TANDEM_WGPU_F16_ITEMS=4`: f16 matvecs take `matvec_subgroup.wgsl`'s items of 4 values rather
/// than `matvec_f16.wgsl`'s of 8, for A/B runs.
pub(crate) fn f16_items_off() -> bool {
    static S: OnceLock<bool> = OnceLock::new();
    *S.get_or_init(|| std::env::var("TANDEM_WGPU_F16_ITEMS").is_ok_and(|v| v == "4"))
}
