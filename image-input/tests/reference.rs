//! `decode` + `preprocess` against the `pixel_values` of transformers' PIL-based Gemma 3 image
//! processor, stored by `tests/fixtures/images/make_images.py` (see its docstring for the format).
//!
//! Cases read from a lossless file (PNG, lossless WebP, and Pillow's own decoding of the lossy files)
//! must match exactly (the bound is 1e-6; the measured error is 0). The lossy files decoded by the
//! `image` crate's JPEG and WebP decoders are only close: those decoders are not libjpeg-turbo and
//! libwebp. Run with `--nocapture` to see the measured errors.

use std::path::PathBuf;

use serde_json::Value;
use sha2::{Digest, Sha256};
use tandem_image_input::{decode, preprocess, PreprocessConfig};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/images")
}

fn read(name: &str) -> Vec<u8> {
    let path = fixtures().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Neumaier's compensated sum, close enough to Python's exact `math.fsum` for a 1e-6 comparison.
fn fsum(values: impl Iterator<Item = f64>) -> f64 {
    let (mut sum, mut comp) = (0.0f64, 0.0f64);
    for v in values {
        let t = sum + v;
        comp += if sum.abs() >= v.abs() {
            (sum - t) + v
        } else {
            (v - t) + sum
        };
        sum = t;
    }
    sum + comp
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

/// How far one computed tensor is from a case's reference summary.
struct Deviation {
    /// Largest |difference| over the stored values (samples and borders).
    max_abs: f64,
    /// Mean |difference| over the stored values.
    mean_abs: f64,
    /// Largest |difference| of a per-channel sum or weighted sum.
    max_sum: f64,
}

fn compare(case: &Value, stride: usize, period: usize, got: &[f32]) -> Deviation {
    let shape: Vec<usize> = case["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|v| v.as_u64().expect("int") as usize)
        .collect();
    let (c, h, w) = (shape[0], shape[1], shape[2]);
    assert_eq!(got.len(), c * h * w, "{}: length", case["name"]);

    // The stored values, in make_images.py's order: the strided sample, then each channel's first
    // row, last row, first column, last column.
    let mut ours: Vec<f32> = got.iter().step_by(stride).copied().collect();
    for ch in 0..c {
        let plane = &got[ch * h * w..(ch + 1) * h * w];
        ours.extend_from_slice(&plane[..w]);
        ours.extend_from_slice(&plane[(h - 1) * w..]);
        ours.extend((0..h).map(|y| plane[y * w]));
        ours.extend((0..h).map(|y| plane[y * w + w - 1]));
    }
    let blob = read(case["bin"].as_str().expect("bin"));
    let theirs: Vec<f32> = blob
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(ours.len(), theirs.len(), "{}: stored value count", case["name"]);
    let diffs: Vec<f64> = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (f64::from(*a) - f64::from(*b)).abs())
        .collect();
    let max_abs = diffs.iter().copied().fold(0.0, f64::max);
    let mean_abs = diffs.iter().sum::<f64>() / diffs.len() as f64;

    let (sums, weighted) = (floats(&case["sums"]), floats(&case["weighted_sums"]));
    let mut max_sum = 0.0f64;
    for ch in 0..c {
        let plane = &got[ch * h * w..(ch + 1) * h * w];
        let s = fsum(plane.iter().map(|&v| f64::from(v)));
        let ws = fsum(
            plane
                .iter()
                .enumerate()
                .map(|(i, &v)| f64::from(v) * (1 + i % period) as f64),
        );
        max_sum = max_sum.max((s - sums[ch]).abs()).max((ws - weighted[ch]).abs());
    }
    Deviation {
        max_abs,
        mean_abs,
        max_sum,
    }
}

#[test]
fn matches_transformers_pixel_values() {
    let reference: Value = serde_json::from_slice(&read("reference.json")).expect("reference.json");
    let stride = reference["stride"].as_u64().expect("stride") as usize;
    let period = reference["weight_period"].as_u64().expect("weight_period") as usize;
    println!(
        "reference: {} from transformers {}, Pillow {}",
        reference["processor"], reference["transformers"], reference["pillow"]
    );
    let cases = reference["cases"].as_array().expect("cases");
    assert!(cases.len() >= 10);
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let cfg = PreprocessConfig::from_preprocessor_json(&case["config"].to_string())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let image = case["image"].as_str().expect("image");
        let decoded = decode(&read(image)).unwrap_or_else(|e| panic!("{name}: {image}: {e}"));

        match case["exact_image"].as_str() {
            None => {
                let d = compare(case, stride, period, &preprocess(&decoded, &cfg));
                println!(
                    "{name:22} {image:14} exact: max abs err {:.3e}, sums off by {:.3e}",
                    d.max_abs, d.max_sum
                );
                assert!(
                    d.max_abs <= 1e-6 && d.max_sum <= 1e-6,
                    "{name}: max abs {} sums {}",
                    d.max_abs,
                    d.max_sum
                );
            }
            Some(exact) => {
                // The resize, on Pillow's own decoding of the file: exact.
                let pil = decode(&read(exact)).unwrap_or_else(|e| panic!("{name}: {exact}: {e}"));
                let d = compare(case, stride, period, &preprocess(&pil, &cfg));
                println!(
                    "{name:22} {exact:14} exact: max abs err {:.3e}, sums off by {:.3e}",
                    d.max_abs, d.max_sum
                );
                assert!(
                    d.max_abs <= 1e-6 && d.max_sum <= 1e-6,
                    "{name}: max abs {} sums {}",
                    d.max_abs,
                    d.max_sum
                );

                // The same file through the `image` crate's decoder: close, not equal.
                assert_eq!(decoded.dimensions(), pil.dimensions(), "{name}: EXIF orientation");
                let diff = decoded
                    .as_raw()
                    .iter()
                    .zip(pil.as_raw())
                    .map(|(a, b)| a.abs_diff(*b));
                let max_level = diff.clone().max().unwrap_or(0);
                let differing = diff.filter(|&d| d > 0).count();
                let d = compare(case, stride, period, &preprocess(&decoded, &cfg));
                println!(
                    "{name:22} {image:14} decoder: {differing} of {} decoded bytes differ from Pillow's (at most {max_level} \
                     levels); max abs err {:.3e}, mean {:.3e}",
                    decoded.as_raw().len(),
                    d.max_abs,
                    d.mean_abs
                );
                assert!(
                    max_level <= 8,
                    "{name}: decoded pixels differ by {max_level} levels"
                );
                assert!(
                    d.max_abs <= 8.0 * 2.0 / 255.0 && d.mean_abs <= 0.01,
                    "{name}: {} {}",
                    d.max_abs,
                    d.mean_abs
                );
            }
        }
    }
}

#[test]
fn fixture_images_are_the_listed_ones() {
    // reference.json was made from these exact files; a changed image needs make_images.py again.
    let reference: Value = serde_json::from_slice(&read("reference.json")).expect("reference.json");
    let files = reference["sha256"].as_object().expect("sha256");
    assert!(files.len() >= 4);
    for (name, digest) in files {
        let bytes = read(name);
        let hex: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(Some(hex.as_str()), digest.as_str(), "{name}: sha256");
        let img = decode(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(img.width() > 0 && img.height() > 0);
    }
}
