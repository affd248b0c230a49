// Op::Embed: out[r, :] = table[tokens[r], :] * scale, one invocation per group (1 or 4 values)
// of a row. A table larger than the binding limit is bound in chunks of rows (row_lo ..
// row_hi); each chunk's dispatch writes only the rows whose token falls in it.
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
    let g = gid.x;
    let r = wid.y;
    let tok = args[p.tokens + r];
    if (g * GROUP >= p.cols || tok < p.row_lo || tok >= p.row_hi) {
        return;
    }
    let w = load_group((tok - p.row_lo) * p.row_bytes, g) * p.scale;
    let at = p.dst + r * p.cols + g * GROUP;
    act[at] = w.x;
    if (GROUP == 4u) {
        act[at + 1u] = w.y;
        act[at + 2u] = w.z;
        act[at + 3u] = w.w;
    }
}
