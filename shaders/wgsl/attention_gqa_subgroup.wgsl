// attention_gqa.wgsl's subgroup variant (wgpu::Features::SUBGROUP; heads of an even size up to
// 256): workgroup (g, r, split) attends every query head of KV head g's group for row r, over
// split `split` of the cached positions lo..=p of the row's slot (divided as attention.wgsl
// divides them), GP query heads per pass, in chunks of C positions:
// - scores: a subgroup takes two positions at a time; its lanes split the head in pairs of
//   dimensions (one 32-bit word of an f16 cache, two of an f32 one), so that a K row is read
//   once, whole and contiguously, for all GP heads, and each head's dot product ends in one
//   subgroupAdd;
// - softmax: a subgroup per head takes the chunk's maximum and sum (subgroupMax/subgroupAdd)
//   and keeps the head's running maximum and sum;
// - values: invocation (c, half) = (t % 64, t / 64) owns dimension pairs c and c + 64 of every
//   head of the pass over the chunk's even (half 0) or odd (half 1) positions, two positions'
//   rows loaded at once, in registers; the halves are added through workgroup memory at the
//   end.
// The results go where attention.wgsl puts them (the output, or the split partials that
// attention_combine merges). Parameters: parts/attention_params.wgsl.

const WG: u32 = 128u;
const GP: u32 = 4u;   // query heads per pass
const C: u32 = 64u;   // positions per chunk
const HP: u32 = 128u; // pairs of dimensions in the largest head
var<workgroup> qs: array<vec2<f32>, 512>; // [GP][HP]
var<workgroup> sc: array<f32, 256>;       // [GP][C]: scores, then probabilities
var<workgroup> alpha: array<f32, 4>;      // per head: the chunk's rescaling of the output
var<workgroup> ml: array<f32, 8>;         // per head: running maximum, sum
var<workgroup> half1: array<vec2<f32>, 512>; // [GP][HP]: the odd positions' outputs

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
    let total = row_end(r, pos) - lo + 1u;
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
        let c = tid % 64u;
        let half = tid / 64u;
        var acc0 = vec2<f32>(0.0);
        var acc1 = vec2<f32>(0.0);
        var acc2 = vec2<f32>(0.0);
        var acc3 = vec2<f32>(0.0);
        var bcc0 = vec2<f32>(0.0);
        var bcc1 = vec2<f32>(0.0);
        var bcc2 = vec2<f32>(0.0);
        var bcc3 = vec2<f32>(0.0);
        workgroupBarrier();
        for (var base = 0u; base < n; base += C) {
            let count = min(C, n - base);
            for (var j = 2u * sid; j < count; j += 2u * nsg) {
                // Positions j and j + 1 (the second may be past the chunk: it then reads row j
                // again, and its scores are not kept).
                let j1 = min(j + 1u, count - 1u);
                let at = (slot * p.capacity + (lo + first + base + j) % p.capacity) * kv_cols + g * hd;
                let at1 = (slot * p.capacity + (lo + first + base + j1) % p.capacity) * kv_cols + g * hd;
                var d0 = vec2<f32>(0.0);
                var d1 = vec2<f32>(0.0);
                var d2 = vec2<f32>(0.0);
                var d3 = vec2<f32>(0.0);
                for (var w = lane; w < hp; w += sgs) {
                    let k = k2(at, w);
                    let k1 = k2(at1, w);
                    let q0 = qs[w];
                    let q1 = qs[HP + w];
                    let q2 = qs[2u * HP + w];
                    let q3 = qs[3u * HP + w];
                    d0 += vec2<f32>(dot(q0, k), dot(q0, k1));
                    d1 += vec2<f32>(dot(q1, k), dot(q1, k1));
                    d2 += vec2<f32>(dot(q2, k), dot(q2, k1));
                    d3 += vec2<f32>(dot(q3, k), dot(q3, k1));
                }
                d0 = subgroupAdd(d0);
                d1 = subgroupAdd(d1);
                d2 = subgroupAdd(d2);
                d3 = subgroupAdd(d3);
                if (lane == 0u) {
                    sc[j] = score(d0.x);
                    sc[C + j] = score(d1.x);
                    sc[2u * C + j] = score(d2.x);
                    sc[3u * C + j] = score(d3.x);
                    if (j + 1u < count) {
                        sc[j + 1u] = score(d0.y);
                        sc[C + j + 1u] = score(d1.y);
                        sc[2u * C + j + 1u] = score(d2.y);
                        sc[3u * C + j + 1u] = score(d3.y);
                    }
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
            {
                acc0 *= alpha[0];
                acc1 *= alpha[1];
                acc2 *= alpha[2];
                acc3 *= alpha[3];
                bcc0 *= alpha[0];
                bcc1 *= alpha[1];
                bcc2 *= alpha[2];
                bcc3 *= alpha[3];
                for (var j = half; j < count; j += 4u) {
                    // Positions j and j + 2 (past the chunk: row j again, with probability 0).
                    let j2 = min(j + 2u, count - 1u);
                    let at = (slot * p.capacity + (lo + first + base + j) % p.capacity) * kv_cols + g * hd;
                    let at2 = (slot * p.capacity + (lo + first + base + j2) % p.capacity) * kv_cols + g * hd;
                    var va = vec2<f32>(0.0);
                    var va2 = vec2<f32>(0.0);
                    var vb = vec2<f32>(0.0);
                    var vb2 = vec2<f32>(0.0);
                    if (c < hp) {
                        va = v2(at, c);
                        va2 = v2(at2, c);
                    }
                    if (c + 64u < hp) {
                        vb = v2(at, c + 64u);
                        vb2 = v2(at2, c + 64u);
                    }
                    let keep = select(0.0, 1.0, j + 2u < count);
                    let p0 = vec2<f32>(sc[j], sc[j2] * keep);
                    let p1 = vec2<f32>(sc[C + j], sc[C + j2] * keep);
                    let p2 = vec2<f32>(sc[2u * C + j], sc[2u * C + j2] * keep);
                    let p3 = vec2<f32>(sc[3u * C + j], sc[3u * C + j2] * keep);
                    acc0 += p0.x * va + p0.y * va2;
                    acc1 += p1.x * va + p1.y * va2;
                    acc2 += p2.x * va + p2.y * va2;
                    acc3 += p3.x * va + p3.y * va2;
                    bcc0 += p0.x * vb + p0.y * vb2;
                    bcc1 += p1.x * vb + p1.y * vb2;
                    bcc2 += p2.x * vb + p2.y * vb2;
                    bcc3 += p3.x * vb + p3.y * vb2;
                }
            }
            workgroupBarrier();
        }
        // The odd positions' half hands its sums to the even one.
        if (half == 1u) {
            half1[c] = acc0;
            half1[HP + c] = acc1;
            half1[2u * HP + c] = acc2;
            half1[3u * HP + c] = acc3;
            half1[c + 64u] = bcc0;
            half1[HP + c + 64u] = bcc1;
            half1[2u * HP + c + 64u] = bcc2;
            half1[3u * HP + c + 64u] = bcc3;
        }
        workgroupBarrier();
        if (half == 0u) {
            for (var hh = 0u; hh < gp; hh++) {
                var o = acc0;
                var ob = bcc0;
                if (hh == 1u) {
                    o = acc1;
                    ob = bcc1;
                } else if (hh == 2u) {
                    o = acc2;
                    ob = bcc2;
                } else if (hh == 3u) {
                    o = acc3;
                    ob = bcc3;
                }
                o += half1[hh * HP + c];
                ob += half1[hh * HP + c + 64u];
                let h = head0 + hh;
                let l = ml[2u * hh + 1u];
                for (var i = 0u; i < 2u; i++) {
                    let w = c + 64u * i;
                    let v = select(o, ob, i == 1u);
                    if (w < hp) {
                        if (p.splits == 1u) {
                            let at = p.dst + (r * p.heads + h) * hd + 2u * w;
                            act[at] = v.x / l;
                            act[at + 1u] = v.y / l;
                        } else {
                            // Partials: [rows][heads][splits][2 + head_dim]: max, sum, unnormalised output.
                            let at = p.partial + ((r * p.heads + h) * p.splits + split) * (hd + 2u);
                            if (tid == 0u && i == 0u) {
                                act[at] = select(ml[2u * hh], NEG_INF, n == 0u);
                                act[at + 1u] = l;
                            }
                            act[at + 2u + 2u * w] = v.x;
                            act[at + 3u + 2u * w] = v.y;
                        }
                    }
                }
            }
        }
        workgroupBarrier();
    }
}
