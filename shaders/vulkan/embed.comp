// Op::Embed: out[r, :] = table[tokens[r], :] * scale. One invocation per decoding unit of a row;
// workgroup y is the row. With RANGED (an embedding with images' rows past the vocabulary), only
// the rows whose token lies in row_lo ..< row_hi are written, from table row token - row_lo: the
// vocabulary (0 ..< vocab, scaled) and the extra rows (vocab ..< vocab + n, f32, scale 1) take a
// dispatch each.
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint RANGED = 0;

layout(push_constant, scalar) uniform Params {
    uint64_t table;
    uint64_t dst;
    uint64_t tokens;
    uint cols;
    uint row_bytes;
    float scale;
    uint row_lo; // RANGED only
    uint row_hi;
} p;

void main() {
    uint u = gl_GlobalInvocationID.x;
    uint r = gl_WorkGroupID.y;
    if (u >= p.cols / UNIT) {
        return;
    }
    uint t = U32s(p.tokens).v[r];
    if (RANGED != 0u) {
        if (t < p.row_lo || t >= p.row_hi) {
            return;
        }
        t -= p.row_lo;
    }
    float w[UNIT];
    load_unit(p.table + uint64_t(t) * p.row_bytes, u, w);
    F32s o = F32s(p.dst + (uint64_t(r) * p.cols + u * UNIT) * 4);
    for (uint i = 0; i < UNIT; i++) {
        o.v[i] = w[i] * p.scale;
    }
}
