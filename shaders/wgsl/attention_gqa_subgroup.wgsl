// attention_gqa.wgsl's subgroup variant (wgpu::Features::SUBGROUP; heads of an even size up to
// 256): workgroup (g, r, split) attends every query head of KV head g's group for row r, over
// split `split` of the cached positions lo..=p of the row's slot (divided as attention.wgsl
// divides them), GP query heads per pass, in chunks of C positions:
// - scores: a subgroup takes a position at a time; its lanes split the head in pairs of
//   dimensions (one 32-bit word of an f16 cache, two of an f32 one), so that a K row is read
//   once, whole and contiguously, for all GP heads, and each head's dot product ends in one
//   subgroupAdd;
// - softmax: a subgroup per head takes the chunk's maximum and sum (subgroupMax/subgroupAdd)
//   and keeps the head's running maximum and sum;
// - values: invocation t owns dimensions 2t and 2t + 1 of every head of the pass (a V row is
//   read once, contiguously, per chunk position) and accumulates in registers.
// The results go where attention.wgsl puts them (the output, or the split partials that
// attention_combine merges). Parameters are attention.wgsl's.
struct Params {
    q: u32,
    dst: u32,
    positions: u32,
    slots: u32,
    partial: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    capacity: u32,
    scale: f32,
    window: u32,   // 0: none
    softcap: f32,  // 0: none
    f16: u32,
    splits: u32,
    coop: u32,     // unused here
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read> args: array<u32>;
@group(0) @binding(4) var<storage, read_write> kc: array<u32>;
@group(0) @binding(5) var<storage, read_write> vc: array<u32>;

const WG: u32 = 128u;
const GP: u32 = 4u;   // query heads per pass
const C: u32 = 64u;   // positions per chunk
const HP: u32 = 128u; // pairs of dimensions in the largest head
var<workgroup> qs: array<vec2<f32>, 512>; // [GP][HP]
var<workgroup> sc: array<f32, 256>;       // [GP][C]: scores, then probabilities
var<workgroup> alpha: array<f32, 4>;      // per head: the chunk's rescaling of the output
var<workgroup> ml: array<f32, 8>;         // per head: running maximum, sum

// Dimensions 2w and 2w + 1 of the cached row that starts at element `at` (even).
fn k2(at: u32, w: u32) -> vec2<f32> {
    if (p.f16 != 0u) {
        return unpack2x16float(kc[(at >> 1u) + w]);
    }
    return vec2<f32>(bitcast<f32>(kc[at + 2u * w]), bitcast<f32>(kc[at + 2u * w + 1u]));
}

fn v2(at: u32, w: u32) -> vec2<f32> {
    if (p.f16 != 0u) {
        return unpack2x16float(vc[(at >> 1u) + w]);
    }
    return vec2<f32>(bitcast<f32>(vc[at + 2u * w]), bitcast<f32>(vc[at + 2u * w + 1u]));
}

fn score(dot: f32) -> f32 {
    var s = dot * p.scale;
    if (p.softcap != 0.0) {
        s = p.softcap * tanh_safe(s / p.softcap);
    }
    return s;
}

@compute @workgroup_size(128)
fn main(@builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(subgroup_id) sid: u32,
        @builtin(num_subgroups) nsg: u32,
        @builtin(subgroup_invocation_id) lane: u32,
        @builtin(subgroup_size) sgs: u32) {
    let tid = lid.x;
    let g = wid.x;
    let r = wid.y;
    let split = wid.z;
    let hd = p.head_dim;
    let hp = hd / 2u;
    let group = p.heads / p.kv_heads;
    let kv_cols = p.kv_heads * hd;
    let pos = args[p.positions + r];
    let slot = args[p.slots + r];
    var lo = 0u;
    if (p.window != 0u && pos + 1u > p.window) {
        lo = pos + 1u - p.window;
    }
    let total = pos - lo + 1u;
    let per = (total + p.splits - 1u) / p.splits;
    let first = min(split * per, total);
    let n = min(first + per, total) - first;
    for (var h0 = 0u; h0 < group; h0 += GP) {
        let gp = min(GP, group - h0);
        let head0 = g * group + h0;
        for (var e = tid; e < GP * HP; e += WG) {
            let hh = e / HP;
            let w = e % HP;
            var v = vec2<f32>(0.0);
            if (hh < gp && w < hp) {
                let at = p.q + (r * p.heads + head0 + hh) * hd + 2u * w;
                v = vec2<f32>(act[at], act[at + 1u]);
            }
            qs[e] = v;
        }
        if (tid < GP) {
            ml[2u * tid] = NEG_INF;
            ml[2u * tid + 1u] = 0.0;
        }
        var acc0 = vec2<f32>(0.0);
        var acc1 = vec2<f32>(0.0);
        var acc2 = vec2<f32>(0.0);
        var acc3 = vec2<f32>(0.0);
        workgroupBarrier();
        for (var base = 0u; base < n; base += C) {
            let count = min(C, n - base);
            for (var j = sid; j < count; j += nsg) {
                let row = slot * p.capacity + (lo + first + base + j) % p.capacity;
                let at = row * kv_cols + g * hd;
                var d0 = 0.0;
                var d1 = 0.0;
                var d2 = 0.0;
                var d3 = 0.0;
                for (var w = lane; w < hp; w += sgs) {
                    let k = k2(at, w);
                    d0 += dot(qs[w], k);
                    d1 += dot(qs[HP + w], k);
                    d2 += dot(qs[2u * HP + w], k);
                    d3 += dot(qs[3u * HP + w], k);
                }
                d0 = subgroupAdd(d0);
                d1 = subgroupAdd(d1);
                d2 = subgroupAdd(d2);
                d3 = subgroupAdd(d3);
                if (lane == 0u) {
                    sc[j] = score(d0);
                    sc[C + j] = score(d1);
                    sc[2u * C + j] = score(d2);
                    sc[3u * C + j] = score(d3);
                }
            }
            workgroupBarrier();
            for (var hh = sid; hh < gp; hh += nsg) {
                var mx = NEG_INF;
                for (var j = lane; j < count; j += sgs) {
                    mx = max(mx, sc[hh * C + j]);
                }
                mx = subgroupMax(mx);
                let m_old = ml[2u * hh];
                let m_new = max(m_old, mx);
                var s = 0.0;
                for (var j = lane; j < count; j += sgs) {
                    let e = exp(sc[hh * C + j] - m_new);
                    sc[hh * C + j] = e;
                    s += e;
                }
                s = subgroupAdd(s);
                if (lane == 0u) {
                    let a = exp(m_old - m_new);
                    alpha[hh] = a;
                    ml[2u * hh] = m_new;
                    ml[2u * hh + 1u] = ml[2u * hh + 1u] * a + s;
                }
            }
            workgroupBarrier();
            if (tid < hp) {
                acc0 *= alpha[0];
                acc1 *= alpha[1];
                acc2 *= alpha[2];
                acc3 *= alpha[3];
                for (var j = 0u; j < count; j++) {
                    let row = slot * p.capacity + (lo + first + base + j) % p.capacity;
                    let v = v2(row * kv_cols + g * hd, tid);
                    acc0 += sc[j] * v;
                    acc1 += sc[C + j] * v;
                    acc2 += sc[2u * C + j] * v;
                    acc3 += sc[3u * C + j] * v;
                }
            }
            workgroupBarrier();
        }
        if (tid < hp) {
            for (var hh = 0u; hh < gp; hh++) {
                var o = acc0;
                if (hh == 1u) {
                    o = acc1;
                } else if (hh == 2u) {
                    o = acc2;
                } else if (hh == 3u) {
                    o = acc3;
                }
                let h = head0 + hh;
                if (p.splits == 1u) {
                    let at = p.dst + (r * p.heads + h) * hd + 2u * tid;
                    let l = ml[2u * hh + 1u];
                    act[at] = o.x / l;
                    act[at + 1u] = o.y / l;
                } else {
                    // Partials: [rows][heads][splits][2 + head_dim]: max, sum, unnormalised output.
                    let at = p.partial + ((r * p.heads + h) * p.splits + split) * (hd + 2u);
                    if (tid == 0u) {
                        act[at] = select(ml[2u * hh], NEG_INF, n == 0u);
                        act[at + 1u] = ml[2u * hh + 1u];
                    }
                    act[at + 2u + 2u * tid] = o.x;
                    act[at + 3u + 2u * tid] = o.y;
                }
            }
        }
        workgroupBarrier();
    }
}
