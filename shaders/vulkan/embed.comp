// Op::Embed: out[r, :] = table[tokens[r], :] * scale. One invocation per decoding unit of a row;
// workgroup y is the row.
layout(local_size_x = 64) in;

layout(push_constant, scalar) uniform Params {
    uint64_t table;
    uint64_t dst;
    uint64_t tokens;
    uint cols;
    uint row_bytes;
    float scale;
} p;

void main() {
    uint u = gl_GlobalInvocationID.x;
    uint r = gl_WorkGroupID.y;
    if (u >= p.cols / UNIT) {
        return;
    }
    uint t = U32s(p.tokens).v[r];
    float w[UNIT];
    load_unit(p.table + uint64_t(t) * p.row_bytes, u, w);
    F32s o = F32s(p.dst + (uint64_t(r) * p.cols + u * UNIT) * 4);
    for (uint i = 0; i < UNIT; i++) {
        o.v[i] = w[i] * p.scale;
    }
}
