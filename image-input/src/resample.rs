//! Pillow's convolution resampling (`ImagingResample` in `libImaging/Resample.c`) for 8-bit RGB,
//! reimplemented so that the output matches Pillow's bit for bit.
//!
//! The arithmetic, in the order Pillow does it:
//!
//! * Per axis, for each output index `o`: `scale = in / out` (the input size goes through `f32`,
//!   as Pillow's box does), `filterscale = max(scale, 1)` (antialiasing: the filter is stretched
//!   when downscaling), `support = filter.support * filterscale`, `center = (o + 0.5) * scale`,
//!   the taps run from `trunc(center - support + 0.5)` (at least 0) to `trunc(center + support + 0.5)`
//!   (at most `in`), each weight is `filter(((i - center) + 0.5) / filterscale)` in `f64`, and the
//!   weights are divided by their sum.
//! * The weights become fixed point with 22 fractional bits (`PRECISION_BITS = 32 - 8 - 2`),
//!   rounded half away from zero.
//! * A pass accumulates `pixel * weight` in a 32-bit integer that starts at `1 << 21` (rounding),
//!   shifts right by 22 and clamps to 0..=255, so each pass rounds to `u8`.
//! * Horizontal pass first, then vertical, except when the height shrinks by more than twice
//!   what the width shrinks (`in_h - out_h > 0 && in_h - out_h > 2 * (in_w - out_w)`): then vertical
//!   first. An axis whose size does not change is not resampled at all.
//!
//! Because each pass rounds to `u8`, the order of the passes changes the result; both orders are
//! kept as Pillow has them.

use crate::Resample;

