//! Image file bytes to the `pixel_values` tensor of Gemma 3's image processor.
//!
//! Two steps: [`decode`] turns PNG, JPEG or WebP bytes into an 8-bit RGB image, and [`preprocess`]
//! turns that into the CHW `f32` tensor (3 x size x size) that Hugging Face transformers puts in
//! `pixel_values[0]` for one image, ready for the SigLIP vision tower. The crate knows nothing of
//! models or backends.
//!
//! # The reference
//!
//! The target is transformers' PIL-based (formerly "slow") Gemma 3 image processor, compared
//! against **transformers 5.24.0 (`Gemma3ImageProcessorPil`) and 4.57.6 (`Gemma3ImageProcessor`),
//! both with Pillow 13.0.0** (x86-64 wheels), which give identical `pixel_values` on the fixtures
//! (`tests/fixtures/images/`, made by its `make_images.py`):
//!
//! * In transformers 5.x the PIL processor is `Gemma3ImageProcessorPil`, and the name
//!   `Gemma3ImageProcessor` is the torchvision one (4.x's `Gemma3ImageProcessorFast`).
//!   `AutoImageProcessor` picks the torchvision class when torchvision is installed and the PIL class
//!   otherwise (`backend="pil"` forces it). In transformers 4.x, `AutoImageProcessor` gave the slow
//!   PIL `Gemma3ImageProcessor` unless `use_fast=True`. The torchvision variant resizes with
//!   torchvision's bilinear kernel on a tensor and differs from PIL by a few levels; it is not
//!   what this crate reproduces. The PIL pipeline's arithmetic is the same in 4.x's
//!   `Gemma3ImageProcessor` and 5.x's `Gemma3ImageProcessorPil`.
//! * Per image: convert to RGB, resize to `size x size` with PIL (`resample = 2`, bilinear; no
//!   aspect ratio kept), then rescale (`u8 as f64 * rescale_factor`, cast to `f32`), then normalise
//!   (`(x - mean) / std` in `f32`), then HWC to CHW. The resize happens on the `uint8` image:
//!   `transformers.image_transforms.resize` turns the `uint8` array into a PIL image
//!   (`to_pil_image`, no rescaling for `uint8`), calls `PIL.Image.resize`, and converts back; the
//!   rescale to `[0, 1]` comes after. So the reference for the resize is Pillow's `ImagingResample`
//!   on 8-bit data (antialiased convolution, fixed-point weights, a clip to `u8` after each pass),
//!   which this crate reimplements bit for bit (see the `resample` module's comment).
//! * The defaults are those of `google/gemma-3-4b-it`'s `preprocessor_config.json`: size 896 x 896,
//!   `image_mean = image_std = [0.5, 0.5, 0.5]` (transformers' `IMAGENET_STANDARD_MEAN/STD`, also the
//!   class defaults), `rescale_factor = 1/255`, `resample = 2`. (The class default size is 224; the
//!   checkpoint's file sets 896.)
//! * Pan-and-scan (`do_pan_and_scan`, off by default for Gemma 3) is **not implemented**; a config
//!   that turns it on is refused.
//!
//! # Decoding
//!
//! [`decode`] follows what transformers does for an image given as a path, URL or base64 string
//! (`transformers.image_utils.load_image`): apply the EXIF orientation (`ImageOps.exif_transpose`),
//! then `Image.convert("RGB")`, which *drops* an alpha channel (it does not composite), replicates
//! grey, expands palettes, and keeps the high byte of 16-bit colour samples (Pillow reads a 16-bit
//! RGB(A) PNG as 8-bit this way; a 16-bit grey PNG becomes mode `I;16`, whose conversion clamps to
//! 255, which is reproduced too). Note that transformers 5.x's `convert_to_rgb`, applied when a PIL
//! image *object* with alpha is handed to the processor directly, composites it over white instead;
//! this crate does not do that (transformers 4.x dropped alpha there too).
//!
//! Decoders are the `image` crate's (png, zune-jpeg, image-webp), not Pillow's (libpng, libjpeg-turbo,
//! libwebp). PNG and WebP (lossless, and the lossy fixture too) decode to the same pixels. JPEG does
//! not: on the fixture (quality 90, 4:2:0) about a fifth of the decoded bytes differ from
//! libjpeg-turbo's by up to 4 levels (different IDCT and chroma upsampling), so `pixel_values` is off
//! by up to 0.024 there (mean 0.002). That is the one known difference from the reference; given
//! Pillow's decoded pixels, the output is bit for bit the same.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod config;
mod decode;
mod resample;

