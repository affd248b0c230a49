// Op::Embed: out[r, :] = table[tokens[r], :] * scale, one invocation per unit of a row. A table
// larger than the binding limit is bound in chunks of rows (row_lo .. row_hi); each chunk's
// dispatch writes only the rows whose token falls in it.
struct Params {
    dst: u32,
    tokens: u32,
    cols: u32,
    row_bytes: u32,
    row_lo: u32,
    row_hi: u32,
    scale: f32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read> args: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let u = gid.x;
    let r = wid.y;
    let tok = args[p.tokens + r];
    if (u * UNIT >= p.cols || tok < p.row_lo || tok >= p.row_hi) {
        return;
    }
    load_unit((tok - p.row_lo) * p.row_bytes, u);
    let at = p.dst + r * p.cols + u * UNIT;
    for (var i = 0u; i < UNIT; i++) {
        act[at + i] = wu[i] * p.scale;
    }
}
