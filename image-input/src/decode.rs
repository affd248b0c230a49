//! Bytes to an 8-bit RGB image, the way transformers' `load_image` + `convert("RGB")` does.

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits};

use crate::{ImageError, RgbImage};

/// The largest image [`decode`] accepts, in pixels (width x height): 64 megapixels (64 * 2^20).
///
/// Checked against the file's header before the pixel buffer is allocated.
pub const MAX_PIXELS: u64 = 64 * 1024 * 1024;

/// The most bytes the decoder may allocate: the largest accepted image at 8 bytes a pixel (16-bit
/// RGBA), plus room for the decoders' own buffers.
const MAX_ALLOC: u64 = MAX_PIXELS * 8 + 64 * 1024 * 1024;

fn format_name(format: ImageFormat) -> &'static str {
    match format {
        ImageFormat::Png => "PNG",
        ImageFormat::Jpeg => "JPEG",
        ImageFormat::WebP => "WebP",
        _ => "another format",
    }
}

/// Decodes PNG, JPEG or WebP bytes (the format is recognised from the signature) into an 8-bit RGB
/// image, as transformers does for an image given as a file, URL or base64 string: the EXIF
/// orientation is applied, an alpha channel is dropped (not composited), grey is replicated to
/// three channels, and 16-bit samples keep their high byte (16-bit grey clamps to 255, as
/// Pillow's `I;16` conversion does).
///
/// Refuses images of more than [`MAX_PIXELS`] pixels with [`ImageError::TooLarge`], from the header,
/// before allocating the pixel buffer.
pub fn decode(bytes: &[u8]) -> Result<RgbImage, ImageError> {
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ImageError::UnsupportedFormat(format!("unreadable input ({e})")))?;
    let format = match reader.format() {
        Some(f @ (ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP)) => f,
        Some(other) => return Err(ImageError::UnsupportedFormat(format!("{other:?}"))),
        None => {
            return Err(ImageError::UnsupportedFormat(
                "unrecognised file signature".into(),
            ))
        }
    };
    let name = format_name(format);
    let undecodable = |e: image::ImageError| ImageError::Undecodable {
        format: name,
        reason: e.to_string(),
    };

    let mut reader = reader;
    let mut limits = Limits::default();
    limits.max_alloc = Some(MAX_ALLOC);
    reader.limits(limits);
    let mut decoder = reader.into_decoder().map_err(undecodable)?;

    let (width, height) = decoder.dimensions();
    if u64::from(width) * u64::from(height) > MAX_PIXELS {
        return Err(ImageError::TooLarge {
            width,
            height,
            limit: MAX_PIXELS,
        });
    }
    // A broken or absent EXIF block is no reason to refuse the pixels: Pillow's `exif_transpose`
    // leaves such an image as it is too.
    let orientation = decoder
        .orientation()
        .unwrap_or(image::metadata::Orientation::NoTransforms);
    let mut img = DynamicImage::from_decoder(decoder).map_err(|e| match e {
        image::ImageError::Limits(_) => ImageError::TooLarge {
            width,
            height,
            limit: MAX_PIXELS,
        },
        e => undecodable(e),
    })?;
    img.apply_orientation(orientation);
    Ok(to_rgb8_like_pil(img))
}

