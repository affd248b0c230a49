// Second half of Op::Attention for decode with grouped queries (heads > kv_heads, head_dim <=
// 256): workgroup (g, r, split) attends every query head of KV head g's group for row r, over
// split `split` of the cached positions lo..=p of the row's slot (divided as attention.wgsl
// divides them), GP query heads per pass over the positions: each cached K and V row is read
// once per pass rather than once per query head.
//
// Per chunk of PC = WG / GP positions:
// - scores: invocation (j, hl) = (tid / GP, tid % GP) takes the whole dot product of position j
//   with query head hl (held in workgroup memory): no reduction, and neighbouring invocations
//   read the same K row;
// - one invocation per head updates the head's running maximum and sum over the chunk;
// - values: invocation tid owns output dimensions tid, tid + 64, tid + 128, tid + 192 of every
//   head of the pass, accumulated in workgroup memory; each V row is loaded once for the pass.
// The results go where attention.wgsl puts them (the output, or the split partials that
// attention_combine merges). Parameters: parts/attention_params.wgsl.

const WG: u32 = 64u;
const GP: u32 = 4u;          // query heads per pass
const PC: u32 = 16u;         // positions per chunk: WG / GP
const HD: u32 = 256u;        // the largest head
var<workgroup> qs: array<f32, 1024>;        // [GP][HD]
var<workgroup> sc: array<f32, 64>;          // [GP][PC]: scores, then probabilities
var<workgroup> alpha: array<f32, 4>;        // per head: the chunk's rescaling of the output
var<workgroup> ml: array<f32, 8>;           // per head: maximum, sum
var<workgroup> oacc: array<vec4<f32>, 256>; // [GP][WG]: unnormalised outputs

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tid = lid.x;
    let g = wid.x;
    let r = wid.y;
    let split = wid.z;
    let hd = p.head_dim;
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
    let hl = tid % GP;
    let jl = tid / GP;
    for (var h0 = 0u; h0 < group; h0 += GP) {
        let gp = min(GP, group - h0);
        let head0 = g * group + h0;
        for (var e = tid; e < GP * HD; e += WG) {
            let hh = e / HD;
            let d = e % HD;
            var v = 0.0;
            if (hh < gp && d < hd) {
                v = act[p.q + (r * p.heads + head0 + hh) * hd + d];
            }
            qs[e] = v;
        }
        for (var hh = 0u; hh < GP; hh++) {
            oacc[hh * WG + tid] = vec4<f32>(0.0);
        }
        var m = NEG_INF;
        var l = 0.0;
        workgroupBarrier();
        for (var base = 0u; base < n; base += PC) {
            let count = min(PC, n - base);
            var s = NEG_INF;
            if (jl < count && hl < gp) {
                let row = slot * p.capacity + (lo + first + base + jl) % p.capacity;
                let at = row * kv_cols + g * hd;
                let qo = hl * HD;
                var d4 = vec4<f32>(0.0);
                var d = 0u;
                for (; d + 4u <= hd; d += 4u) {
                    d4 += vec4<f32>(qs[qo + d], qs[qo + d + 1u], qs[qo + d + 2u], qs[qo + d + 3u]) * k4(at, d, hd);
                }
                var dot = d4.x + d4.y + d4.z + d4.w;
                for (; d < hd; d++) {
                    dot += qs[qo + d] * k_at(at + d);
                }
                s = dot * p.scale;
                if (p.softcap != 0.0) {
                    s = p.softcap * tanh_safe(s / p.softcap);
                }
            }
            sc[hl * PC + jl] = s;
            workgroupBarrier();
            if (tid < gp) {
                var mx = m;
                for (var j = 0u; j < count; j++) {
                    mx = max(mx, sc[tid * PC + j]);
                }
                var sum = 0.0;
                for (var j = 0u; j < count; j++) {
                    let e = exp(sc[tid * PC + j] - mx);
                    sc[tid * PC + j] = e;
                    sum += e;
                }
                let a = exp(m - mx);
                l = l * a + sum;
                m = mx;
                alpha[tid] = a;
            }
            workgroupBarrier();
            for (var hh = 0u; hh < gp; hh++) {
                oacc[hh * WG + tid] *= alpha[hh];
            }
            for (var j = 0u; j < count; j++) {
                let row = slot * p.capacity + (lo + first + base + j) % p.capacity;
                let v = v4(row * kv_cols + g * hd, tid, hd);
                for (var hh = 0u; hh < gp; hh++) {
                    oacc[hh * WG + tid] += sc[hh * PC + j] * v;
                }
            }
            workgroupBarrier();
        }
        if (tid < gp) {
            ml[2u * tid] = select(m, NEG_INF, n == 0u);
            ml[2u * tid + 1u] = l;
        }
        workgroupBarrier();
        for (var hh = 0u; hh < gp; hh++) {
            let h = head0 + hh;
            let o = oacc[hh * WG + tid];
            if (p.splits == 1u) {
                let out_row = p.dst + (r * p.heads + h) * hd;
                for (var i = 0u; i < 4u; i++) {
                    let d = tid + 64u * i;
                    if (d < hd) {
                        act[out_row + d] = o[i] / ml[2u * hh + 1u];
                    }
                }
            } else {
                // Partials: [rows][heads][splits][2 + head_dim]: max, sum, unnormalised output.
                let at = p.partial + ((r * p.heads + h) * p.splits + split) * (hd + 2u);
                if (tid == 0u) {
                    act[at] = ml[2u * hh];
                    act[at + 1u] = ml[2u * hh + 1u];
                }
                for (var i = 0u; i < 4u; i++) {
                    let d = tid + 64u * i;
                    if (d < hd) {
                        act[at + 2u + d] = o[i];
                    }
                }
            }
        }
        workgroupBarrier();
    }
}
