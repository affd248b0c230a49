// Second half of Op::Attention, flash-decoding style: workgroup (h, r, s) attends query head h
// of row r over split s of the cached positions lo..=p of the row's slot (the splits divide that
// range evenly at run time), with an online softmax over chunks of 64 positions. Each subgroup
// computes the scores of its share of a chunk's positions, its invocations splitting the head's
// dimensions (coalesced reads of the cache, read in place); each invocation then owns
// head_dim / 64 output dimensions. With one split the result is written directly; otherwise the
// split's unnormalised output goes to `part_o` ([rows][heads][splits][head_dim]) and its maximum
// and sum to `part_ml` ([rows][heads][splits][2]) for attention_combine. The backend runs this
// kernel only for head_dim > 256 (attention_gqa takes the rest).
layout(local_size_x = 64) in;
#define MAX_HEAD_DIM 512
#define PER_THREAD (MAX_HEAD_DIM / 64)
#define CHUNK 64
// Images' blocks (Op::Attention's bidirectional_from; a specialisation constant, so that text
// programs run the kernel without them): each row sees lo ..= ends[r], its block's last
// position (kit::step::visible_ends, uploaded beside the positions each step), not lo ..= pos.
layout(constant_id = 1) const uint IMAGE_ROWS = 0;

layout(push_constant, scalar) uniform Params {
    uint64_t q;
    uint64_t kc;
    uint64_t vc;
    uint64_t dst;
    uint64_t positions;
    uint64_t slots;
    uint64_t part_o;
    uint64_t part_ml;
    uint heads;
    uint kv_heads;
    uint head_dim;
    uint capacity;
    float scale;
    uint window;   // 0: none
    float softcap; // 0: none
    uint f16;
    uint splits;
    uint rows;
    uint skip_block; // nonzero: leave the one-slot blocks of this many rows (attention_tiled's)
    uint64_t ends;   // IMAGE_ROWS only: each row's last visible position
} p;

shared float qs[MAX_HEAD_DIM];
shared float probs[CHUNK];
shared float red[64];

float cache_at(uint64_t base, uint64_t i) {
    if (p.f16 != 0u) {
        return unpackHalf2x16(ld_u16(base, i)).x;
    }
    return ld_f32(base, i);
}

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
    uint h = gl_WorkGroupID.x;
    uint r = gl_WorkGroupID.y;
    uint split = gl_WorkGroupID.z;
    if (p.skip_block != 0u && one_slot_block(p.slots, r, p.rows, p.skip_block)) {
        return;
    }
    uint hd = p.head_dim;
    uint g = h / (p.heads / p.kv_heads);
    uint kv_cols = p.kv_heads * hd;
    uint pos = U32s(p.positions).v[r];
    uint slot = U32s(p.slots).v[r];
    uint lo = (p.window != 0u && pos + 1u > p.window) ? pos + 1u - p.window : 0u;
    uint end = IMAGE_ROWS != 0u ? max(U32s(p.ends).v[r], pos) : pos;
    uint total = end - lo + 1u;
    uint per = (total + p.splits - 1u) / p.splits;
    uint first = min(split * per, total);
    uint n = min(first + per, total) - first;
    F32s qrow = F32s(p.q + (uint64_t(r) * p.heads * hd + h * hd) * 4);
    for (uint d = tid; d < hd; d += 64) {
        qs[d] = qrow.v[d];
    }
    barrier();
    float o[PER_THREAD];
    for (uint i = 0; i < PER_THREAD; i++) {
        o[i] = 0.0;
    }
    float m = -1.0 / 0.0;
    float l = 0.0;
    uint lane = gl_SubgroupInvocationID;
    for (uint base = 0; base < n; base += CHUNK) {
        uint count = min(uint(CHUNK), n - base);
        // Scores: subgroup sg takes positions sg, sg + subgroups, ...
        for (uint j = gl_SubgroupID; j < count; j += gl_NumSubgroups) {
            uint64_t row = uint64_t(slot) * p.capacity + (lo + first + base + j) % p.capacity;
            uint64_t at = row * kv_cols + g * hd;
            float dot = 0.0;
            for (uint d = lane; d < hd; d += gl_SubgroupSize) {
                dot += qs[d] * cache_at(p.kc, at + d);
            }
            dot = subgroupAdd(dot);
            if (subgroupElect()) {
                float s = dot * p.scale;
                if (p.softcap != 0.0) {
                    s = p.softcap * tanh_safe(s / p.softcap);
                }
                probs[j] = s;
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
            uint64_t row = uint64_t(slot) * p.capacity + (lo + first + base + jj) % p.capacity;
            uint64_t at = row * kv_cols + g * hd;
            float pj = probs[jj];
            for (uint i = 0; i < PER_THREAD; i++) {
                uint d = tid + 64 * i;
                if (d < hd) {
                    o[i] += pj * cache_at(p.vc, at + d);
                }
            }
        }
        barrier();
        m = nm;
    }
    if (p.splits == 1u) {
        F32s out_row = F32s(p.dst + (uint64_t(r) * p.heads * hd + h * hd) * 4);
        for (uint i = 0; i < PER_THREAD; i++) {
            uint d = tid + 64 * i;
            if (d < hd) {
                out_row.v[d] = o[i] / l;
            }
        }
        return;
    }
    // Partial: unnormalised output, then maximum and sum.
    uint64_t at = (uint64_t(r) * p.heads + h) * p.splits + split;
    if (tid == 0u) {
        st_f32(p.part_ml, at * 2u, n == 0u ? -1.0 / 0.0 : m);
        st_f32(p.part_ml, at * 2u + 1u, l);
    }
    for (uint i = 0; i < PER_THREAD; i++) {
        uint d = tid + 64 * i;
        if (d < hd) {
            st_f32(p.part_o, at * hd + d, o[i]);
        }
    }
}
