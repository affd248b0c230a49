// Shared by quantize_q8.wgsl and matvec_dot.wgsl: the quantised input of decode's integer-dot
// matvecs, in the program's staging buffer (binding 10), 16-byte values. Per block of 32 input
// values, rows after rows:
// - WIDE (16 bits): q = round(x / d), d = max |x| / 32639, as two signed byte planes
//   q = 256 hi + lo (lo sign-extended from q's low byte, so both planes are int8 and one signed
//   packed dot product serves each): 2 values of hi (values 4i .. 4i + 3 in word i, the lowest
//   byte first), 2 of lo, then (d, d sum q over values 0..15, d sum q over 16..31, 0) as f32
//   bits: 5 values. |q| <= 32639 keeps hi within int8.
// - else (8 bits, ggml's q8_1): d = max |x| / 127, one plane: 3 values.
@group(0) @binding(10) var<storage, read_write> dq: array<vec4<u32>>;

// 16-byte values per block of 32.
fn dq_stride(wide: bool) -> u32 {
    return select(3u, 5u, wide);
}

// One 32-value unit of a weight row (dot/<format>.wgsl's `dot_unit`): codes of values 4i ..
// 4i + 3 in word i as int8 (0 .. 63 or -128 .. 127), and per 16 values a scale and an offset,
// c = (scale 0..15, scale 16..31, offset 0..15, offset 16..31): w = scale q + offset.
struct DotUnit {
    q: array<u32, 8>,
    c: vec4<f32>,
}
