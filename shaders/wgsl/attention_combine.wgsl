// Merges attention's per-split partial results (maximum, sum, unnormalised output) of one
// (head, row): out = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s. Empty splits carry the
// maximum NEG_INF and are skipped. With `mode` set (prefill, where attention_tiled and
// attention each write their own partials), only the rows of one kernel: 1 those of blocks of
// `block` rows of one slot (attention_tiled's), 2 the others (attention's).
struct Params {
    partial: u32,
    dst: u32,
    heads: u32,
    head_dim: u32,
    splits: u32,
    slots: u32,
    block: u32,
    mode: u32, // 0: every row
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read> args: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let tid = lid.x;
    let h = wid.x;
    let r = wid.y;
    if (p.mode != 0u && (p.mode == 1u) != one_slot_block(p.slots, r, nwg.y, p.block)) {
        return;
    }
    let hd = p.head_dim;
    let base = p.partial + (r * p.heads + h) * p.splits * (hd + 2u);
    var mx = NEG_INF;
    for (var s = 0u; s < p.splits; s++) {
        mx = max(mx, act[base + s * (hd + 2u)]);
    }
    var l = 0.0;
    for (var s = 0u; s < p.splits; s++) {
        let ms = act[base + s * (hd + 2u)];
        if (ms != NEG_INF) {
            l += exp(ms - mx) * act[base + s * (hd + 2u) + 1u];
        }
    }
    for (var d = tid; d < hd; d += 64u) {
        var acc = 0.0;
        for (var s = 0u; s < p.splits; s++) {
            let ms = act[base + s * (hd + 2u)];
            if (ms != NEG_INF) {
                acc += exp(ms - mx) * act[base + s * (hd + 2u) + 2u + d];
            }
        }
        act[p.dst + (r * p.heads + h) * hd + d] = acc / l;
    }
}
