// The input of `matvec_dot.wgsl`: `rows` x `k` f32 values of the arena at p.x (k a multiple of
// 32) to blocks of 32 integers with a scale (layout: parts/dot_input.wgsl), one invocation per
// block, blocks row after row. Parameters: matmul_common.wgsl's (x, k, rows).

override WIDE: bool = true;

fn pack_i8(a: i32, b: i32, c: i32, d: i32) -> u32 {
    return (u32(a) & 0xFFu) | ((u32(b) & 0xFFu) << 8u) | ((u32(c) & 0xFFu) << 16u) | (u32(d) << 24u);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let units = p.k / 32u;
    let blk = gid.x + gid.y * nwg.x * 64u;
    if (blk >= p.rows * units) {
        return;
    }
    let row = blk / units;
    let base = p.x + row * p.k + 32u * (blk % units);
    var amax = 0.0;
    for (var i = 0u; i < 32u; i++) {
        amax = max(amax, abs(act[base + i]));
    }
    let top = select(127.0, 32639.0, WIDE);
    let d = amax / top;
    let inv = select(0.0, top / amax, amax > 0.0);
    var sa = 0;
    var sb = 0;
    var hi: array<u32, 8>;
    var lo: array<u32, 8>;
    for (var w = 0u; w < 8u; w++) {
        let x = vec4<f32>(act[base + 4u * w], act[base + 4u * w + 1u], act[base + 4u * w + 2u],
            act[base + 4u * w + 3u]);
        let q = clamp(vec4<i32>(round(x * inv)), vec4<i32>(-i32(top)), vec4<i32>(i32(top)));
        let s = q.x + q.y + q.z + q.w;
        if (w < 4u) {
            sa += s;
        } else {
            sb += s;
        }
        if (WIDE) {
            // lo: q's low byte, sign-extended; hi = (q - lo) / 256 exactly.
            let l = (q << vec4<u32>(24u)) >> vec4<u32>(24u);
            let h = (q - l) >> vec4<u32>(8u);
            hi[w] = pack_i8(h.x, h.y, h.z, h.w);
            lo[w] = pack_i8(l.x, l.y, l.z, l.w);
        } else {
            hi[w] = pack_i8(q.x, q.y, q.z, q.w);
        }
    }
    let o = blk * dq_stride(WIDE);
    dq[o] = vec4<u32>(hi[0], hi[1], hi[2], hi[3]);
    dq[o + 1u] = vec4<u32>(hi[4], hi[5], hi[6], hi[7]);
    var m = o + 2u;
    if (WIDE) {
        dq[o + 2u] = vec4<u32>(lo[0], lo[1], lo[2], lo[3]);
        dq[o + 3u] = vec4<u32>(lo[4], lo[5], lo[6], lo[7]);
        m = o + 4u;
    }
    dq[m] = bitcast<vec4<u32>>(vec4<f32>(d, d * f32(sa), d * f32(sb), 0.0));
}
