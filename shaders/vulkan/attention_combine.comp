// Merges attention's per-split partial results (maximum, sum, unnormalised output) of one
// (head, row): out = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s.
layout(local_size_x = 64) in;

layout(push_constant, scalar) uniform Params {
    uint64_t partial;
    uint64_t dst;
    uint heads;
    uint head_dim;
    uint splits;
} p;

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint h = gl_WorkGroupID.x;
    uint r = gl_WorkGroupID.y;
    uint hd = p.head_dim;
    uint64_t base = (uint64_t(r) * p.heads + h) * p.splits * (hd + 2);
    float mx = -1.0 / 0.0;
    for (uint s = 0; s < p.splits; s++) {
        mx = max(mx, ld_f32(p.partial, base + s * (hd + 2)));
    }
    float l = 0.0;
    for (uint s = 0; s < p.splits; s++) {
        float ms = ld_f32(p.partial, base + s * (hd + 2));
        if (ms != -1.0 / 0.0) {
            l += exp(ms - mx) * ld_f32(p.partial, base + s * (hd + 2) + 1);
        }
    }
    for (uint d = tid; d < hd; d += 64) {
        float acc = 0.0;
        for (uint s = 0; s < p.splits; s++) {
            float ms = ld_f32(p.partial, base + s * (hd + 2));
            if (ms != -1.0 / 0.0) {
                acc += exp(ms - mx) * ld_f32(p.partial, base + s * (hd + 2) + 2 + d);
            }
        }
        st_f32(p.dst, (uint64_t(r) * p.heads + h) * hd + d, acc / l);
    }
}
