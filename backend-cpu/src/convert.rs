//! Decoding stored weight rows to f32.

#[cfg(test)]
use half::bf16;
use half::f16;
use tandem_backend_api::DType;

/// Decodes one row of `out.len()` elements stored as `dtype` in `bytes`. The caller has checked
/// at compile that rows are whole blocks and `bytes` is exactly one row, so the decoder cannot
/// fail here; if it did, the row reads as zeros rather than as stale data.
pub fn decode_row(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    if tandem_backend_api::kit::quant::dequantize_row(dtype, bytes, out).is_err() {
        debug_assert!(false, "decode_row({dtype}) on a malformed row");
        out.fill(0.0);
    }
}

/// Encodes f32 values as `dtype` (f32 or f16: the KV-cache types).
pub fn encode_row(dtype: DType, values: &[f32], out: &mut [u8]) {
    match dtype {
        DType::F16 => {
            for (v, c) in values.iter().zip(out.chunks_exact_mut(2)) {
                c.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
            }
        }
        _ => {
            for (v, c) in values.iter().zip(out.chunks_exact_mut(4)) {
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_each_float_type() {
        let vals = [1.5f32, -2.25, 0.0, 65504.0];
        let mut out = [0f32; 4];
        let f32b: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        decode_row(DType::F32, &f32b, &mut out);
        assert_eq!(out, vals);
        let f16b: Vec<u8> = vals
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect();
        decode_row(DType::F16, &f16b, &mut out);
        assert_eq!(out, vals);
        let bf16b: Vec<u8> = [1.5f32, -2.25, 0.0, 3.0]
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect();
        decode_row(DType::Bf16, &bf16b, &mut out);
        assert_eq!(out, [1.5, -2.25, 0.0, 3.0]);
        let mut enc = [0u8; 8];
        encode_row(DType::F16, &[1.5, -2.0, 0.0, 4.0], &mut enc);
        decode_row(DType::F16, &enc, &mut out);
        assert_eq!(out, [1.5, -2.0, 0.0, 4.0]);
    }
}
