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

var<workgroup> ms: array<f32, 64>; // per split: maximum, then its weight e^(m_s - M)
var<workgroup> ls: array<f32, 64>; // per split: sum

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
    // Split s's maximum and sum by invocation s (splits <= 64: attention_splits' bound), then
    // every invocation reads them from workgroup memory: no loop of dependent loads.
    if (tid < p.splits) {
        let at = base + tid * (hd + 2u);
        ms[tid] = act[at];
        ls[tid] = act[at + 1u];
    }
    workgroupBarrier();
    var mx = NEG_INF;
    for (var s = 0u; s < p.splits; s++) {
        mx = max(mx, ms[s]);
    }
    workgroupBarrier();
    if (tid < p.splits) {
        ms[tid] = select(exp(ms[tid] - mx), 0.0, ms[tid] == NEG_INF);
    }
    workgroupBarrier();
    var l = 0.0;
    for (var s = 0u; s < p.splits; s++) {
        l += ms[s] * ls[s];
    }
    // Each invocation's dimensions of every split at once (independent loads).
    let out = p.dst + (r * p.heads + h) * hd;
    for (var d0 = tid; d0 < hd; d0 += 256u) {
        var acc = vec4<f32>(0.0);
        for (var s = 0u; s < p.splits; s++) {
            let at = base + s * (hd + 2u) + 2u;
            let w = ms[s];
            acc += w * vec4<f32>(
                select(0.0, act[at + d0], d0 < hd),
                select(0.0, act[at + d0 + 64u], d0 + 64u < hd),
                select(0.0, act[at + d0 + 128u], d0 + 128u < hd),
                select(0.0, act[at + d0 + 192u], d0 + 192u < hd));
        }
        for (var i = 0u; i < 4u; i++) {
            let d = d0 + 64u * i;
            if (d < hd) {
                act[out + d] = acc[i] / l;
            }
        }
    }
}
