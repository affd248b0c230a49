// Second half of Op::Attention, flash-decoding style: workgroup (h, r, split) attends query
// head h of row r over split `split` of the cached positions lo..=p of the row's slot (the
// splits divide that range evenly at run time), with an online softmax over chunks of 64
// positions. All invocations score each position of a chunk together; each invocation then owns
// output dimensions tid, tid + 64, ... With one split the result is written directly; otherwise the
// split's maximum, sum and unnormalised output go to the partials for attention_combine.
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
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read> args: array<u32>;
@group(0) @binding(4) var<storage, read_write> kc: array<u32>;
@group(0) @binding(5) var<storage, read_write> vc: array<u32>;

const MAX_HEAD_DIM: u32 = 512u;
const CHUNK: u32 = 64u;
var<workgroup> probs: array<f32, 64>;
var<workgroup> red: array<f32, 64>;
var<workgroup> sc: array<f32, 4160>; // [CHUNK][64 + 1]: partial scores

fn k_at(i: u32) -> f32 {
    if (p.f16 != 0u) {
        return unpack2x16float(kc[i >> 1u])[i & 1u];
    }
    return bitcast<f32>(kc[i]);
}

fn v_at(i: u32) -> f32 {
    if (p.f16 != 0u) {
        return unpack2x16float(vc[i >> 1u])[i & 1u];
    }
    return bitcast<f32>(vc[i]);
}

// Values d .. d + 3 of a cached K row (0 past the head).
fn k4(at: u32, d: u32, hd: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        if (d + i < hd) {
            v[i] = k_at(at + d + i);
        }
    }
    return v;
}

// Values d, d + 64, d + 128, d + 192 of a cached V row (0 past the head).
fn v4(at: u32, d: u32, hd: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        if (d + 64u * i < hd) {
            v[i] = v_at(at + d + 64u * i);
        }
    }
    return v;
}

fn wg_max(tid: u32, v: f32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    for (var stride = 32u; stride > 0u; stride = stride / 2u) {
        if (tid < stride) {
            red[tid] = max(red[tid], red[tid + stride]);
        }
        workgroupBarrier();
    }
    let m = red[0];
    workgroupBarrier();
    return m;
}

fn wg_sum(tid: u32, v: f32) -> f32 {
    red[tid] = v;
    workgroupBarrier();
    for (var stride = 32u; stride > 0u; stride = stride / 2u) {
        if (tid < stride) {
            red[tid] += red[tid + stride];
        }
        workgroupBarrier();
    }
    let s = red[0];
    workgroupBarrier();
    return s;
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tid = lid.x;
    let h = wid.x;
    let r = wid.y;
    let split = wid.z;
    let hd = p.head_dim;
    let g = h / (p.heads / p.kv_heads);
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
    let qrow = p.q + (r * p.heads + h) * hd;
    // This invocation's query dimensions 4 tid .. and 256 + 4 tid .. (0 past the head).
    var q_lo = vec4<f32>(0.0);
    var q_hi = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        if (4u * tid + i < hd) {
            q_lo[i] = act[qrow + 4u * tid + i];
        }
        if (256u + 4u * tid + i < hd) {
            q_hi[i] = act[qrow + 256u + 4u * tid + i];
        }
    }
    // Output dimensions tid + 64 i: i < 4 in o_lo, the rest in o_hi.
    var o_lo = vec4<f32>(0.0);
    var o_hi = vec4<f32>(0.0);
    var m = NEG_INF;
    var l = 0.0;
    for (var base = 0u; base < n; base += CHUNK) {
        let count = min(CHUNK, n - base);
        // Scores: all 64 invocations take part in every position's dot product (4 dimensions
        // each, neighbouring invocations reading neighbouring values), writing their partial
        // sums to sc[j][tid]; invocation j then adds up the 64 partials of position j. Each
        // invocation's loads are independent of one another.
        for (var j = 0u; j < count; j++) {
            let row = slot * p.capacity + (lo + first + base + j) % p.capacity;
            let at = row * kv_cols + g * hd;
            var part = dot(q_lo, k4(at, 4u * tid, hd));
            if (hd > 256u) {
                part += dot(q_hi, k4(at, 4u * tid + 256u, hd));
            }
            sc[j * 65u + tid] = part;
        }
        workgroupBarrier();
        var s = NEG_INF;
        if (tid < count) {
            var dot = 0.0;
            for (var t = 0u; t < 64u; t++) {
                dot += sc[tid * 65u + t];
            }
            s = dot * p.scale;
            if (p.softcap != 0.0) {
                s = p.softcap * tanh_safe(s / p.softcap);
            }
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
        o_lo *= alpha;
        o_hi *= alpha;
        for (var jj = 0u; jj < count; jj++) {
            let row = slot * p.capacity + (lo + first + base + jj) % p.capacity;
            let at = row * kv_cols + g * hd;
            let pj = probs[jj];
            o_lo += pj * v4(at, tid, hd);
            if (hd > 256u) {
                o_hi += pj * v4(at, tid + 256u, hd);
            }
        }
        workgroupBarrier();
        m = nm;
    }
    if (p.splits == 1u) {
        let out_row = p.dst + (r * p.heads + h) * hd;
        for (var i = 0u; i < 8u; i++) {
            let d = tid + 64u * i;
            if (d < hd) {
                act[out_row + d] = select(o_hi[i & 3u], o_lo[i & 3u], i < 4u) / l;
            }
        }
    } else {
        // Partials: [rows][heads][splits][2 + head_dim]: max, sum, unnormalised output.
        let at = p.partial + ((r * p.heads + h) * p.splits + split) * (hd + 2u);
        if (tid == 0u) {
            var mm = m;
            if (n == 0u) {
                mm = NEG_INF;
            }
            act[at] = mm;
            act[at + 1u] = l;
        }
        for (var i = 0u; i < 8u; i++) {
            let d = tid + 64u * i;
            if (d < hd) {
                act[at + 2u + d] = select(o_hi[i & 3u], o_lo[i & 3u], i < 4u);
            }
        }
    }
}
