// Input rows p.x (p.rows of p.k f32 values) as f16 at p.h_a of the staging buffer, rows p.kp
// apart, zero past k and in the padding rows up to the grid's height (the tile's multiple).
// One invocation writes 4 neighbouring values (p.kp is a multiple of 16).
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x * 4u;
    let r = gid.y;
    if (c >= p.kp) {
        return;
    }
    let at = p.h_a + r * p.kp + c;
    let src = p.x + r * p.k + c;
    for (var i = 0u; i < 4u; i++) {
        var v = 0.0;
        if (r < p.rows && c + i < p.k) {
            v = act[src + i];
        }
        hs[at + i] = f16(clamp(v, -F16_MAX, F16_MAX));
    }
}
