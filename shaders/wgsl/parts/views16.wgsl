// The arena (binding 1) and the weight range (binding 3) again, as 16-byte values, for the decode
// matvecs that load 16 bytes at a time (the q4_k kernels, matvec_f16.wgsl, dot/q4_k.wgsl): an
// input run of 4 values and a q4_k super-block's header are each one load. `act4` is only read,
// at the input rows, never where the outputs go (binding 1's `act`).
@group(0) @binding(8) var<storage, read_write> act4: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read> wts4: array<vec4<u32>>;
