// Op::BlockAttention (the vision tower's attention over each image's patches): workgroup
// (h, r), numbered along x then y (a step may hold more rows than one grid dimension), attends
// query head h of row r over every row of r's block of `block` rows, with an online softmax
// over chunks of 64 keys, as `attention` does over the cache: each subgroup scores its share of
// a chunk's keys, its lanes splitting the head's dimensions; each invocation then owns
// head_dim / 64 output dimensions. q, k, v and the output are [rows, heads * head_dim] f32.
layout(local_size_x = 64) in;
#define MAX_HEAD_DIM 512
#define PER_THREAD (MAX_HEAD_DIM / 64)
#define CHUNK 64

layout(push_constant, scalar) uniform Params {
    uint64_t q;
    uint64_t k;
    uint64_t v;
    uint64_t dst;
    uint heads;
    uint head_dim;
    uint rows;
    uint block;
    float scale;
} p;

shared float qs[MAX_HEAD_DIM];
shared float probs[CHUNK];
shared float red[64];

float wg_max(float v) {
    v = subgroupMax(v);
    if (subgroupElect()) {
        red[gl_SubgroupID] = v;
    }
    barrier();
    float m = red[0];
    for (uint i = 1; i < gl_NumSubgroups; i++) {
        m = max(m, red[i]);
    }
    barrier();
    return m;
}

float wg_sum(float v) {
    v = subgroupAdd(v);
    if (subgroupElect()) {
        red[gl_SubgroupID] = v;
    }
    barrier();
    float s = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) {
        s += red[i];
    }
    barrier();
    return s;
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint id = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (id >= p.rows * p.heads) {
        return; // the grid's last row of workgroups may pass the end
    }
    uint h = id % p.heads;
    uint r = id / p.heads;
    uint hd = p.head_dim;
    uint64_t width = uint64_t(p.heads) * hd;
    uint first = r - r % p.block;
    for (uint d = tid; d < hd; d += 64) {
        qs[d] = ld_f32(p.q, uint64_t(r) * width + h * hd + d);
    }
    barrier();
    float o[PER_THREAD];
    for (uint i = 0; i < PER_THREAD; i++) {
        o[i] = 0.0;
    }
    float m = -1.0 / 0.0;
    float l = 0.0;
    uint lane = gl_SubgroupInvocationID;
    for (uint base = 0; base < p.block; base += CHUNK) {
        uint count = min(uint(CHUNK), p.block - base);
        // Scores: subgroup sg takes keys sg, sg + subgroups, ...
        for (uint j = gl_SubgroupID; j < count; j += gl_NumSubgroups) {
            uint64_t at = uint64_t(first + base + j) * width + h * hd;
            float dot = 0.0;
            for (uint d = lane; d < hd; d += gl_SubgroupSize) {
                dot += qs[d] * ld_f32(p.k, at + d);
            }
            dot = subgroupAdd(dot);
            if (subgroupElect()) {
                probs[j] = dot * p.scale;
            }
        }
        barrier();
        float s = tid < count ? probs[tid] : -1.0 / 0.0;
        float nm = max(m, wg_max(s));
        float e = tid < count ? exp(s - nm) : 0.0;
        probs[tid] = e;
        float cs = wg_sum(e);
        float alpha = exp(m - nm);
        l = l * alpha + cs;
        for (uint i = 0; i < PER_THREAD; i++) {
            o[i] *= alpha;
        }
        for (uint jj = 0; jj < count; jj++) {
            uint64_t at = uint64_t(first + base + jj) * width + h * hd;
            float pj = probs[jj];
            for (uint i = 0; i < PER_THREAD; i++) {
                uint d = tid + 64 * i;
                if (d < hd) {
                    o[i] += pj * ld_f32(p.v, at + d);
                }
            }
        }
        barrier();
        m = nm;
    }
    uint64_t at_out = uint64_t(r) * width + h * hd;
    for (uint i = 0; i < PER_THREAD; i++) {
        uint d = tid + 64 * i;
        if (d < hd) {
            st_f32(p.dst, at_out + d, o[i] / l);
        }
    }
}