pub use decode::{decode, MAX_PIXELS};
/// An 8-bit RGB image, as [`decode`] returns it and [`preprocess`] takes it (re-exported from the
/// `image` crate).
pub use image::RgbImage;

/// The resampling filter of the resize, as Pillow's `Image.Resampling`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resample {
    /// Pillow's `BILINEAR` (`resample = 2`): the triangle filter, antialiased when downscaling.
    /// Gemma 3's choice.
    Bilinear,
    /// Pillow's `BICUBIC` (`resample = 3`): Keys' cubic with `a = -0.5`, antialiased when
    /// downscaling.
    Bicubic,
}

impl Resample {
    /// The filter for a Pillow `Image.Resampling` number (as in `preprocessor_config.json`), if it
    /// is one this crate implements (2 = bilinear, 3 = bicubic).
    pub fn from_pil(value: i64) -> Option<Resample> {
        match value {
            2 => Some(Resample::Bilinear),
            3 => Some(Resample::Bicubic),
            _ => None,
        }
    }
}

/// How [`preprocess`] turns an RGB image into `pixel_values`.
///
/// `Default` is Gemma 3's (google/gemma-3-4b-it's `preprocessor_config.json`).
#[derive(Clone, Debug, PartialEq)]
pub struct PreprocessConfig {
    /// Whether to resize at all (`do_resize`). When `false`, the output keeps the image's own
    /// height and width.
    pub resize: bool,
    /// Output height and width in pixels (`size.height == size.width`): 896 for Gemma 3.
    pub size: u32,
    /// Per-channel mean subtracted after rescaling (`image_mean`): `[0.5; 3]` for Gemma 3.
    /// `[0.0; 3]` (with `std` `[1.0; 3]`) when `do_normalize` is false.
    pub mean: [f32; 3],
    /// Per-channel divisor after subtracting the mean (`image_std`): `[0.5; 3]` for Gemma 3.
    pub std: [f32; 3],
    /// Factor applied to the `u8` values (`rescale_factor`): `1/255`; `1.0` when `do_rescale` is
    /// false. An `f64` because transformers multiplies in `float64` before casting to `float32`;
    /// an `f32` factor would change the last bit of about half the 256 levels.
    pub rescale: f64,
    /// The resize filter (`resample`): bilinear for Gemma 3.
    pub resample: Resample,
}

impl Default for PreprocessConfig {
    fn default() -> Self {
        PreprocessConfig {
            resize: true,
            size: 896,
            mean: [0.5; 3],
            std: [0.5; 3],
            rescale: 1.0 / 255.0,
            resample: Resample::Bilinear,
        }
    }
}

