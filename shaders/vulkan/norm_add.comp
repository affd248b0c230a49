// Fused RmsNorm -> Add [-> RmsNorm] (program/fuse.rs, NormAdd): per row,
//   y1 = a * inv1 * (off1 + w1),  s = h + y1,  and when has_next, y2 = s * inv2 * (off2 + w2),
// each rms over the whole row. Every value is written (later nodes may read any of them). One
// workgroup of 512 per row; rows up to 6144 wide are held in registers (one memory round trip
// per pass), wider ones re-read; each invocation reads back only what it wrote itself.
#define WG 512
#define PER 12
layout(local_size_x = WG) in;

layout(push_constant, scalar) uniform Params {
    uint64_t a;
    uint64_t w1;
    uint64_t h;
    uint64_t sum;
    uint64_t y1;
    uint64_t w2;
    uint64_t y2;
    uint cols;
    float eps1;
    float off1;
    uint fmt1; // 0: f32, 1: f16, 2: bf16
    float eps2;
    float off2;
    uint fmt2;
    uint has_next;
} p;

shared float partial[WG];

float weight_at(uint64_t w, uint fmt, uint i) {
    if (fmt == 0u) {
        return F32s(w).v[i];
    } else if (fmt == 1u) {
        return unpackHalf2x16(uint(U16s(w).v[i])).x;
    }
    return uintBitsToFloat(uint(U16s(w).v[i]) << 16);
}

float wg_sum(float v) {
    v = subgroupAdd(v);
    if (subgroupElect()) {
        partial[gl_SubgroupID] = v;
    }
    barrier();
    float t = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) {
        t += partial[i];
    }
    barrier();
    return t;
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint64_t base = uint64_t(gl_WorkGroupID.x) * p.cols * 4;
    F32s as = F32s(p.a + base);
    F32s hs = F32s(p.h + base);
    F32s ss = F32s(p.sum + base);
    F32s y1s = F32s(p.y1 + base);
    F32s y2s = F32s(p.y2 + base);
    if (p.cols <= WG * PER) {
        // The row in registers: PER values per invocation of a, h and both weights, every load
        // issued before the first store (the buffers may alias as far as the compiler knows, so
        // a load after a store waits for it: loads interleaved with stores made each of the
        // PER trips a memory round trip, 18.4 us a node on a 27B row against ~5 for the other
        // one-row kernels).
        float v[PER];
        float hv[PER];
        float w1v[PER];
        float w2v[PER];
        bool next = p.has_next != 0u;
        float sq = 0.0;
        for (uint j = 0; j < PER; j++) {
            uint i = tid + j * WG;
            bool in_row = i < p.cols;
            v[j] = in_row ? as.v[i] : 0.0;
            hv[j] = in_row ? hs.v[i] : 0.0;
            w1v[j] = in_row ? weight_at(p.w1, p.fmt1, i) : 0.0;
            w2v[j] = in_row && next ? weight_at(p.w2, p.fmt2, i) : 0.0;
            sq += v[j] * v[j];
        }
        float inv1 = 1.0 / sqrt(wg_sum(sq) / float(p.cols) + p.eps1);
        float sq2 = 0.0;
        for (uint j = 0; j < PER; j++) {
            float y = v[j] * inv1 * (p.off1 + w1v[j]);
            hv[j] += y;
            v[j] = y;
            sq2 += hv[j] * hv[j];
        }
        for (uint j = 0; j < PER; j++) {
            uint i = tid + j * WG;
            if (i < p.cols) {
                y1s.v[i] = v[j];
                ss.v[i] = hv[j];
            }
        }
        if (!next) {
            return;
        }
        float inv2 = 1.0 / sqrt(wg_sum(sq2) / float(p.cols) + p.eps2);
        for (uint j = 0; j < PER; j++) {
            uint i = tid + j * WG;
            if (i < p.cols) {
                y2s.v[i] = hv[j] * inv2 * (p.off2 + w2v[j]);
            }
        }
        return;
    }
    // Wider rows: each pass re-reads what it needs.
    float sq = 0.0;
    for (uint i = tid; i < p.cols; i += WG) {
        float v = as.v[i];
        sq += v * v;
    }
    float inv1 = 1.0 / sqrt(wg_sum(sq) / float(p.cols) + p.eps1);
    float sq2 = 0.0;
    for (uint i = tid; i < p.cols; i += WG) {
        float y = as.v[i] * inv1 * (p.off1 + weight_at(p.w1, p.fmt1, i));
        y1s.v[i] = y;
        float s = hs.v[i] + y;
        ss.v[i] = s;
        sq2 += s * s;
    }
    if (p.has_next == 0u) {
        return;
    }
    float inv2 = 1.0 / sqrt(wg_sum(sq2) / float(p.cols) + p.eps2);
    for (uint i = tid; i < p.cols; i += WG) {
        y2s.v[i] = ss.v[i] * inv2 * (p.off2 + weight_at(p.w2, p.fmt2, i));
    }
}