/// Fractional bits of the fixed-point weights (Pillow's `PRECISION_BITS`).
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Pillow's bilinear (triangle) filter, support 1.
fn bilinear(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

/// Pillow's bicubic filter (Keys, `a = -0.5`), support 2, evaluated in Pillow's operation order.
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

impl Resample {
    fn support(self) -> f64 {
        match self {
            Resample::Bilinear => 1.0,
            Resample::Bicubic => 2.0,
        }
    }

    fn eval(self, x: f64) -> f64 {
        match self {
            Resample::Bilinear => bilinear(x),
            Resample::Bicubic => bicubic(x),
        }
    }
}

/// The taps of one axis: for output index `o`, input indices `start[o] .. start[o] + len[o]` with
/// the fixed-point weights `weights[o * ksize ..][.. len[o]]`.
struct Taps {
    start: Vec<usize>,
    len: Vec<usize>,
    ksize: usize,
    weights: Vec<i32>,
}

impl Taps {
    fn new(in_size: usize, out_size: usize, filter: Resample) -> Taps {
        // Pillow's box is (0, 0, w, h) in f32, and the scale is (double)(box1 - box0) / out.
        let in1 = in_size as f32;
        let scale = f64::from(in1 - 0.0) / out_size as f64;
        let filterscale = if scale < 1.0 { 1.0 } else { scale };
        let support = filter.support() * filterscale;
        let ksize = support.ceil() as usize * 2 + 1;
        let inv_filterscale = 1.0 / filterscale;

        let mut start = Vec::with_capacity(out_size);
        let mut len = Vec::with_capacity(out_size);
        let mut weights = vec![0i32; out_size * ksize];
        let mut k = vec![0f64; ksize];
        for o in 0..out_size {
            let center = 0.0 + (o as f64 + 0.5) * scale;
            // `as i32` truncates towards zero, as C's `(int)` does.
            let lo = ((center - support + 0.5) as i32).max(0);
            let hi = ((center + support + 0.5) as i32).min(in_size as i32);
            let n = (hi - lo).max(0) as usize;
            let mut sum = 0.0;
            for (i, w) in k.iter_mut().enumerate().take(n) {
                let x = ((i as i32 + lo) as f64 - center + 0.5) * inv_filterscale;
                *w = filter.eval(x);
                sum += *w;
            }
            let row = &mut weights[o * ksize..(o + 1) * ksize];
            for (dst, &w) in row.iter_mut().zip(&k[..n]) {
                let w = if sum != 0.0 { w / sum } else { w };
                let fixed = w * f64::from(1u32 << PRECISION_BITS);
                *dst = if w < 0.0 {
                    (fixed - 0.5) as i32
                } else {
                    (fixed + 0.5) as i32
                };
            }
            start.push(lo as usize);
            len.push(n);
        }
        Taps {
            start,
            len,
            ksize,
            weights,
        }
    }

    fn weights(&self, o: usize) -> &[i32] {
        &self.weights[o * self.ksize..o * self.ksize + self.len[o]]
    }
}

/// Pillow's `clip8`: drop the fraction bits of the accumulator and clamp to a byte.
fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// The accumulator's start value: one half, so that the final shift rounds.
const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// Resamples interleaved RGB rows `first_row .. first_row + rows` of `src` (width `in_w`) to width
/// `out_w`.
fn horizontal(src: &[u8], in_w: usize, first_row: usize, rows: usize, taps: &Taps) -> Vec<u8> {
    let out_w = taps.start.len();
    let mut out = vec![0u8; out_w * rows * 3];
    for (r, out_row) in out.chunks_exact_mut(out_w * 3).enumerate() {
        let line = &src[(first_row + r) * in_w * 3..(first_row + r + 1) * in_w * 3];
        for (o, px) in out_row.chunks_exact_mut(3).enumerate() {
            let lo = taps.start[o];
            let mut acc = [HALF; 3];
            for (i, &w) in taps.weights(o).iter().enumerate() {
                let s = &line[(lo + i) * 3..(lo + i) * 3 + 3];
                for c in 0..3 {
                    // Wrapping like Pillow's C `int` in practice; with weights that sum to one it never
                    // overflows.
                    acc[c] = acc[c].wrapping_add(i32::from(s[c]).wrapping_mul(w));
                }
            }
            for c in 0..3 {
                px[c] = clip8(acc[c]);
            }
        }
    }
    out
}

/// Resamples the interleaved RGB image `src` (width `w`) vertically; `taps.start` counts rows of
/// `src`.
fn vertical(src: &[u8], w: usize, taps: &Taps) -> Vec<u8> {
    let out_h = taps.start.len();
    let row_len = w * 3;
    let mut out = vec![0u8; row_len * out_h];
    let mut acc = vec![0i32; row_len];
    for (o, out_row) in out.chunks_exact_mut(row_len.max(1)).enumerate().take(out_h) {
        acc.fill(HALF);
        let lo = taps.start[o];
        for (i, &wt) in taps.weights(o).iter().enumerate() {
            let line = &src[(lo + i) * row_len..(lo + i + 1) * row_len];
            for (a, &s) in acc.iter_mut().zip(line) {
                *a = a.wrapping_add(i32::from(s).wrapping_mul(wt));
            }
        }
        for (d, &a) in out_row.iter_mut().zip(&acc) {
            *d = clip8(a);
        }
    }
    out
}

/// Resizes the interleaved 8-bit RGB image `src` (`in_w` x `in_h`) to `out_w` x `out_h` exactly as
/// Pillow's `Image.resize((out_w, out_h), filter)` does on an RGB image.
pub(crate) fn resize_rgb8(
    src: &[u8],
    in_w: usize,
    in_h: usize,
    out_w: usize,
    out_h: usize,
    filter: Resample,
) -> Vec<u8> {
    debug_assert_eq!(src.len(), in_w * in_h * 3);
    if out_w == 0 || out_h == 0 {
        return Vec::new();
    }
    let need_h = out_w != in_w;
    let need_v = out_h != in_h;
    if !need_h && !need_v {
        return src.to_vec();
    }
    let (iw, ih, ow, oh) = (in_w as i64, in_h as i64, out_w as i64, out_h as i64);
    let horizontal_first = !(ih - oh > 0 && ih - oh > (iw - ow) * 2);

    if horizontal_first {
        let h_taps = Taps::new(in_w, out_w, filter);
        if !need_v {
            return horizontal(src, in_w, 0, in_h, &h_taps);
        }
        let mut v_taps = Taps::new(in_h, out_h, filter);
        if !need_h {
            return vertical(src, in_w, &v_taps);
        }
        // Only the rows the vertical pass reads go through the horizontal pass.
        let first = v_taps.start[0];
        let last = v_taps.start[out_h - 1] + v_taps.len[out_h - 1];
        for s in &mut v_taps.start {
            *s -= first;
        }
        let tmp = horizontal(src, in_w, first, last.saturating_sub(first), &h_taps);
        vertical(&tmp, out_w, &v_taps)
    } else {
        let v_taps = Taps::new(in_h, out_h, filter);
        let tmp = vertical(src, in_w, &v_taps);
        if !need_h {
            return tmp;
        }
        let h_taps = Taps::new(in_w, out_w, filter);
        horizontal(&tmp, in_w, 0, out_h, &h_taps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_sum_to_one_in_fixed_point() {
        for (i, o) in [
            (640, 896),
            (37, 896),
            (1024, 896),
            (4000, 896),
            (896, 224),
            (3, 2),
        ] {
            for f in [Resample::Bilinear, Resample::Bicubic] {
                let t = Taps::new(i, o, f);
                for x in 0..o {
                    let s: i64 = t.weights(x).iter().map(|&w| i64::from(w)).sum();
                    assert!(
                        (s - (1 << PRECISION_BITS)).abs() <= t.len[x] as i64,
                        "{i}->{o} {f:?} {x}: {s}"
                    );
                }
            }
        }
    }

    #[test]
    fn constant_image_stays_constant() {
        let src = vec![77u8; 13 * 9 * 3];
        for f in [Resample::Bilinear, Resample::Bicubic] {
            for (ow, oh) in [(5, 4), (31, 17), (13, 20), (40, 9)] {
                let out = resize_rgb8(&src, 13, 9, ow, oh, f);
                assert_eq!(out.len(), ow * oh * 3);
                assert!(out.iter().all(|&v| v == 77), "{f:?} {ow}x{oh}");
            }
        }
    }

    #[test]
    fn same_size_is_a_copy() {
        let src: Vec<u8> = (0..6 * 4 * 3).map(|i| (i * 7) as u8).collect();
        assert_eq!(resize_rgb8(&src, 6, 4, 6, 4, Resample::Bicubic), src);
    }
}
