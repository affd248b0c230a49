// Shared by every tandem WGSL kernel (prepended to each module by the wgpu backend).
//
// Bindings, the same numbers in every kernel that has them:
//   0: this dispatch's parameters (uniform),
//   1: the program's arena of f32 values (every value of the graph, and attention's partials),
//   2: the step arguments (u32: tokens, positions, slots, select, then rope tables as f32 bits),
//   3: a weight (u32 words of the stored bytes; quantized blocks are decoded in the kernels),
//   4, 5: a layer's K and V caches (u32 words: one f32 or two f16 per word).
// Offsets in parameters count f32 elements of the arena or u32 words of the arguments; weight
// offsets count bytes from the start of the bound range.

// tanh that saturates instead of overflowing.
fn tanh_safe(x: f32) -> f32 {
    let e = exp(-2.0 * abs(x));
    let t = (1.0 - e) / (1.0 + e);
    return select(t, -t, x < 0.0);
}

// gelu with the tanh approximation (Op::GeGlu's gate).
fn gelu_tanh(a: f32) -> f32 {
    return 0.5 * a * (1.0 + tanh_safe(0.7978845608 * (a + 0.044715 * a * a * a)));
}

const NEG_INF: f32 = -3.402823466e+38;
