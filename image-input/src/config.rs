//! [`PreprocessConfig`] from a Hugging Face `preprocessor_config.json`.

use serde_json::{Map, Value};

use crate::{ImageError, PreprocessConfig, Resample};

fn bad(field: &str, reason: impl Into<String>) -> ImageError {
    ImageError::BadConfig {
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// The field's value, `None` when it is absent or `null` (transformers treats `null` as unset).
fn get<'a>(obj: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
    obj.get(field).filter(|v| !v.is_null())
}

fn boolean(obj: &Map<String, Value>, field: &str) -> Result<Option<bool>, ImageError> {
    get(obj, field)
        .map(|v| {
            v.as_bool()
                .ok_or_else(|| bad(field, format!("expected true or false, got {v}")))
        })
        .transpose()
}

fn number(v: &Value, field: &str) -> Result<f64, ImageError> {
    v.as_f64()
        .ok_or_else(|| bad(field, format!("expected a number, got {v}")))
}

/// A per-channel triple: a list of three numbers, or one number for all channels.
fn triple(obj: &Map<String, Value>, field: &str) -> Result<Option<[f32; 3]>, ImageError> {
    let Some(v) = get(obj, field) else { return Ok(None) };
    match v {
        Value::Array(items) if items.len() == 3 => {
            let mut out = [0f32; 3];
            for (o, item) in out.iter_mut().zip(items) {
                *o = number(item, field)? as f32;
            }
            Ok(Some(out))
        }
        Value::Array(items) => Err(bad(field, format!("expected 3 values, got {}", items.len()))),
        Value::Number(_) => Ok(Some([number(v, field)? as f32; 3])),
        _ => Err(bad(field, format!("expected a list of 3 numbers, got {v}"))),
    }
}

fn side(v: &Value, field: &str) -> Result<u32, ImageError> {
    match v.as_u64() {
        Some(n) if n > 0 && n <= u64::from(u32::MAX) => Ok(n as u32),
        _ => Err(bad(field, format!("expected a positive integer, got {v}"))),
    }
}

impl PreprocessConfig {
    /// Reads the image-processing fields of a Hugging Face `preprocessor_config.json` (the text of
    /// the file): `size` (`{"height", "width"}`, equal, or one integer), `image_mean`, `image_std`
    /// (three numbers or one), `rescale_factor`, `resample` (Pillow's number: 2 = bilinear,
    /// 3 = bicubic), and `do_resize`, `do_rescale`, `do_normalize` (a false one turns its step
    /// off: no resize, a factor of 1, mean 0 and std 1). `do_convert_rgb` must be a boolean if
    /// present, and conversion to RGB is always done. `do_pan_and_scan: true` is refused (not
    /// implemented).
    ///
    /// Absent and `null` fields take [`PreprocessConfig::default`]'s value (Gemma 3's; note that
    /// transformers would fall back to its class default for a missing `size`, 224). Other fields
    /// are ignored. A field of the wrong type, or a value this crate cannot honour, is an
    /// [`ImageError::BadConfig`] that names it.
    pub fn from_preprocessor_json(text: &str) -> Result<PreprocessConfig, ImageError> {
        let value: Value = serde_json::from_str(text).map_err(|e| bad("(file)", format!("not JSON: {e}")))?;
        let obj = value
            .as_object()
            .ok_or_else(|| bad("(file)", "expected a JSON object"))?;
        let mut cfg = PreprocessConfig::default();

        if let Some(size) = get(obj, "size") {
            cfg.size = match size {
                Value::Object(dims) => {
                    let height = get(dims, "height").ok_or_else(|| {
                        bad("size", format!("expected {{\"height\", \"width\"}}, got {size}"))
                    })?;
                    let width = get(dims, "width").ok_or_else(|| bad("size.width", "missing"))?;
                    let (height, width) = (side(height, "size.height")?, side(width, "size.width")?);
                    if height != width {
                        return Err(bad(
                            "size",
                            format!("only square sizes are supported, got {height}x{width}"),
                        ));
                    }
                    height
                }
                Value::Number(_) => side(size, "size")?,
                _ => {
                    return Err(bad(
                        "size",
                        format!("expected {{\"height\", \"width\"}}, got {size}"),
                    ))
                }
            };
        }
        if let Some(mean) = triple(obj, "image_mean")? {
            cfg.mean = mean;
        }
        if let Some(std) = triple(obj, "image_std")? {
            cfg.std = std;
        }
        if let Some(v) = get(obj, "rescale_factor") {
            cfg.rescale = number(v, "rescale_factor")?;
        }
        if let Some(v) = get(obj, "resample") {
            let n = v
                .as_i64()
                .ok_or_else(|| bad("resample", format!("expected an integer, got {v}")))?;
            cfg.resample = Resample::from_pil(n).ok_or_else(|| {
                bad(
                    "resample",
                    format!("Pillow filter {n} is not implemented (2 = bilinear, 3 = bicubic are)"),
                )
            })?;
        }
        if boolean(obj, "do_resize")? == Some(false) {
            cfg.resize = false;
        }
        if boolean(obj, "do_rescale")? == Some(false) {
            cfg.rescale = 1.0;
        }
        if boolean(obj, "do_normalize")? == Some(false) {
            cfg.mean = [0.0; 3];
            cfg.std = [1.0; 3];
        }
        boolean(obj, "do_convert_rgb")?;
        if boolean(obj, "do_pan_and_scan")? == Some(true) {
            return Err(bad("do_pan_and_scan", "pan-and-scan is not implemented"));
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields of google/gemma-3-4b-it's preprocessor_config.json.
    const GEMMA3_4B_IT: &str = r#"{
        "do_convert_rgb": null, "do_normalize": true, "do_pan_and_scan": null, "do_rescale": true,
        "do_resize": true, "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor",
        "image_seq_length": 256, "image_std": [0.5, 0.5, 0.5], "pan_and_scan_max_num_crops": null,
        "pan_and_scan_min_crop_size": null, "pan_and_scan_min_ratio_to_activate": null,
        "processor_class": "Gemma3Processor", "resample": 2, "rescale_factor": 0.00392156862745098,
        "size": {"height": 896, "width": 896}
    }"#;

    #[test]
    fn gemma3_file_gives_the_default() {
        let cfg = PreprocessConfig::from_preprocessor_json(GEMMA3_4B_IT).expect("parses");
        assert_eq!(cfg, PreprocessConfig::default());
        assert_eq!(
            PreprocessConfig::from_preprocessor_json("{}").expect("parses"),
            PreprocessConfig::default()
        );
    }

    #[test]
    fn fields_are_honoured() {
        let cfg = PreprocessConfig::from_preprocessor_json(
            r#"{"size": {"height": 224, "width": 224}, "image_mean": [0.1, 0.2, 0.3], "image_std": 0.25,
                "rescale_factor": 0.5, "resample": 3}"#,
        )
        .expect("parses");
        assert_eq!(cfg.size, 224);
        assert_eq!(cfg.mean, [0.1, 0.2, 0.3]);
        assert_eq!(cfg.std, [0.25; 3]);
        assert_eq!(cfg.rescale, 0.5);
        assert_eq!(cfg.resample, Resample::Bicubic);
        assert!(cfg.resize);

        let cfg = PreprocessConfig::from_preprocessor_json(
            r#"{"do_resize": false, "do_rescale": false, "do_normalize": false, "size": 300}"#,
        )
        .expect("parses");
        assert!(!cfg.resize);
        assert_eq!(cfg.size, 300);
        assert_eq!((cfg.rescale, cfg.mean, cfg.std), (1.0, [0.0; 3], [1.0; 3]));
    }

    #[test]
    fn bad_fields_are_named() {
        let cases = [
            (r#"{"image_mean": "0.5"}"#, "image_mean"),
            (r#"{"image_mean": [0.5, 0.5]}"#, "image_mean"),
            (r#"{"image_std": [0.5, "x", 0.5]}"#, "image_std"),
            (r#"{"rescale_factor": "1/255"}"#, "rescale_factor"),
            (r#"{"size": {"height": "896", "width": 896}}"#, "size.height"),
            (r#"{"size": {"height": 896, "width": 0}}"#, "size.width"),
            (r#"{"size": {"height": 896, "width": 900}}"#, "size"),
            (r#"{"size": {"shortest_edge": 896}}"#, "size"),
            (r#"{"size": [896, 896]}"#, "size"),
            (r#"{"resample": "bilinear"}"#, "resample"),
            (r#"{"resample": 1}"#, "resample"),
            (r#"{"do_resize": 1}"#, "do_resize"),
            (r#"{"do_rescale": "yes"}"#, "do_rescale"),
            (r#"{"do_normalize": []}"#, "do_normalize"),
            (r#"{"do_convert_rgb": 0}"#, "do_convert_rgb"),
            (r#"{"do_pan_and_scan": true}"#, "do_pan_and_scan"),
            ("[1, 2]", "(file)"),
            ("{", "(file)"),
        ];
        for (text, field) in cases {
            match PreprocessConfig::from_preprocessor_json(text) {
                Err(e @ ImageError::BadConfig { .. }) => {
                    let ImageError::BadConfig { field: f, .. } = &e else {
                        unreachable!()
                    };
                    assert_eq!(f, field, "{text}");
                    assert!(e.to_string().contains(&format!("`{field}`")), "{e}");
                }
                other => panic!("{text}: expected BadConfig for {field}, got {other:?}"),
            }
        }
    }
}
