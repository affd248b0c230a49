// First half of Op::Attention: the step's keys and values go to row positions[r] % capacity of
// slot slots[r] of the caches (f32 or f16). One invocation per (row, column).
layout(local_size_x = 64) in;

layout(push_constant, scalar) uniform Params {
    uint64_t k;
    uint64_t v;
    uint64_t kc;
    uint64_t vc;
    uint64_t positions;
    uint64_t slots;
    uint kv_cols;
    uint capacity;
    uint f16;
} p;

void main() {
    uint c = gl_GlobalInvocationID.x;
    uint r = gl_WorkGroupID.y;
    if (c >= p.kv_cols) {
        return;
    }
    uint pos = U32s(p.positions).v[r];
    uint slot = U32s(p.slots).v[r];
    uint64_t at = (uint64_t(slot) * p.capacity + pos % p.capacity) * p.kv_cols + c;
    uint64_t src = uint64_t(r) * p.kv_cols + c;
    float kv = ld_f32(p.k, src);
    float vv = ld_f32(p.v, src);
    if (p.f16 != 0u) {
        st_u16(p.kc, at, packHalf2x16(vec2(kv, 0.0)) & 0xFFFFu);
        st_u16(p.vc, at, packHalf2x16(vec2(vv, 0.0)) & 0xFFFFu);
    } else {
        st_f32(p.kc, at, kv);
        st_f32(p.vc, at, vv);
    }
}
