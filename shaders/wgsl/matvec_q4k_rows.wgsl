// Op::MatMul on q4_k weights (formats/q4_k.wgsl's layout) for one input row: decode's matvec,
// the Vulkan backend's matvec_q4k.comp in WGSL. A workgroup of W lane groups of 32 (WG = 32 W
// invocations) covers 4 NR neighbouring output columns; no subgroup operation, so every variant
// runs it.
// Invocation tid = 32 bg + 8 rs + piece:
// - piece (0..7) owns 16 bytes of a block's 128 bytes of nibbles, one 16-byte load: chunk
//   c = piece / 2, half piece % 2, whose low nibbles are values 64 c + 16 (piece % 2) + 0..15
//   (sub-block 2c) and high nibbles the 16 values 32 further (sub-block 2c + 1). It decodes only
//   those two sub-blocks' scales and mins, from the block's 16-byte header (the same address for
//   the 8 pieces: a broadcast).
// - rs (0..3): the lane group's row set, output columns j0 + NR rs + 0 .. NR - 1 (with GEGLU each
//   also with its up row, n_count further), all against the same 32 input values, loaded once
//   per block as 8 vec4s.
// - bg (0..W-1): blocks bg, bg + W, ... of each row.
// Nibbles become floats without an int-to-float conversion: nibble q moved to the top of the
// mantissa of 1.0 is f = 1 + q / 16 exactly, so q . x = 16 (f . x - sum x).
// Partial sums meet in workgroup memory, over the block groups and then over the pieces. Views,
// chunk factors and nibble floats: parts/q4k_pair.wgsl.


// Rows per lane group (1, 2 or 4), sharing each load of the input.
override NR: u32 = 1u;
// Invocations per workgroup: 32 W, W from 1 to 8.
override WG: u32 = 32u;
// With GEGLU (a MatMul whose two equal halves only a GeGlu reads, fuse.rs): output column j is
// gelu_tanh(row j . x) * (row j + n_count . x).
override GEGLU: bool = false;

// [slot: NR rows, then NR up rows][invocation]: at most 8 x 256.
var<workgroup> part: array<f32, 2048>;
// [slot][lane of a group of 32], summed over the block groups.
var<workgroup> part2: array<f32, 256>;

// One block's 32 input values of an invocation: 16 at the low nibbles, 16 at the high, with
// their sums.
struct X32 {
    l0: vec4<f32>,
    l1: vec4<f32>,
    l2: vec4<f32>,
    l3: vec4<f32>,
    h0: vec4<f32>,
    h1: vec4<f32>,
    h2: vec4<f32>,
    h3: vec4<f32>,
    sl: f32,
    sh: f32,
}

// Piece `piece` (of chunk c = piece / 2) of the block at 16-byte index `blk` against its input
// values x.
fn piece_dot(blk: u32, piece: u32, x: X32) -> f32 {
    let q = wts4[blk + 1u + piece];
    let f = q4k_pair(wts4[blk], piece >> 1u);
    let dl = dot(nib_lo(q.x), x.l0) + dot(nib_lo(q.y), x.l1) + dot(nib_lo(q.z), x.l2)
        + dot(nib_lo(q.w), x.l3);
    let dh = dot(nib_hi(q.x), x.h0) + dot(nib_hi(q.y), x.h1) + dot(nib_hi(q.z), x.h2)
        + dot(nib_hi(q.w), x.h3);
    return f.a.x * dl + f.a.y * dh - f.off.x * x.sl - f.off.y * x.sh;
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let tid = lid.x;
    let groups = WG / 32u;
    let j0 = (wid.x + wid.y * nwg.x) * (4u * NR);
    let piece = tid & 7u;
    let rs = (tid >> 3u) & 3u;
    let bg = tid >> 5u;
    let c = piece >> 1u;
    // This invocation's first vec4 of input within a block (low nibbles; high: 8 further).
    let xoff = 16u * c + 4u * (piece & 1u);
    // Rows are whole blocks of 144 bytes (9 16-byte values).
    let row16 = p.row_bytes / 16u;
    let blocks = p.k / 256u;
    // p.x: an arena offset, a multiple of 64 values.
    let x4 = p.x / 4u;
    var acc: array<f32, 8>;
    for (var b = bg; b < blocks; b += groups) {
        let xi = x4 + 64u * b + xoff;
        var x: X32;
        x.l0 = act4[xi];
        x.l1 = act4[xi + 1u];
        x.l2 = act4[xi + 2u];
        x.l3 = act4[xi + 3u];
        x.h0 = act4[xi + 8u];
        x.h1 = act4[xi + 9u];
        x.h2 = act4[xi + 10u];
        x.h3 = act4[xi + 11u];
        let one = vec4<f32>(1.0);
        x.sl = dot(x.l0 + x.l1 + x.l2 + x.l3, one);
        x.sh = dot(x.h0 + x.h1 + x.h2 + x.h3, one);
        for (var jj = 0u; jj < NR; jj++) {
            // Past the last column: a valid row, its sum never stored.
            let col = min(j0 + NR * rs + jj, p.n_count - 1u);
            acc[jj] += piece_dot(col * row16 + 9u * b, piece, x);
            if (GEGLU) {
                acc[NR + jj] += piece_dot((col + p.n_count) * row16 + 9u * b, piece, x);
            }
        }
    }

    let slots = select(NR, 2u * NR, GEGLU);
    for (var s = 0u; s < slots; s++) {
        part[s * WG + tid] = acc[s];
    }
    workgroupBarrier();
    // Over the block groups: part2[32 slot + 8 rs + piece].
    for (var o = tid; o < 32u * slots; o += WG) {
        var t = 0.0;
        for (var g = 0u; g < groups; g++) {
            t += part[(o >> 5u) * WG + 32u * g + (o & 31u)];
        }
        part2[o] = t;
    }
    workgroupBarrier();
    // Over the pieces: output column j0 + tid = j0 + NR rs + jj.
    if (tid < 4u * NR) {
        let rs_out = tid / NR;
        let jj = tid % NR;
        let j = j0 + tid;
        if (j < p.n_count) {
            var t = 0.0;
            var tu = 0.0;
            for (var q = 0u; q < 8u; q++) {
                t += part2[32u * jj + 8u * rs_out + q];
                if (GEGLU) {
                    tu += part2[32u * (NR + jj) + 8u * rs_out + q];
                }
            }
            if (GEGLU) {
                t = gelu_tanh(t) * tu;
            }
            store(p.n_base + j, 0u, t);
        }
    }
}
