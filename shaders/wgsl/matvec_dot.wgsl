// Op::MatMul on block-format weights for a few input rows (decode, batched decode) through
// packed integer dot products (WGSL's dot4I8Packed: SPIR-V's OpSDot where the device has
// shaderIntegerDotProduct), the Vulkan backend's matvec_dot.comp in WGSL. The input was
// quantised beforehand (quantize_q8.wgsl; layout in parts/dot_input.wgsl), and each 32-value
// unit of a weight row comes as 32 int8 codes with a scale and an offset per 16 values
// (dot/<format>.wgsl), so that
//   sum_i w_i x_i = d (s0 sum_{i<16} q_i x_i + s1 sum_{i>=16} q_i x_i) + o0 sa + o1 sb,
// with x_i the input's codes, d its scale and sa, sb d times its codes' sums over each half (an
// offset such as q4_0's -8 or q4_k's min costs no per-value work).
//
// A workgroup of 64 covers NC output columns j0 .. j0 + NC - 1 (with GEGLU each with its up
// row, n_count further: NW = NC or 2 NC weight rows) and R input rows; its invocations take
// every 64th unit of the rows, decode it for the NW weight rows once and dot it with each of
// the R input rows' blocks. Partial sums meet in workgroup memory.

// Input rows per workgroup (1, 2, 4 or 8).
override R: u32 = 1u;
// Output columns per workgroup (1, 2 or 4; with GEGLU at most 2); NW R <= 32.
override NC: u32 = 1u;
// The input's 16-bit form (two byte planes, twice the dot products) rather than 8 bits.
override WIDE: bool = true;
// Output column j is gelu_tanh(row j . x) * (row j + n_count . x) (fuse.rs's MatMulGeGlu).
override GEGLU: bool = false;

const WG: u32 = 64u;

// [slot s R + r][invocation], slots: weight rows of the workgroup (NW <= 4) x input rows, at
// most 32.
var<workgroup> part: array<f32, 2048>;
// The same summed over groups of 8 invocations.
var<workgroup> part2: array<f32, 256>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let tid = lid.x;
    let j0 = (wid.x + wid.y * nwg.x) * NC;
    let r0 = wid.z * R;
    let nw = select(NC, 2u * NC, GEGLU);
    let units = p.k / 32u;
    let stride = dq_stride(WIDE);
    var acc: array<f32, 32>;
    for (var u = tid; u < units; u += WG) {
        var q: array<u32, 32>;
        var c: array<vec4<f32>, 4>;
        for (var s = 0u; s < nw; s++) {
            // Past the last column: a valid row, its sums never stored.
            var j = min(j0 + s, p.n_count - 1u);
            if (s >= NC) {
                j = min(j0 + s - NC, p.n_count - 1u) + p.n_count;
            }
            let unit = dot_unit(j * p.row_bytes, u);
            for (var i = 0u; i < 8u; i++) {
                q[8u * s + i] = unit.q[i];
            }
            c[s] = unit.c;
        }
        for (var r = 0u; r < R; r++) {
            let row = min(r0 + r, p.rows - 1u);
            let at = (row * units + u) * stride;
            let h0 = dq[at];
            let h1 = dq[at + 1u];
            var l0 = vec4<u32>(0u);
            var l1 = vec4<u32>(0u);
            var m = bitcast<vec4<f32>>(dq[at + 2u]);
            if (WIDE) {
                l0 = dq[at + 2u];
                l1 = dq[at + 3u];
                m = bitcast<vec4<f32>>(dq[at + 4u]);
            }
            for (var s = 0u; s < nw; s++) {
                let o = 8u * s;
                var ia = dot4I8Packed(q[o], h0.x) + dot4I8Packed(q[o + 1u], h0.y)
                    + dot4I8Packed(q[o + 2u], h0.z) + dot4I8Packed(q[o + 3u], h0.w);
                var ib = dot4I8Packed(q[o + 4u], h1.x) + dot4I8Packed(q[o + 5u], h1.y)
                    + dot4I8Packed(q[o + 6u], h1.z) + dot4I8Packed(q[o + 7u], h1.w);
                if (WIDE) {
                    ia = 256 * ia + dot4I8Packed(q[o], l0.x) + dot4I8Packed(q[o + 1u], l0.y)
                        + dot4I8Packed(q[o + 2u], l0.z) + dot4I8Packed(q[o + 3u], l0.w);
                    ib = 256 * ib + dot4I8Packed(q[o + 4u], l1.x) + dot4I8Packed(q[o + 5u], l1.y)
                        + dot4I8Packed(q[o + 6u], l1.z) + dot4I8Packed(q[o + 7u], l1.w);
                }
                let cs = c[s];
                acc[s * R + r] += m.x * (cs.x * f32(ia) + cs.y * f32(ib)) + cs.z * m.y + cs.w * m.z;
            }
        }
    }
    let slots = nw * R;
    for (var s = 0u; s < slots; s++) {
        part[s * WG + tid] = acc[s];
    }
    workgroupBarrier();
    // part2[8 s + g]: slot s over invocations 8 g .. 8 g + 7.
    for (var o = tid; o < 8u * slots; o += WG) {
        let b = (o >> 3u) * WG + 8u * (o & 7u);
        var t = 0.0;
        for (var i = 0u; i < 8u; i++) {
            t += part[b + i];
        }
        part2[o] = t;
    }
    workgroupBarrier();
    // Output column j0 + tid / R of input row r0 + tid % R.
    if (tid < NC * R) {
        let jj = tid / R;
        let r = tid % R;
        let j = j0 + jj;
        let row = r0 + r;
        if (j < p.n_count && row < p.rows) {
            var t = 0.0;
            var tu = 0.0;
            for (var g = 0u; g < 8u; g++) {
                t += part2[8u * (jj * R + r) + g];
                if (GEGLU) {
                    tu += part2[8u * ((NC + jj) * R + r) + g];
                }
            }
            if (GEGLU) {
                t = gelu_tanh(t) * tu;
            }
            store(p.n_base + j, row, t);
        }
    }
}
