// The f16 staging buffer of the cooperative-matrix prefill matmul (binding 7): input rows, and
// weight rows of a format other than f16, each rounded to f16 once per step, rows padded to the
// tile with zeros and k to p.kp, so matmul_half.wgsl's cooperative loads stay in bounds.
@group(0) @binding(7) var<storage, read_write> hs: array<f16>;
// f16's largest finite value: values beyond it are clamped rather than made infinite.
const F16_MAX: f32 = 65504.0;
