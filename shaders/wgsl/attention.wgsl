// Second half of Op::Attention, flash-decoding style: workgroup (h, r, split) attends query
// head h of row r over split `split` of the cached positions lo..=p of the row's slot (the
// splits divide that range evenly at run time), with an online softmax over chunks of 64
// positions. All invocations score each position of a chunk together; each invocation then owns
// output dimensions tid, tid + 64, ... With one split the result is written directly; otherwise the
// split's maximum, sum and unnormalised output go to the partials for attention_combine. The
// maximum and sum of each chunk are reduced by the reduce part (tree or subgroups). With
// `skip_block` set (prefill, after attention_tiled), workgroups of the rows that kernel took
// exit at once. Parameters: parts/attention_params.wgsl.

const MAX_HEAD_DIM: u32 = 512u;
const WG: u32 = 64u;
const CHUNK: u32 = 64u;
var<workgroup> probs: array<f32, 64>;
var<workgroup> sc: array<f32, 4160>; // [CHUNK][64 + 1]: partial scores
var<workgroup> qs: array<f32, 512>;

fn kernel(lid: vec3<u32>, wid: vec3<u32>, nwg: vec3<u32>) {
    let tid = lid.x;
    let h = wid.x;
    let r = wid.y;
    let split = wid.z;
    if (p.skip_block != 0u && one_slot_block(p.slots, r, nwg.y, p.skip_block)) {
        return;
    }
    let hd = p.head_dim;
    let g = h / (p.heads / p.kv_heads);
    let kv_cols = p.kv_heads * hd;
    let pos = args[p.positions + r];
    let slot = args[p.slots + r];
    var lo = 0u;
    if (p.window != 0u && pos + 1u > p.window) {
        lo = pos + 1u - p.window;
    }
    let total = row_end(r, pos) - lo + 1u;
    let per = (total + p.splits - 1u) / p.splits;
    let first = min(split * per, total);
    let n = min(first + per, total) - first;
    let qrow = p.q + (r * p.heads + h) * hd;
    // This invocation's query dimensions 4 tid .. and 256 + 4 tid .. (0 past the head).
    let q_lo = vec4<f32>(q_or0(qrow, 4u * tid, hd), q_or0(qrow, 4u * tid + 1u, hd),
                         q_or0(qrow, 4u * tid + 2u, hd), q_or0(qrow, 4u * tid + 3u, hd));
    let q_hi = vec4<f32>(q_or0(qrow, 256u + 4u * tid, hd), q_or0(qrow, 257u + 4u * tid, hd),
                         q_or0(qrow, 258u + 4u * tid, hd), q_or0(qrow, 259u + 4u * tid, hd));
    for (var d = tid; d < hd; d += 64u) {
        qs[d] = act[qrow + d];
    }
    workgroupBarrier();
    // Output dimensions tid + 64 i: i < 4 in o_lo, the rest in o_hi.
    var o_lo = vec4<f32>(0.0);
    var o_hi = vec4<f32>(0.0);
    var m = NEG_INF;
    var l = 0.0;
    for (var base = 0u; base < n; base += CHUNK) {
        let count = min(CHUNK, n - base);
        // Scores. With coop, all 64 invocations take part in every position's dot product (4
        // dimensions each, neighbouring invocations reading neighbouring values), writing
        // their partial sums to sc[j][tid]; invocation j then adds up the 64 partials of
        // position j, and each invocation's loads are independent of one another.
        var s = NEG_INF;
        if (p.coop != 0u) {
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
            if (tid < count) {
                var dot = 0.0;
                for (var t = 0u; t < 64u; t++) {
                    dot += sc[tid * 65u + t];
                }
                s = dot;
            }
        } else if (tid < count) {
            // One invocation per position, four sums in flight (many rows: every workgroup
            // has its own row, and the device is full without sharing a position).
            let row = slot * p.capacity + (lo + first + base + tid) % p.capacity;
            let at = row * kv_cols + g * hd;
            var d4 = vec4<f32>(0.0);
            var d = 0u;
            for (; d + 4u <= hd; d += 4u) {
                d4 += vec4<f32>(qs[d], qs[d + 1u], qs[d + 2u], qs[d + 3u])
                    * vec4<f32>(k_at(at + d), k_at(at + d + 1u), k_at(at + d + 2u), k_at(at + d + 3u));
            }
            var dot = d4.x + d4.y + d4.z + d4.w;
            for (; d < hd; d++) {
                dot += qs[d] * k_at(at + d);
            }
            s = dot;
        }
        if (tid < count) {
            s = s * p.scale;
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
