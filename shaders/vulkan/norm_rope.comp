// Fused per-head RmsNorm -> Rope (program/fuse.rs, NormRope): workgroup (head, row) normalises the
// head (y = x * inv * (off + w), written), rotates it (rotate-half, the same angle reduction as
// rope.comp) into dst, and with flags & 1 also stores the rotated head as K and the row's V head
// into the KV cache at the row's (slot, position), as kv_store.comp does (f16 when flags & 2).
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
    float sq = 0.0;
    for (uint d = tid; d < hd; d += 128) {
        float v = xs.v[d];
        sq += v * v;
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
    uint pos_u = U32s(p.positions).v[r];
    float pos = float(pos_u);
    bool st = (p.flags & 1u) != 0u;
    uint64_t cache_at = 0;
    if (st) {
        uint slot = U32s(p.slots).v[r];
        cache_at = (uint64_t(slot) * p.capacity + pos_u % p.capacity) * p.cols + head * hd;
    }
    for (uint d = tid; d < half_dim; d += 128) {
        float x1 = xs.v[d] * inv * (p.off + weight_at(d));
        float x2 = xs.v[d + half_dim] * inv * (p.off + weight_at(d + half_dim));
        ys.v[d] = x1;
        ys.v[d + half_dim] = x2;
        float a = (pos / p.factor) * F32s(p.inv_freq).v[d];
        float k = round(a * 0.15915494);
        float red = (a - k * 6.28125) - k * 0.0019353072;
        float s = sin(red);
        float c = cos(red);
        float o1 = x1 * c - x2 * s;
        float o2 = x2 * c + x1 * s;
        ds.v[d] = o1;
        ds.v[d + half_dim] = o2;
        if (st) {
            store(p.kc, cache_at + d, o1);
            store(p.kc, cache_at + d + half_dim, o2);
        }
    }
    if (st) {
        F32s vs = F32s(p.v + at * 4);
        for (uint d = tid; d < hd; d += 128) {
            store(p.vc, cache_at + d, vs.v[d]);
        }
    }
}
