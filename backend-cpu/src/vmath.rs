//! Elementwise math for the fast kernel sets, written so that the compiler vectorises it: an
//! `exp` by range reduction and a polynomial (Cephes' `expf`, about 2 ulp on its range) in
//! place of libm's scalar calls, and GeGLU's tanh through it. The reference kernels keep libm.

use crate::fast::KernelSet;

/// `e^x` for `x` in about [-87, 88] (clamped there: the result saturates towards 0 or 2^127
/// rather than becoming infinite), within about 2 ulp of the exact value.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2E + 0.5).floor();
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let p = p * r * r + r + 1.0;
    p * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

/// Whether `set` uses vectors and the CPU has AVX2 and FMA (the `*_avx2` variants below).
#[cfg(target_arch = "x86_64")]
fn avx2(set: KernelSet) -> bool {
    set != KernelSet::Scalar && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

/// GELU (tanh form) as `x / (1 + e^(-2u))`, `u = sqrt(2/pi) (x + 0.044715 x^3)`: the same
/// function as `kernels::gelu_tanh`, since `0.5 (1 + tanh u) = 1 / (1 + e^(-2u))`.
#[inline(always)]
fn gelu1(x: f32) -> f32 {
    const TWO_SQRT_2_OVER_PI: f32 = 2.0 * 0.797_884_6;
    let u2 = TWO_SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
    x / (1.0 + exp(-u2))
}

#[inline(always)]
fn geglu_plain(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = gelu1(*g) * u;
    }
}

/// `Op::GeGlu` for a fast kernel set: `gelu(gate) * up`, vectorised where `set` uses AVX2.
pub fn geglu(set: KernelSet, gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2(set) {
        // SAFETY: `avx2` detected AVX2 and FMA just above; the function is safe Rust.
        return unsafe { geglu_avx2(gate, up, out) };
    }
    let _ = set;
    geglu_plain(gate, up, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn geglu_avx2(gate: &[f32], up: &[f32], out: &mut [f32]) {
    geglu_plain(gate, up, out)
}

/// `Op::Gelu` (the vision tower's MLP) for a fast kernel set: GELU through [`exp`] as in
/// [`geglu`], vectorised where `set` uses AVX2.
pub fn gelu(set: KernelSet, x: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2(set) {
        // SAFETY: `avx2` detected AVX2 and FMA just above; the function is safe Rust.
        return unsafe { gelu_avx2(x, out) };
    }
    let _ = set;
    gelu_plain(x, out)
}

#[inline(always)]
fn gelu_plain(x: &[f32], out: &mut [f32]) {
    for (o, v) in out.iter_mut().zip(x) {
        *o = gelu1(*v);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn gelu_avx2(x: &[f32], out: &mut [f32]) {
    gelu_plain(x, out)
}

/// `Op::RmsNorm` for a fast kernel set: each group's sum of squares in 32 lanes (summed at the
/// end), vectorised where `set` uses AVX2, instead of the reference's single running sum.
pub fn rms_norm(set: KernelSet, x: &[f32], weight: &[f32], eps: f32, offset: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2(set) {
        // SAFETY: `avx2` detected AVX2 and FMA just above; the function is safe Rust.
        return unsafe { rms_norm_avx2(x, weight, eps, offset, out) };
    }
    let _ = set;
    rms_norm_lanes(x, weight, eps, offset, out)
}

#[inline(always)]
fn rms_norm_lanes(x: &[f32], weight: &[f32], eps: f32, offset: f32, out: &mut [f32]) {
    let g = weight.len();
    if g == 0 {
        return;
    }
    for (xs, ys) in x.chunks_exact(g).zip(out.chunks_exact_mut(g)) {
        let mut acc = [0f32; 32];
        let chunks = xs.chunks_exact(32);
        let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
        for c in chunks {
            for (a, v) in acc.iter_mut().zip(c) {
                *a += v * v;
            }
        }
        let ms = (acc.iter().sum::<f32>() + tail) / g as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((y, v), w) in ys.iter_mut().zip(xs).zip(weight) {
            *y = v * inv * (offset + w);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn rms_norm_avx2(x: &[f32], weight: &[f32], eps: f32, offset: f32, out: &mut [f32]) {
    rms_norm_lanes(x, weight, eps, offset, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::gelu_tanh;

    /// Against the reference norm on groups of 2560 and 37 (a lane tail), two rows each.
    #[test]
    fn rms_norm_matches_the_reference() {
        for g in [2560usize, 37] {
            let x: Vec<f32> = (0..2 * g)
                .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.01)
                .collect();
            let w: Vec<f32> = (0..g).map(|i| (i % 13) as f32 * 0.1 - 0.5).collect();
            let mut want = vec![0f32; 2 * g];
            crate::kernels::rms_norm(&x, &w, 1e-6, 1.0, &mut want);
            for set in KernelSet::ALL.into_iter().filter(|s| s.available()) {
                let mut got = vec![0f32; 2 * g];
                rms_norm(set, &x, &w, 1e-6, 1.0, &mut got);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                        "{set:?} g={g} {i}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn exp_is_within_a_few_ulp() {
        for i in -8700..8800 {
            let x = i as f32 * 0.01;
            let (got, want) = (exp(x), f64::from(x).exp());
            let rel = ((f64::from(got) - want) / want).abs();
            assert!(
                rel < 4.0 * f64::from(f32::EPSILON),
                "exp({x}) = {got}, want {want}"
            );
        }
        assert_eq!(exp(-1000.0), exp(-87.0));
    }

    /// Every set the CPU runs against the reference GELU (libm's tanh), on values from -10 to
    /// 10: within 1e-6 of max(1, |gelu|).
    #[test]
    fn geglu_matches_the_reference() {
        let gate: Vec<f32> = (0..4001).map(|i| (i as f32 - 2000.0) * 0.005).collect();
        let up: Vec<f32> = (0..4001).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        for set in KernelSet::ALL.into_iter().filter(|s| s.available()) {
            let mut out = vec![0f32; gate.len()];
            geglu(set, &gate, &up, &mut out);
            for ((o, g), u) in out.iter().zip(&gate).zip(&up) {
                let want = gelu_tanh(*g) * u;
                assert!(
                    (o - want).abs() <= 1e-6 * want.abs().max(1.0) * u,
                    "{set:?} gelu({g}) * {u}: {o} vs {want}"
                );
            }
        }
    }

    #[test]
    fn gelu_matches_the_reference() {
        let x: Vec<f32> = (0..4001).map(|i| (i as f32 - 2000.0) * 0.005).collect();
        for set in KernelSet::ALL.into_iter().filter(|s| s.available()) {
            let mut out = vec![0f32; x.len()];
            gelu(set, &x, &mut out);
            for (o, v) in out.iter().zip(&x) {
                let want = gelu_tanh(*v);
                assert!(
                    (o - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "{set:?} gelu({v}): {o} vs {want}"
                );
            }
        }
    }
}
