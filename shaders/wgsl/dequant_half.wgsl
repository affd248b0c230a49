// Weight rows 0 .. p.n_count of the bound chunk, decoded by the format's load_group, as f16 at
// p.h_b of the staging buffer, rows p.kp apart, zero past k and in the rows up to p.np. One
// invocation writes 4 neighbouring values of row wid.y + wid.z * nwg.y (p.kp is a multiple of
// 16; k is a multiple of GROUP).
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>,
        @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let c = gid.x * 4u;
    let r = wid.y + wid.z * nwg.y;
    if (c >= p.kp || r >= p.np) {
        return;
    }
    var w = vec4<f32>(0.0);
    if (r < p.n_count) {
        let row = r * p.row_bytes;
        if (GROUP == 4u) {
            if (c < p.k) {
                w = load_group(row, c / 4u);
            }
        } else {
            for (var i = 0u; i < 4u; i++) {
                if (c + i < p.k) {
                    w[i] = load_group(row, c + i).x;
                }
            }
        }
    }
    let h = vec4<f16>(clamp(w, vec4<f32>(-F16_MAX), vec4<f32>(F16_MAX)));
    let at = p.h_b + r * p.kp + c;
    hs[at] = h.x;
    hs[at + 1u] = h.y;
    hs[at + 2u] = h.z;
    hs[at + 3u] = h.w;
}
