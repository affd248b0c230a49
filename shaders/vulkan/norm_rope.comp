// Fused per-head RmsNorm -> Rope (program/fuse.rs, NormRope): workgroup (head, row) normalises the
// head (y = x * inv * (off + w), written), rotates it (rotate-half, the same angle reduction as
// rope.comp) into dst, and with flags & 1 also stores the rotated head as K and the row's V head
// into the KV cache at the row's (slot, position), as kv_store.comp does (f16 when flags & 2).
// Heads up to 256 wide (Gemma 3's 128 and 256) take one pass: invocation d < head_dim / 2 loads
// its rotation pair (x, the norm weights, the frequency, V) before the reduction and stores
// after it, so a row costs one memory round trip, not one per pass (the buffers may alias as far
// as the compiler knows: a load after a store waits for it). Wider heads loop.
layout(local_size_x = 128) in;

layout(push_constant, scalar) uniform Params {
    uint64_t x;
    uint64_t w;
    uint64_t y;
    uint64_t dst;
    uint64_t positions;
    uint64_t inv_freq;
    uint64_t kc;
    uint64_t vc;
    uint64_t v;
    uint64_t slots;
    uint cols;
    uint head_dim;
    float eps;
    float off;
    uint fmt; // 0: f32, 1: f16, 2: bf16
    float factor;
    uint capacity;
    uint flags;
} p;

shared float partial[32];

float weight_at(uint i) {
    if (p.fmt == 0u) {
        return F32s(p.w).v[i];
    } else if (p.fmt == 1u) {
        return unpackHalf2x16(uint(U16s(p.w).v[i])).x;
    }
    return uintBitsToFloat(uint(U16s(p.w).v[i]) << 16);
}

void store(uint64_t cache, uint64_t at, float v) {
    if ((p.flags & 2u) != 0u) {
        st_u16(cache, at, packHalf2x16(vec2(v, 0.0)) & 0xFFFFu);
    } else {
        st_f32(cache, at, v);
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint head = gl_WorkGroupID.x;
    uint r = gl_WorkGroupID.y;
    uint hd = p.head_dim;
    uint half_dim = hd / 2;
    uint64_t at = uint64_t(r) * p.cols + head * hd;
    F32s xs = F32s(p.x + at * 4);
    F32s ys = F32s(p.y + at * 4);
    F32s ds = F32s(p.dst + at * 4);
    F32s vs = F32s(p.v + at * 4);
    bool st = (p.flags & 1u) != 0u;
    uint pos_u = U32s(p.positions).v[r];
    uint slot = st ? U32s(p.slots).v[r] : 0u;
    float pos = float(pos_u);
    uint64_t cache_at = st ? (uint64_t(slot) * p.capacity + pos_u % p.capacity) * p.cols + head * hd : 0;
    bool one_pass = half_dim <= 128u;
    // One pass: this invocation's pair d, d + half_dim, loaded at once.
    uint d = tid;
    bool mine = one_pass && d < half_dim;
    float x1 = 0.0;
    float x2 = 0.0;
    float w1 = 0.0;
    float w2 = 0.0;
    float freq = 0.0;
    float v1 = 0.0;
    float v2 = 0.0;
    if (mine) {
        x1 = xs.v[d];
        x2 = xs.v[d + half_dim];
        w1 = weight_at(d);
        w2 = weight_at(d + half_dim);
        freq = F32s(p.inv_freq).v[d];
        if (st) {
            v1 = vs.v[d];
            v2 = vs.v[d + half_dim];
        }
    }
    float sq = x1 * x1 + x2 * x2;
    if (!one_pass) {
        for (uint e = tid; e < hd; e += 128) {
            float v = xs.v[e];
            sq += v * v;
        }
    }
    sq = subgroupAdd(sq);
    if (subgroupElect()) {
        partial[gl_SubgroupID] = sq;
    }
    barrier();
    float total = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) {
        total += partial[i];
    }
    float inv = 1.0 / sqrt(total / float(hd) + p.eps);
    for (uint e = tid; e < half_dim; e += 128) {
        if (!one_pass) {
            x1 = xs.v[e];
            x2 = xs.v[e + half_dim];
            w1 = weight_at(e);
            w2 = weight_at(e + half_dim);
            freq = F32s(p.inv_freq).v[e];
            if (st) {
                v1 = vs.v[e];
                v2 = vs.v[e + half_dim];
            }
        }
        float y1 = x1 * inv * (p.off + w1);
        float y2 = x2 * inv * (p.off + w2);
        ys.v[e] = y1;
        ys.v[e + half_dim] = y2;
        float a = (pos / p.factor) * freq;
        float k = round(a * 0.15915494);
        float red = (a - k * 6.28125) - k * 0.0019353072;
        float s = sin(red);
        float c = cos(red);
        float o1 = y1 * c - y2 * s;
        float o2 = y2 * c + y1 * s;
        ds.v[e] = o1;
        ds.v[e + half_dim] = o2;
        if (st) {
            store(p.kc, cache_at + e, o1);
            store(p.kc, cache_at + e + half_dim, o2);
            store(p.vc, cache_at + e, v1);
            store(p.vc, cache_at + e + half_dim, v2);
        }
    }
}
