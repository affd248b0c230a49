// Op::SelectRows: out[i, :] = x[select[i], :]. Workgroup y is the selected row.
layout(local_size_x = 64) in;

layout(push_constant, scalar) uniform Params {
    uint64_t x;
    uint64_t dst;
    uint64_t select;
    uint cols;
} p;

void main() {
    uint c = gl_GlobalInvocationID.x;
    uint i = gl_WorkGroupID.y;
    if (c >= p.cols) {
        return;
    }
    uint r = U32s(p.select).v[i];
    st_f32(p.dst, uint64_t(i) * p.cols + c, ld_f32(p.x, uint64_t(r) * p.cols + c));
}
