// Second half of Op::Attention for prefill, flash-attention style: workgroup (h, b, split)
// attends query head h of the block of BR rows b*BR .. b*BR+BR-1 over split `split` of its key
// tiles, when every row of the block belongs to one slot (a prefill chunk). The keys of the
// union of the rows' visible ranges, in tiles of BC positions split evenly (at run time) over
// the `splits` workgroups, are loaded once per tile into workgroup memory and used by all BR
// rows, each row masking what it does not see (causality, its window). Scores and outputs
// accumulate in f32 with an online softmax per row. With one split the result is written
// directly; otherwise each split's maximum, sum and unnormalised output go to the partials
// ([rows][heads][splits][2 + head_dim], as attention.wgsl writes them) for attention_combine.
// Blocks of several slots (batched decode, or a step's rows crossing from one sequence to the
// next) exit at once: attention.wgsl, run after this kernel with `skip_block` = BR, takes
// exactly those (`one_slot_block`).
//
// Invocations (256):
// - loads: element e < 8 of a chunk is row (key) tid / 64 + 4e, dimension tid % 64, so that
//   neighbouring invocations read neighbouring values; the global loads of the next chunk run
//   while the current one is used, in registers;
// - scores: invocation (ri = tid / 16, kj = tid % 16) computes rows 2ri, 2ri+1 x keys 2kj,
//   2kj+1 over head-dimension chunks of DC, from Q^T and K^T chunks in workgroup memory;
// - softmax: the eight invocations (sr = tid / 8, sp = tid % 8) of row sr take its keys
//   4sp .. 4sp+3 and keep its running maximum and sum alike;
// - outputs: invocation (rg = tid / 64, dim = tid % 64) owns rows 8rg .. 8rg+7 at dimensions
//   dim, dim + 64, dim + 128, dim + 192, in eight vec4 registers (no array indexed at run time).
//
// Workgroup memory: 31,756 bytes; the backend runs this kernel only where the adapter's
// max_compute_workgroup_storage_size allows it (lib: attention_tiled.rs).

const BR: u32 = 32u;
const BC: u32 = 32u;
const DC: u32 = 64u;

// Rows padded by one vector against bank conflicts in the transposing stores.
var<workgroup> qs: array<array<vec2<f32>, 17>, 64>; // Q^T chunk: qs[d][i] = (Q[2i][d], Q[2i+1][d])
var<workgroup> ks: array<array<vec2<f32>, 17>, 64>; // K^T chunk
var<workgroup> ps: array<array<vec4<f32>, 9>, 32>;  // scores, then probabilities: ps[j][i / 4][i % 4]
var<workgroup> vs: array<array<f32, 64>, 32>;       // V chunk
var<workgroup> red: array<array<f32, 8>, 32>;       // the softmax's partial maxima and sums
var<workgroup> s_lo: array<u32, 32>;
var<workgroup> s_pos: array<u32, 32>;
var<workgroup> s_alpha: array<f32, 32>;
var<workgroup> s_l: array<f32, 32>;
var<workgroup> s_info: vec4<u32>; // lowest key, highest key, one slot (1/0)

// This invocation's workgroup, fixed at the start.
var<private> t_id: u32;
var<private> t_r0: u32;
var<private> t_nrows: u32;
var<private> t_h: u32;
var<private> t_g: u32;
var<private> t_slot: u32;
var<private> t_kmax: u32;
var<private> t_split: u32;

// The next chunk's elements 0..3 and 4..7 of Q, K and V (see above).
var<private> qa: vec4<f32>;
var<private> qb: vec4<f32>;
var<private> ka: vec4<f32>;
var<private> kb: vec4<f32>;
var<private> va: vec4<f32>;
var<private> vb: vec4<f32>;

struct Pair {
    a: vec4<f32>,
    b: vec4<f32>,
}

// Element e of chunk c of the block's Q rows (0 past the rows or the head).
fn q_el(e: u32, c: u32) -> f32 {
    let hd = p.head_dim;
    let row = t_id / DC + 4u * e;
    let dd = c * DC + t_id % DC;
    var v = 0.0;
    if (row < t_nrows && dd < hd) {
        v = act[p.q + (t_r0 + row) * p.heads * hd + t_h * hd + dd];
    }
    return v;
}

