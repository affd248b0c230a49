// Op::BlockAttention (the vision tower's attention over each image's patches): workgroup
// (h, r), numbered along x then y (a step may hold more rows than one grid dimension), attends
// query head h of row r over every row of r's block of `block` rows, with an online softmax over
// chunks of 64 keys: invocation j scores key j of the chunk, the chunk's maximum and sum come
// from the reduce part, and each invocation then owns output dimensions tid, tid + 64, ...
// (heads of up to 512). q, k, v and the output are [rows, heads * head_dim] values of the arena.
struct Params {
    q: u32,
    k: u32,
    v: u32,
    dst: u32,
    heads: u32,
    head_dim: u32,
    rows: u32,
    block: u32,
    scale: f32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
const WG: u32 = 64u;
const CHUNK: u32 = 64u;
var<workgroup> probs: array<f32, 64>;
var<workgroup> qs: array<f32, 512>;

fn kernel(lid: vec3<u32>, wid: vec3<u32>, nwg: vec3<u32>) {
    let tid = lid.x;
    let id = wid.x + wid.y * nwg.x;
    if (id >= p.rows * p.heads) {
        return; // the grid's last row of workgroups may pass the end
    }
    let h = id % p.heads;
    let r = id / p.heads;
    let hd = p.head_dim;
    let width = p.heads * hd;
    let first = r - r % p.block;
    let qrow = p.q + r * width + h * hd;
    for (var d = tid; d < hd; d += WG) {
        qs[d] = act[qrow + d];
    }
    workgroupBarrier();
    var o = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    var m = NEG_INF;
    var l = 0.0;
    for (var base = 0u; base < p.block; base += CHUNK) {
        let count = min(CHUNK, p.block - base);
        var s = NEG_INF;
        if (tid < count) {
            let at = p.k + (first + base + tid) * width + h * hd;
            var dot = 0.0;
            for (var d = 0u; d < hd; d++) {
                dot += qs[d] * act[at + d];
            }
            s = dot * p.scale;
        }
        let nm = max(m, wg_max(tid, s));
        var e = 0.0;
        if (tid < count) {
            e = exp(s - nm);
        }
        probs[tid] = e;
        let cs = wg_sum(tid, e);
        let alpha = exp(m - nm);
        l = l * alpha + cs;
        for (var i = 0u; i < 8u; i++) {
            o[i] *= alpha;
        }
        for (var jj = 0u; jj < count; jj++) {
            let at = p.v + (first + base + jj) * width + h * hd;
            let pj = probs[jj];
            for (var i = 0u; i < 8u; i++) {
                let d = tid + 64u * i;
                if (d < hd) {
                    o[i] += pj * act[at + d];
                }
            }
        }
        workgroupBarrier();
        m = nm;
    }
    let out_row = p.dst + r * width + h * hd;
    for (var i = 0u; i < 8u; i++) {
        let d = tid + 64u * i;
        if (d < hd) {
            act[out_row + d] = o[i] / l;
        }
    }
}
