// Op::Rope (rotate-half): one invocation per (row, head, d < head_dim / 2). The inverse
// frequencies come from the host (the CPU reference's f32 formula); the angle is reduced to
// [-pi, pi] before sin/cos, whose precision is only specified there.
layout(local_size_x = 64) in;

layout(push_constant, scalar) uniform Params {
    uint64_t x;
    uint64_t dst;
    uint64_t positions;
    uint64_t inv_freq;
    uint cols;
    uint head_dim;
    float factor;
} p;

void main() {
    uint i = gl_GlobalInvocationID.x;
    uint r = gl_WorkGroupID.y;
    uint half_dim = p.head_dim / 2;
    if (i >= p.cols / 2) {
        return;
    }
    uint head = i / half_dim;
    uint d = i % half_dim;
    float pos = float(U32s(p.positions).v[r]);
    float a = (pos / p.factor) * F32s(p.inv_freq).v[d];
    float k = round(a * 0.15915494);
    float red = (a - k * 6.28125) - k * 0.0019353072;
    float s = sin(red);
    float c = cos(red);
    uint64_t at = uint64_t(r) * p.cols + head * p.head_dim + d;
    F32s xs = F32s(p.x + at * 4);
    F32s ys = F32s(p.dst + at * 4);
    float x1 = xs.v[0];
    float x2 = xs.v[half_dim];
    ys.v[0] = x1 * c - x2 * s;
    ys.v[half_dim] = x2 * c + x1 * s;
}