// Element e of chunk c of the K (`value` false) or V tile at key t0 (0 past the keys or head).
fn kv_el(e: u32, c: u32, t0: u32, value: bool) -> f32 {
    let hd = p.head_dim;
    let key = t0 + t_id / DC + 4u * e;
    let dd = c * DC + t_id % DC;
    var v = 0.0;
    if (key <= t_kmax && dd < hd) {
        let at = (t_slot * p.capacity + key % p.capacity) * p.kv_heads * hd + t_g * hd + dd;
        if (value) {
            v = v_at(at);
        } else {
            v = k_at(at);
        }
    }
    return v;
}

fn load_qk(c: u32, t0: u32) {
    qa = vec4<f32>(q_el(0u, c), q_el(1u, c), q_el(2u, c), q_el(3u, c));
    qb = vec4<f32>(q_el(4u, c), q_el(5u, c), q_el(6u, c), q_el(7u, c));
    ka = vec4<f32>(kv_el(0u, c, t0, false), kv_el(1u, c, t0, false), kv_el(2u, c, t0, false),
                   kv_el(3u, c, t0, false));
    kb = vec4<f32>(kv_el(4u, c, t0, false), kv_el(5u, c, t0, false), kv_el(6u, c, t0, false),
                   kv_el(7u, c, t0, false));
}

fn load_v(c: u32, t0: u32) {
    va = vec4<f32>(kv_el(0u, c, t0, true), kv_el(1u, c, t0, true), kv_el(2u, c, t0, true),
                   kv_el(3u, c, t0, true));
    vb = vec4<f32>(kv_el(4u, c, t0, true), kv_el(5u, c, t0, true), kv_el(6u, c, t0, true),
                   kv_el(7u, c, t0, true));
}

// Element e of the loaded Q and K chunks into the transposed tiles.
fn put_qk(e: u32, q: f32, k: f32) {
    let row = t_id / DC + 4u * e;
    let d = t_id % DC;
    qs[d][row >> 1u][row & 1u] = q;
    ks[d][row >> 1u][row & 1u] = k;
}

// The loaded V chunk into vs.
fn put_v() {
    let row = t_id / DC;
    let d = t_id % DC;
    vs[row][d] = va.x;
    vs[row + 4u][d] = va.y;
    vs[row + 8u][d] = va.z;
    vs[row + 12u][d] = va.w;
    vs[row + 16u][d] = vb.x;
    vs[row + 20u][d] = vb.y;
    vs[row + 24u][d] = vb.z;
    vs[row + 28u][d] = vb.w;
}

// This invocation's four dot products (rows 2ri, 2ri+1 x keys 2kj, 2kj+1) over the chunk.
fn score_chunk() -> vec4<f32> {
    let ri = t_id / 16u;
    let kj = t_id % 16u;
    var s = vec4<f32>(0.0);
    for (var d = 0u; d < DC; d++) {
        let a = qs[d][ri];
        let b = ks[d][kj];
        s = fma(a.xxyy, b.xyxy, s);
    }
    return s;
}

// Score s of row i and key t0 + j, scaled and capped, or NEG_INF where the row does not see it.
fn put_score(i: u32, j: u32, s: f32, t0: u32, nk: u32) {
    var v = NEG_INF;
    let kp = t0 + j;
    if (i < t_nrows && j < nk && kp >= s_lo[i] && kp <= s_pos[i]) {
        v = s * p.scale;
        if (p.softcap != 0.0) {
            v = p.softcap * tanh_safe(v / p.softcap);
        }
    }
    ps[j][i >> 2u][i & 3u] = v;
}

// One chunk c of P V for this invocation's rows: the loaded V chunk into vs, the next loads
// started (V's next chunk, or the next tile's first Q and K chunk), the products summed.
fn pv_stage(c: u32, nch: u32, t0: u32, kend: u32) -> Pair {
    put_v();
    workgroupBarrier();
    if (c + 1u < nch) {
        load_v(c + 1u, t0);
    } else if (t0 + BC < kend) {
        load_qk(0u, t0 + BC);
    }
    let rg = t_id / 64u;
    let dim = t_id % 64u;
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    for (var j = 0u; j < BC; j++) {
        let v = vs[j][dim];
        a = fma(ps[j][2u * rg], vec4<f32>(v), a);
        b = fma(ps[j][2u * rg + 1u], vec4<f32>(v), b);
    }
    workgroupBarrier();
    return Pair(a, b);
}

