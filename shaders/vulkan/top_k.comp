// Op::TopK in passes of bitonic sorts over N = 2048 keys in shared memory. A key orders a
// (value, index) pair as the op ranks them: the value's bits made monotonic in the high word
// (NaN first made -inf), the index's complement in the low word, so a larger key ranks first.
// Key 0, below every real key, pads.
// - Pass 1 (`from_values`): workgroup (g, r) sorts values g N .. g N + N - 1 of row r.
// - Later passes: workgroup (g, r) sorts the lists g P .. g P + P - 1 of row r (P = N / k
//   lists of k keys) that the pass before wrote.
// Each workgroup keeps its first k keys: into `dst` as the list g of row r (`[rows][groups][k]`
// u64), or, in the last pass (one workgroup per row), into the output row as k values then k
// indices (f32).
#extension GL_EXT_control_flow_attributes : require
#define NT 256
#define N 2048
layout(local_size_x = NT) in;

layout(buffer_reference, scalar, buffer_reference_align = 8) buffer U64s { uint64_t v[]; };

layout(push_constant, scalar) uniform Params {
    uint64_t src;   // pass 1: the f32 rows; else the previous pass's lists
    uint64_t dst;   // lists, or the output rows in the last pass
    uint n;         // elements of a source row: values (pass 1) or keys
    uint k;
    uint per;       // source elements per workgroup: N (pass 1), or lists per group x k
    uint from_values;
    uint last;
    uint groups;    // workgroups per row in this pass (lists it writes per row)
} p;

shared uint64_t keys[N];

uint64_t key_of(float v, uint index) {
    uint b = floatBitsToUint(v);
    if ((b & 0x7F800000u) == 0x7F800000u && (b & 0x007FFFFFu) != 0u) {
        b = 0xFF800000u; // NaN ranks as -inf
    }
    uint o = (b & 0x80000000u) != 0u ? ~b : (b | 0x80000000u);
    return (uint64_t(o) << 32) | uint64_t(0xFFFFFFFFu - index);
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint g = gl_WorkGroupID.x;
    uint r = gl_WorkGroupID.y;
    uint64_t row = uint64_t(r) * p.n;
    for (uint t = tid; t < N; t += NT) {
        uint e = g * p.per + t;
        uint64_t key = 0ul;
        if (t < p.per && e < p.n) {
            key = p.from_values != 0u ? key_of(ld_f32(p.src, row + e), e) : U64s(p.src + (row + e) * 8u).v[0];
        }
        keys[t] = key;
    }
    barrier();
    // Bitonic sort, larger keys first.
    for (uint size = 2u; size <= N; size <<= 1) {
        for (uint stride = size >> 1; stride > 0u; stride >>= 1) {
            for (uint t = tid; t < N / 2u; t += NT) {
                uint i = 2u * t - (t & (stride - 1u));
                uint j = i + stride;
                bool larger_first = (i & size) == 0u;
                uint64_t a = keys[i];
                uint64_t b = keys[j];
                if ((a < b) == larger_first && a != b) {
                    keys[i] = b;
                    keys[j] = a;
                }
            }
            barrier();
        }
    }
    for (uint t = tid; t < p.k; t += NT) {
        uint64_t key = keys[t];
        if (p.last != 0u) {
            uint o = uint(key >> 32);
            uint b = (o & 0x80000000u) != 0u ? (o & 0x7FFFFFFFu) : ~o;
            uint64_t at = uint64_t(r) * 2u * p.k;
            st_f32(p.dst, at + t, uintBitsToFloat(b));
            st_f32(p.dst, at + p.k + t, float(0xFFFFFFFFu - uint(key & 0xFFFFFFFFul)));
        } else {
            U64s(p.dst + ((uint64_t(r) * p.groups + g) * p.k + t) * 8u).v[0] = key;
        }
    }
}