/// What can go wrong turning bytes into `pixel_values`.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The bytes look like a supported format (`format`, guessed from the signature) but could not
    /// be decoded.
    #[error("cannot decode the image (it looks like {format}): {reason}")]
    Undecodable {
        /// The format guessed from the file signature: `"PNG"`, `"JPEG"` or `"WebP"`.
        format: &'static str,
        /// The decoder's complaint.
        reason: String,
    },
    /// The image has more pixels than [`MAX_PIXELS`]; refused before the pixel buffer is allocated.
    #[error("image is {width}x{height} ({} pixels), above the limit of {limit} pixels", *width as u64 * *height as u64)]
    TooLarge {
        /// Width in pixels, from the file's header.
        width: u32,
        /// Height in pixels, from the file's header.
        height: u32,
        /// The limit it exceeds ([`MAX_PIXELS`]).
        limit: u64,
    },
    /// The bytes are not PNG, JPEG or WebP (`0` names what they look like, if anything).
    #[error("unsupported image format: {0} (supported: PNG, JPEG, WebP)")]
    UnsupportedFormat(String),
    /// A field of a `preprocessor_config.json` has the wrong type or a value this crate cannot
    /// honour.
    #[error("preprocessor config field `{field}`: {reason}")]
    BadConfig {
        /// The JSON field, e.g. `image_mean` or `size.height`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Turns an RGB image into Gemma 3's `pixel_values` for it: `f32`, CHW (channel-major: all of R,
/// then G, then B), `3 * size * size` values (or `3 * height * width` when `cfg.resize` is false),
/// equal to transformers' `pixel_values[0]` flattened.
///
/// Resizes with Pillow's arithmetic on the `u8` image (bit-exact), then per value computes
/// `((v as f64 * rescale) as f32 - mean[c]) / std[c]`.
pub fn preprocess(img: &RgbImage, cfg: &PreprocessConfig) -> Vec<f32> {
    let (in_w, in_h) = (img.width() as usize, img.height() as usize);
    let (w, h) = if cfg.resize {
        (cfg.size as usize, cfg.size as usize)
    } else {
        (in_w, in_h)
    };
    let resized;
    let pixels: &[u8] = if (w, h) == (in_w, in_h) {
        img.as_raw()
    } else {
        resized = resample::resize_rgb8(img.as_raw(), in_w, in_h, w, h, cfg.resample);
        &resized
    };

    let plane = w * h;
    let mut out = vec![0f32; 3 * plane];
    for (c, dst) in out.chunks_exact_mut(plane.max(1)).enumerate().take(3) {
        // 256 levels: precompute each once, with transformers' float64-then-float32 steps.
        let mut lut = [0f32; 256];
        for (v, l) in lut.iter_mut().enumerate() {
            let rescaled = (v as f64 * cfg.rescale) as f32;
            *l = (rescaled - cfg.mean[c]) / cfg.std[c];
        }
        for (d, px) in dst.iter_mut().zip(pixels.chunks_exact(3)) {
            *d = lut[px[c] as usize];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chw_layout_and_normalisation_on_2x2() {
        // Pixels (x, y): (0,0) red, (1,0) green, (0,1) blue, (1,1) mid grey 128.
        let img = RgbImage::from_raw(2, 2, vec![255, 0, 0, 0, 255, 0, 0, 0, 255, 128, 128, 128])
            .expect("2x2 buffer");
        let cfg = PreprocessConfig {
            resize: false,
            ..PreprocessConfig::default()
        };
        let out = preprocess(&img, &cfg);
        // (v/255 - 0.5) / 0.5: 255 -> 1, 0 -> -1, 128 -> 1/255 (0.00392157).
        let g = ((128.0f64 / 255.0) as f32 - 0.5) / 0.5;
        assert!((g - 1.0 / 255.0).abs() < 1e-7);
        #[rustfmt::skip]
        let expected = [
            1.0, -1.0, -1.0, g, // R plane, row-major
            -1.0, 1.0, -1.0, g, // G plane
            -1.0, -1.0, 1.0, g, // B plane
        ];
        assert_eq!(out, expected);

        // Per-channel mean/std and no rescale.
        let cfg = PreprocessConfig {
            resize: false,
            mean: [1.0, 2.0, 3.0],
            std: [2.0, 4.0, 8.0],
            rescale: 1.0,
            ..PreprocessConfig::default()
        };
        let out = preprocess(&img, &cfg);
        assert_eq!(out[0], (255.0 - 1.0) / 2.0);
        assert_eq!(out[5], (255.0 - 2.0) / 4.0);
        assert_eq!(out[11], (128.0 - 3.0) / 8.0);
    }

    #[test]
    fn default_resizes_to_896() {
        let img = RgbImage::from_pixel(3, 5, image::Rgb([10, 20, 30]));
        let out = preprocess(&img, &PreprocessConfig::default());
        assert_eq!(out.len(), 3 * 896 * 896);
        let level = |v: u8| ((v as f64 / 255.0) as f32 - 0.5) / 0.5;
        assert!(out[..896 * 896].iter().all(|&v| v == level(10)));
        assert!(out[2 * 896 * 896..].iter().all(|&v| v == level(30)));
    }

    #[test]
    fn resample_numbers() {
        assert_eq!(Resample::from_pil(2), Some(Resample::Bilinear));
        assert_eq!(Resample::from_pil(3), Some(Resample::Bicubic));
        assert_eq!(Resample::from_pil(1), None);
    }
}
