// The cooperative-matrix matmuls' output (matmul_coopmat.wgsl, matmul_half.wgsl): a subgroup
// stores one 16x16 accumulator at a time into its slot of `cs`, then its lanes write the slot to
// the split outputs, within the row bounds.
var<workgroup> cs: array<f32, 2048>; // [subgroups <= 8][16 x 16], row-major

// Slot `slot` of cs to output rows row0 .. row0 + 16 and columns col0 .. col0 + 16, by this
// subgroup's lanes.
fn write_slot(slot: u32, row0: u32, col0: u32, lane: u32, sg_size: u32) {
    for (var e = lane; e < 256u; e += sg_size) {
        let row = row0 + e / 16u;
        let col = col0 + e % 16u;
        if (row < p.rows && col < p.n_count) {
            store(p.n_base + col, row, cs[slot + e]);
        }
    }
}
