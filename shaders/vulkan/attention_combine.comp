// Merges attention's per-split partial results of one (head, row): out = sum_s e^(m_s - M) o_s /
// sum_s e^(m_s - M) l_s, where `part_o` holds the unnormalised outputs o_s
// ([rows][heads][splits][head_dim]) and `part_ml` the maxima and sums ([rows][heads][splits][2]).
// Workgroup (h, r, b) writes dimensions 64b .. 64b + 63: invocation t takes dimension t % 64 of
// the splits t / 64, t / 64 + 4, ..., the four sums added through shared memory.
#extension GL_EXT_control_flow_attributes : require

#define NT 256
layout(local_size_x = NT) in;
#define DW 64          // dimensions per workgroup
#define SG (NT / DW)   // split groups

layout(push_constant, scalar) uniform Params {
    uint64_t part_o;
    uint64_t part_ml;
    uint64_t dst;
    uint64_t slots;
    uint heads;
    uint head_dim;
    uint splits; // <= NT
    uint rows;
    uint block;         // nonzero: merge only the rows of blocks of this many rows that ...
    uint take_one_slot; // ... belong to one slot (attention_tiled's), or (0) to several
} p;

shared float w[NT];
shared float red[NT];

const float NEG_INF = -1.0 / 0.0;

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint h = gl_WorkGroupID.x;
    uint r = gl_WorkGroupID.y;
    if (p.block != 0u && one_slot_block(p.slots, r, p.rows, p.block) != (p.take_one_slot != 0u)) {
        return;
    }
    uint hd = p.head_dim;
    uint S = p.splits;
    uint64_t base = (uint64_t(r) * p.heads + h) * S;
    float ms = tid < S ? ld_f32(p.part_ml, (base + tid) * 2u) : NEG_INF;
    float ls = tid < S ? ld_f32(p.part_ml, (base + tid) * 2u + 1u) : 0.0;
    // The maximum over the splits.
    float v = subgroupMax(ms);
    if (subgroupElect()) {
        red[gl_SubgroupID] = v;
    }
    barrier();
    float mx = red[0];
    for (uint i = 1; i < gl_NumSubgroups; i++) {
        mx = max(mx, red[i]);
    }
    barrier();
    float ws = ms == NEG_INF ? 0.0 : exp(ms - mx);
    w[tid] = ws;
    v = subgroupAdd(ws * ls);
    if (subgroupElect()) {
        red[gl_SubgroupID] = v;
    }
    barrier();
    float sum = 0.0;
    for (uint i = 0; i < gl_NumSubgroups; i++) {
        sum += red[i];
    }
    barrier();
    uint dl = tid % DW;
    uint k = tid / DW;
    uint d = gl_WorkGroupID.z * DW + dl;
    float acc = 0.0;
    if (d < hd) {
        for (uint s = k; s < S; s += 4u * SG) {
            [[unroll]] for (uint u = 0; u < 4; u++) {
                uint su = s + u * SG;
                if (su < S) {
                    acc += w[su] * ld_f32(p.part_o, (base + su) * hd + d);
                }
            }
        }
    }
    red[tid] = acc;
    barrier();
    if (k == 0u && d < hd) {
        float o = 0.0;
        [[unroll]] for (uint i = 0; i < SG; i++) {
            o += red[i * DW + dl];
        }
        st_f32(p.dst, (uint64_t(r) * p.heads + h) * hd + d, o / sum);
    }
}