// Local row r of this invocation's eight (8 rg + r), at dimensions dim + 64 c (c = 0..3, x[c]):
// the normalised output, or the split's partials.
fn put_row(r: u32, x: vec4<f32>) {
    let i = (t_id / 64u) * 8u + r;
    if (i >= t_nrows) {
        return;
    }
    let hd = p.head_dim;
    let dim = t_id % 64u;
    var at = 0u;
    var y = x;
    if (p.splits == 1u) {
        at = p.dst + ((t_r0 + i) * p.heads + t_h) * hd;
        y = x / s_l[i];
    } else {
        let base = p.partial + (((t_r0 + i) * p.heads + t_h) * p.splits + t_split) * (hd + 2u);
        if (dim == 0u) {
            act[base] = s_alpha[i];
            act[base + 1u] = s_l[i];
        }
        at = base + 2u;
    }
    if (dim < hd) {
        act[at + dim] = y.x;
    }
    if (dim + 64u < hd) {
        act[at + dim + 64u] = y.y;
    }
    if (dim + 128u < hd) {
        act[at + dim + 128u] = y.z;
    }
    if (dim + 192u < hd) {
        act[at + dim + 192u] = y.w;
    }
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tid = lid.x;
    t_id = tid;
    t_h = wid.x;
    t_r0 = wid.y * BR;
    t_split = wid.z;
    t_nrows = min(BR, p.rows - t_r0);
    t_g = t_h / (p.heads / p.kv_heads);
    let hd = p.head_dim;
    if (tid < BR) {
        var pos = 0u;
        var end = 0u;
        if (tid < t_nrows) {
            pos = args[p.positions + t_r0 + tid];
            end = row_end(t_r0 + tid, pos);
        }
        // The last position the row sees: its own, or its image block's end (the block's key
        // range then ends at the largest of its rows').
        s_pos[tid] = end;
        var lo = 0u;
        if (p.window != 0u && pos + 1u > p.window) {
            lo = pos + 1u - p.window;
        }
        s_lo[tid] = lo;
    }
    workgroupBarrier();
    if (tid == 0u) {
        var lo = s_lo[0];
        var hi = s_pos[0];
        for (var i = 1u; i < t_nrows; i++) {
            lo = min(lo, s_lo[i]);
            hi = max(hi, s_pos[i]);
        }
        s_info = vec4<u32>(lo, hi, select(0u, 1u, one_slot_block(p.slots, t_r0, p.rows, BR)), 0u);
    }
    let info = workgroupUniformLoad(&s_info);
    if (info.z == 0u) {
        return; // several slots: attention takes this block
    }
    t_slot = args[p.slots + t_r0];
    // This split's tiles of the block's range.
    let tiles = (info.y - info.x) / BC + 1u;
    let per = (tiles + p.splits - 1u) / p.splits;
    let first = min(t_split * per, tiles);
    let kmin = info.x + first * BC;
    let kend = info.x + min(first + per, tiles) * BC; // exclusive, may pass kmax
    t_kmax = info.y;
    let nch = (hd + DC - 1u) / DC;

    let ri = tid / 16u;
    let kj = tid % 16u;
    let sr = tid / 8u;
    let sp = tid % 8u;
    let rg = tid / 64u;
    var m = NEG_INF;
    var l = 0.0;
    var o0a = vec4<f32>(0.0);
    var o0b = vec4<f32>(0.0);
    var o1a = vec4<f32>(0.0);
    var o1b = vec4<f32>(0.0);
    var o2a = vec4<f32>(0.0);
    var o2b = vec4<f32>(0.0);
    var o3a = vec4<f32>(0.0);
    var o3b = vec4<f32>(0.0);
    load_qk(0u, kmin);
    for (var t0 = kmin; t0 < kend; t0 += BC) {
        let nk = min(BC, t_kmax - t0 + 1u);
        // Scores of the tile.
        var s = vec4<f32>(0.0);
        for (var c = 0u; c < nch; c++) {
            put_qk(0u, qa.x, ka.x);
            put_qk(1u, qa.y, ka.y);
            put_qk(2u, qa.z, ka.z);
            put_qk(3u, qa.w, ka.w);
            put_qk(4u, qb.x, kb.x);
            put_qk(5u, qb.y, kb.y);
            put_qk(6u, qb.z, kb.z);
            put_qk(7u, qb.w, kb.w);
            workgroupBarrier();
            if (c + 1u < nch) {
                load_qk(c + 1u, t0);
            } else {
                load_v(0u, t0);
            }
            s += score_chunk();
            workgroupBarrier();
        }
        put_score(2u * ri, 2u * kj, s.x, t0, nk);
        put_score(2u * ri, 2u * kj + 1u, s.y, t0, nk);
        put_score(2u * ri + 1u, 2u * kj, s.z, t0, nk);
        put_score(2u * ri + 1u, 2u * kj + 1u, s.w, t0, nk);
        workgroupBarrier();
        // Online softmax.
        let sv = vec4<f32>(ps[4u * sp][sr >> 2u][sr & 3u], ps[4u * sp + 1u][sr >> 2u][sr & 3u],
                           ps[4u * sp + 2u][sr >> 2u][sr & 3u], ps[4u * sp + 3u][sr >> 2u][sr & 3u]);
        var mt = max(max(sv.x, sv.y), max(sv.z, sv.w));
        red[sr][sp] = mt;
        workgroupBarrier();
        for (var k = 0u; k < 8u; k++) {
            mt = max(mt, red[sr][k]);
        }
        let mn = max(m, mt);
        let alpha = exp(m - mn); // 1 while nothing is seen, 0 from the first seen key
        // Masked keys (NEG_INF) weigh 0, also while the row has seen nothing (mn NEG_INF).
        let e = select(exp(sv - vec4<f32>(mn)), vec4<f32>(0.0), sv == vec4<f32>(NEG_INF));
        ps[4u * sp][sr >> 2u][sr & 3u] = e.x;
        ps[4u * sp + 1u][sr >> 2u][sr & 3u] = e.y;
        ps[4u * sp + 2u][sr >> 2u][sr & 3u] = e.z;
        ps[4u * sp + 3u][sr >> 2u][sr & 3u] = e.w;
        workgroupBarrier();
        red[sr][sp] = e.x + e.y + e.z + e.w;
        if (sp == 0u) {
            s_alpha[sr] = alpha;
        }
        workgroupBarrier();
        var sum = 0.0;
        for (var k = 0u; k < 8u; k++) {
            sum += red[sr][k];
        }
        l = l * alpha + sum;
        m = mn;
        let al_a = vec4<f32>(s_alpha[8u * rg], s_alpha[8u * rg + 1u], s_alpha[8u * rg + 2u], s_alpha[8u * rg + 3u]);
        let al_b = vec4<f32>(s_alpha[8u * rg + 4u], s_alpha[8u * rg + 5u], s_alpha[8u * rg + 6u],
                             s_alpha[8u * rg + 7u]);
        // Outputs: o = o alpha + P V, chunk by chunk of the head dimension.
        var pr = pv_stage(0u, nch, t0, kend);
        o0a = fma(o0a, al_a, pr.a);
        o0b = fma(o0b, al_b, pr.b);
        if (nch > 1u) {
            pr = pv_stage(1u, nch, t0, kend);
            o1a = fma(o1a, al_a, pr.a);
            o1b = fma(o1b, al_b, pr.b);
        }
        if (nch > 2u) {
            pr = pv_stage(2u, nch, t0, kend);
            o2a = fma(o2a, al_a, pr.a);
            o2b = fma(o2b, al_b, pr.b);
        }
        if (nch > 3u) {
            pr = pv_stage(3u, nch, t0, kend);
            o3a = fma(o3a, al_a, pr.a);
            o3b = fma(o3b, al_b, pr.b);
        }
    }
    if (sp == 0u) {
        s_l[sr] = l;
        s_alpha[sr] = m; // the running maximum, for the partials (NEG_INF: an empty split)
    }
    workgroupBarrier();
    put_row(0u, vec4<f32>(o0a.x, o1a.x, o2a.x, o3a.x));
    put_row(1u, vec4<f32>(o0a.y, o1a.y, o2a.y, o3a.y));
    put_row(2u, vec4<f32>(o0a.z, o1a.z, o2a.z, o3a.z));
    put_row(3u, vec4<f32>(o0a.w, o1a.w, o2a.w, o3a.w));
    put_row(4u, vec4<f32>(o0b.x, o1b.x, o2b.x, o3b.x));
    put_row(5u, vec4<f32>(o0b.y, o1b.y, o2b.y, o3b.y));
    put_row(6u, vec4<f32>(o0b.z, o1b.z, o2b.z, o3b.z));
    put_row(7u, vec4<f32>(o0b.w, o1b.w, o2b.w, o3b.w));
}