/// `Image.convert("RGB")` on the image as Pillow would have opened it.
fn to_rgb8_like_pil(img: DynamicImage) -> RgbImage {
    let (w, h) = (img.width(), img.height());
    let from = |raw: Vec<u8>| RgbImage::from_raw(w, h, raw);
    let rgb = match img {
        DynamicImage::ImageRgb8(rgb) => return rgb,
        DynamicImage::ImageRgba8(b) => from(b.pixels().flat_map(|p| [p[0], p[1], p[2]]).collect()),
        DynamicImage::ImageLuma8(b) => from(b.pixels().flat_map(|p| [p[0]; 3]).collect()),
        DynamicImage::ImageLumaA8(b) => from(b.pixels().flat_map(|p| [p[0]; 3]).collect()),
        // Pillow reads 16-bit RGB, RGBA and LA PNGs through the `;16B` raw modes: the high byte.
        DynamicImage::ImageRgb16(b) => from(b.pixels().flat_map(|p| p.0.map(|v| (v >> 8) as u8)).collect()),
        DynamicImage::ImageRgba16(b) => from(
            b.pixels()
                .flat_map(|p| [p[0], p[1], p[2]].map(|v| (v >> 8) as u8))
                .collect(),
        ),
        DynamicImage::ImageLumaA16(b) => from(b.pixels().flat_map(|p| [(p[0] >> 8) as u8; 3]).collect()),
        // 16-bit grey opens as `I;16`, whose conversion to RGB clamps: above 255 is 255.
        DynamicImage::ImageLuma16(b) => from(b.pixels().flat_map(|p| [p[0].min(255) as u8; 3]).collect()),
        other => Some(other.to_rgb8()),
    };
    // The buffers above have exactly w * h * 3 bytes; the fallback cannot be reached with them.
    rgb.unwrap_or_else(|| RgbImage::new(w, h))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PNG file from its IHDR fields and raw (filtered) scanlines.
    pub(crate) fn png(w: u32, h: u32, bit_depth: u8, color: u8, idat: &[u8]) -> Vec<u8> {
        fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
            out.extend_from_slice(&(data.len() as u32).to_be_bytes());
            let start = out.len();
            out.extend_from_slice(kind);
            out.extend_from_slice(data);
            let crc = crc32(&out[start..]);
            out.extend_from_slice(&crc.to_be_bytes());
        }
        let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = Vec::new();
        ihdr.extend_from_slice(&w.to_be_bytes());
        ihdr.extend_from_slice(&h.to_be_bytes());
        ihdr.extend_from_slice(&[bit_depth, color, 0, 0, 0]);
        chunk(&mut out, b"IHDR", &ihdr);
        chunk(&mut out, b"IDAT", idat);
        chunk(&mut out, b"IEND", &[]);
        out
    }

    fn crc32(data: &[u8]) -> u32 {
        let mut crc = 0xffff_ffffu32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0xedb8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    /// zlib "stored" (uncompressed) stream of `data` (< 64 KiB).
    fn zlib_stored(data: &[u8]) -> Vec<u8> {
        let mut out = vec![0x78, 0x01, 0x01];
        let n = data.len() as u16;
        out.extend_from_slice(&n.to_le_bytes());
        out.extend_from_slice(&(!n).to_le_bytes());
        out.extend_from_slice(data);
        let (mut a, mut b) = (1u32, 0u32);
        for &x in data {
            a = (a + u32::from(x)) % 65521;
            b = (b + a) % 65521;
        }
        out.extend_from_slice(&((b << 16) | a).to_be_bytes());
        out
    }

    #[test]
    fn hand_made_png_decodes() {
        // 2x1 RGBA: alpha is dropped, not composited.
        let raw = [0u8, 10, 20, 30, 0, 200, 100, 50, 128];
        let img = decode(&png(2, 1, 8, 6, &zlib_stored(&raw))).expect("decodes");
        assert_eq!(img.as_raw(), &[10, 20, 30, 200, 100, 50]);
    }

    #[test]
    fn sixteen_bit_samples_like_pillow() {
        // RGB16: the high byte.
        let mut raw = vec![0u8];
        for v in [0x1280u16, 0x34ff, 0xff00, 0x0001, 0x8080, 0xfffe] {
            raw.extend_from_slice(&v.to_be_bytes());
        }
        let img = decode(&png(2, 1, 16, 2, &zlib_stored(&raw))).expect("decodes");
        assert_eq!(img.as_raw(), &[18, 52, 255, 0, 128, 255]);
        // Grey16: clamped (Pillow's I;16 -> RGB).
        let mut raw = vec![0u8];
        for v in [0u16, 100, 255, 256, 65535] {
            raw.extend_from_slice(&v.to_be_bytes());
        }
        let img = decode(&png(5, 1, 16, 0, &zlib_stored(&raw))).expect("decodes");
        let grey: Vec<u8> = img.pixels().map(|p| p[0]).collect();
        assert_eq!(grey, [0, 100, 255, 255, 255]);
    }

    #[test]
    fn broken_png_is_undecodable() {
        let mut bytes = png(4, 4, 8, 2, &zlib_stored(&[0u8; 4 * 13]));
        // Corrupt the IDAT payload (its CRC no longer matches, and the zlib stream is cut short).
        let n = bytes.len();
        bytes.truncate(n - 30);
        bytes.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        match decode(&bytes) {
            Err(ImageError::Undecodable { format: "PNG", .. }) => {}
            other => panic!("expected Undecodable PNG, got {other:?}"),
        }
        // A truncated header.
        match decode(&bytes[..20]) {
            Err(ImageError::Undecodable { format: "PNG", .. }) => {}
            other => panic!("expected Undecodable PNG, got {other:?}"),
        }
    }

    #[test]
    fn huge_png_header_is_refused_before_decoding() {
        // A header claiming 20000 x 20000 RGB (1.2 GB decoded) with a one-byte IDAT: refused from
        // the header alone, so the call returns at once without the pixel allocation.
        let bytes = png(20000, 20000, 8, 2, &zlib_stored(&[0]));
        let err = decode(&bytes).expect_err("too large");
        match &err {
            ImageError::TooLarge {
                width: 20000,
                height: 20000,
                limit,
            } => assert_eq!(*limit, MAX_PIXELS),
            other => panic!("expected TooLarge, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.contains("20000x20000"), "{msg}");
    }

    #[test]
    fn unknown_and_unsupported_formats() {
        assert!(matches!(
            decode(b"hello, world"),
            Err(ImageError::UnsupportedFormat(_))
        ));
        assert!(matches!(decode(b""), Err(ImageError::UnsupportedFormat(_))));
        match decode(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;") {
            Err(ImageError::UnsupportedFormat(f)) => assert!(f.contains("Gif"), "{f}"),
            other => panic!("expected UnsupportedFormat, got {other:?}"),
        }
    }
}
