// Op::MatMul for many rows (prefill) on KHR cooperative matrices (tensor cores; the path AMD
// RDNA and Intel Arc take). One workgroup of 4 subgroups of 32 computes a BX (input rows) x BW
// (weight rows = output columns) tile, each subgroup a (BX / 2) x (BW / 2) quarter of it as
// (BX / 32) x (BW / 32) 16x16 f32 accumulators fed by coopmat<float16_t, 16x16x16>.
//
// k goes 32 (or 64) at a time through shared memory: each invocation loads its share of the
// slice (the input converted to f16, or f16 already where the host converted it; the weight
// decoded to f16, one 32-value unit of one weight row per invocation for the block formats, so
// each weight is dequantised once per tile), and after a barrier the subgroups multiply it.
// q4_k's blocks are first copied raw with coalesced loads (`stage_q4k`), then decoded from
// shared memory.
//
// The grid: x the input-row tiles (so the workgroups that share a weight tile run together and
// read it from DRAM once), y the weight-row tiles, z the split-k slices. Split k (`kslice`
// nonzero, a multiple of 64: grids smaller than the GPU): workgroup z multiplies k z * kslice
// .. (z + 1) * kslice and stores its f32 partial tile into `part` at [z][rows][n];
// matmul_reduce adds the slices into the split outputs. Needs a subgroup size of 32 (the host
// checks it).
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 128) in;

// Weight rows per tile (64 or 128) in the low 16 bits of SPEC0, and in its high bits MODE: bit
// 3 says the input is f16 (converted by the host beforehand), bit 4 turns off q4_k's staged
// loads, bit 5 takes k 64 at a time (else 32); for tuning runs, bit 0 skips the weight loads,
// bit 1 the input loads, bit 2 the multiplies (the results are then wrong: it measures where
// the time goes). Input rows per tile (32, 64 or 128).
layout(constant_id = 0) const uint SPEC0 = 128;
layout(constant_id = 1) const uint BX = 128;
const uint BW = SPEC0 & 0xFFFFu;
const uint MODE = SPEC0 >> 16;

layout(push_constant, scalar) uniform Params {
    uint64_t w;
    uint64_t x;
    uint64_t dst0;
    uint64_t dst1;
    uint64_t dst2;
    uint64_t dst3;
    uint k;
    uint n;
    uint rows;
    uint row_bytes;
    uint end0;
    uint end1;
    uint end2;
    uint64_t part;
    uint kslice; // 0: the whole k, stored into the outputs
} p;

const uint BK = (MODE & 32u) != 0u ? 64u : 32u;
// Row stride of the shared tiles in f16vec2s: BK + 8 halves, 80 bytes (16-byte aligned rows;
// eight consecutive rows' 16-byte pieces fall in distinct banks).
const uint SK2 = (BK + 8) / 2;
// Each subgroup's quarter of the tile in 16x16 fragments.
const uint FX = BX / 32;
const uint FW = BW / 32;
// f16vec4s of the input tile each invocation loads (BX rows x BK / 4).
const uint XV = BX * (BK / 4) / 128;
// Whether the input is f16.
const bool XH = (MODE & 8u) != 0u;
#if UNIT == 1
// 8-value groups of the weight tile each invocation loads (BW rows x BK / 8).
const uint WG8 = BW * (BK / 8) / 128;
const uint WV = 2 * WG8;
#else
// BK / 32 units (32 values each) of one weight row.
const uint UPR = BK / 32;
const uint WV = BK / 4;
#endif

layout(buffer_reference, scalar, buffer_reference_align = 16) buffer U4s { uvec4 v[]; };

shared f16vec2 xs[BX * SK2];
shared f16vec2 ws[BW * SK2];
// Each subgroup's 16x16 f32 slot for the stores.
shared float cs[4 * 256];

#if defined(WFMT_Q4_K)
// q4_k's staged loads: per weight row of the tile, the 16 bytes of d, dmin and scales and the
// 32 bytes of nibbles holding the slice's sub-block (or pair of them, at BK 64), copied with coalesced 16-byte loads (three
// invocations per row) before one invocation per row decodes them from here.
shared uvec4 raw[BW * 3];
const uint RAW = (BW * 3 + 127) / 128;
#endif

// f16's largest finite value: inputs and weights beyond it are clamped rather than made infinite.
#define F16_MAX 65504.0

f16vec4 to_h4(vec4 v) {
    return f16vec4(clamp(v, -F16_MAX, F16_MAX));
}

// The slice's input and weight values, between the global loads and the shared stores.
f16vec4 xr[XV];
f16vec4 wr[WV];

// Loads slice k0 (of the workgroup's k range ending at ke) of the input tile into xr.
void fetch_x(uint m0, uint k0, uint ke, bool vec_x) {
    uint tid = gl_LocalInvocationID.x;
    if (XH) {
        // 8 halves per invocation and trip: row e / 4, columns (e % 4) * 8 ...
        [[unroll]] for (uint i = 0; i < XV / 2; i++) {
            uint e = tid + 128 * i;
            uint r = e / (BK / 8);
            uint c = k0 + (e % (BK / 8)) * 8;
            uvec4 h = uvec4(0);
            if (m0 + r < p.rows && (MODE & 2u) == 0u) {
                uint64_t at = uint64_t(m0 + r) * p.k + c;
                if (vec_x) {
                    if (c < ke) {
                        h = U4s(p.x + at * 2).v[0];
                    }
                } else {
                    [[unroll]] for (uint j = 0; j < 8; j++) {
                        if (c + j < ke) {
                            h[j / 2] |= ld_u16(p.x, at + j) << (16 * (j % 2));
                        }
                    }
                }
            }
            xr[2 * i] = f16vec4(unpackFloat2x16(h.x), unpackFloat2x16(h.y));
            xr[2 * i + 1] = f16vec4(unpackFloat2x16(h.z), unpackFloat2x16(h.w));
        }
        return;
    }
    // 4 floats per invocation and trip: row e / 8, columns (e % 8) * 4 ...
    [[unroll]] for (uint i = 0; i < XV; i++) {
        uint e = tid + 128 * i;
        uint r = e / (BK / 4);
        uint c = k0 + (e % (BK / 4)) * 4;
        vec4 v = vec4(0.0);
        if (m0 + r < p.rows && (MODE & 2u) == 0u) {
            uint64_t at = uint64_t(m0 + r) * p.k + c;
            if (vec_x) {
                if (c < ke) {
                    v = V4s(p.x + at * 4).v[0];
                }
            } else {
                [[unroll]] for (uint j = 0; j < 4; j++) {
                    if (c + j < ke) {
                        v[j] = ld_f32(p.x, at + j);
                    }
                }
            }
        }
        xr[i] = to_h4(v);
    }
}

// Loads and decodes slice k0 of the weight tile into wr (q4_k's staged loads aside).
void fetch_w(uint n0, uint k0, uint ke, bool vec_w) {
    uint tid = gl_LocalInvocationID.x;
#if UNIT == 1
    // Groups of 8 values: 4 invocations per weight row.
    [[unroll]] for (uint i = 0; i < WG8; i++) {
        uint e = tid + 128 * i;
        uint r = e / (BK / 8);
        uint c = k0 + (e % (BK / 8)) * 8;
        vec4 lo = vec4(0.0);
        vec4 hi = vec4(0.0);
        if (n0 + r < p.n && (MODE & 1u) == 0u) {
            uint64_t row = p.w + uint64_t(n0 + r) * p.row_bytes;
#if defined(WFMT_F16)
            if (vec_w && c < ke) {
                uvec4 h = U4s(row + uint64_t(c) * 2).v[0];
                wr[2 * i] = f16vec4(unpackFloat2x16(h.x), unpackFloat2x16(h.y));
                wr[2 * i + 1] = f16vec4(unpackFloat2x16(h.z), unpackFloat2x16(h.w));
                continue;
            }
#endif
            [[unroll]] for (uint j = 0; j < 4; j++) {
                if (c + j < ke) {
                    lo[j] = wload(row, c + j);
                }
                if (c + 4 + j < ke) {
                    hi[j] = wload(row, c + 4 + j);
                }
            }
        }
        wr[2 * i] = to_h4(lo);
        wr[2 * i + 1] = to_h4(hi);
    }
#else
    // Invocation r < BW decodes units k0 / 32 .. of weight row n0 + r (k is whole units).
    [[unroll]] for (uint u = 0; u < UPR; u++) {
        float w[UNIT];
        [[unroll]] for (uint i = 0; i < UNIT; i++) {
            w[i] = 0.0;
        }
        if (tid < BW && n0 + tid < p.n && k0 + 32 * u < ke && (MODE & 1u) == 0u) {
            load_unit(p.w + uint64_t(n0 + tid) * p.row_bytes, k0 / UNIT + u, w);
        }
        [[unroll]] for (uint i = 0; i < 8; i++) {
            wr[8 * u + i] = to_h4(vec4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]));
        }
    }
#endif
}

#if defined(WFMT_Q4_K)
// Stages slice k0 of the weight tile's q4_k blocks into `raw` (rows past n: zeros, which
// decode to zeros).
void stage_q4k(uint n0, uint k0) {
    uint tid = gl_LocalInvocationID.x;
    uint s = (k0 / 32) & 7u;
    [[unroll]] for (uint i = 0; i < RAW; i++) {
        uint j = tid + 128 * i;
        uint r = j / 3;
        uint part = j % 3;
        if (r >= BW) {
            break;
        }
        uvec4 v = uvec4(0);
        if (n0 + r < p.n && (MODE & 1u) == 0u) {
            uint off = part == 0u ? 0u : Q4_K_QS + 32 * (s >> 1) + 16 * (part - 1);
            v = U4s(p.w + uint64_t(n0 + r) * p.row_bytes + uint64_t(k0 / 256) * Q4_K_BYTES + off).v[0];
        }
        raw[j] = v;
    }
}

// Decodes the staged slice k0 of weight row `tid` of the tile into wr.
void decode_q4k(uint k0) {
    uint tid = gl_LocalInvocationID.x;
    if (tid >= BW) {
        return;
    }
    uvec4 h = raw[tid * 3];
    uvec4 qa = raw[tid * 3 + 1];
    uvec4 qb = raw[tid * 3 + 2];
    vec2 dm = unpackHalf2x16(h[Q4_K_D / 4]);
    // Sub-blocks s .. s + UPR - 1 (at BK 64 an even s and the next, sharing the 32 bytes).
    [[unroll]] for (uint u = 0; u < UPR; u++) {
        uint s = ((k0 / 32) & 7u) + u;
        uint scale;
        uint mn;
        q4k_scale_min(uvec3(h.y, h.z, h.w), s, scale, mn);
        float d1 = dm.x * float(scale);
        float m1 = dm.y * float(mn);
        uint shift = (s & 1u) * 4;
        [[unroll]] for (uint i = 0; i < 8; i++) {
            uint v = (i < 4 ? qa[i] : qb[i - 4]) >> shift;
            wr[8 * u + i] = to_h4(vec4(d1 * float(v & 15u) - m1, d1 * float((v >> 8) & 15u) - m1,
                                       d1 * float((v >> 16) & 15u) - m1, d1 * float((v >> 24) & 15u) - m1));
        }
    }
}
#endif

// Stores xr and wr into the shared tiles.
void put() {
    uint tid = gl_LocalInvocationID.x;
    if (XH) {
        [[unroll]] for (uint i = 0; i < XV / 2; i++) {
            uint e = tid + 128 * i;
            uint at = (e / (BK / 8)) * SK2 + (e % (BK / 8)) * 4;
            xs[at] = xr[2 * i].xy;
            xs[at + 1] = xr[2 * i].zw;
            xs[at + 2] = xr[2 * i + 1].xy;
            xs[at + 3] = xr[2 * i + 1].zw;
        }
    } else {
        [[unroll]] for (uint i = 0; i < XV; i++) {
            uint e = tid + 128 * i;
            uint at = (e / (BK / 4)) * SK2 + (e % (BK / 4)) * 2;
            xs[at] = xr[i].xy;
            xs[at + 1] = xr[i].zw;
        }
    }
#if UNIT == 1
    [[unroll]] for (uint i = 0; i < WG8; i++) {
        uint e = tid + 128 * i;
        uint at = (e / (BK / 8)) * SK2 + (e % (BK / 8)) * 4;
        ws[at] = wr[2 * i].xy;
        ws[at + 1] = wr[2 * i].zw;
        ws[at + 2] = wr[2 * i + 1].xy;
        ws[at + 3] = wr[2 * i + 1].zw;
    }
#else
    if (tid < BW) {
        [[unroll]] for (uint i = 0; i < WV; i++) {
            ws[tid * SK2 + 2 * i] = wr[i].xy;
            ws[tid * SK2 + 2 * i + 1] = wr[i].zw;
        }
    }
#endif
}

void main() {
    uint sg = gl_SubgroupID;
    uint lane = gl_SubgroupInvocationID;
    uint m0 = gl_WorkGroupID.x * BX;
    uint n0 = gl_WorkGroupID.y * BW;
    // This subgroup's quarter: input rows wx.., weight rows ww.. of the tile.
    uint wx = (sg & 1u) * (BX / 2);
    uint ww = (sg >> 1) * (BW / 2);
    uint kb = p.kslice * gl_WorkGroupID.z;
    uint ke = p.kslice == 0u ? p.k : min(p.k, kb + p.kslice);
    bool vec_x = XH ? ((p.k & 7u) == 0u && (p.x & 15ul) == 0ul) : ((p.k & 3u) == 0u && (p.x & 15ul) == 0ul);
    bool vec_w = (p.k & 7u) == 0u && (p.row_bytes & 15u) == 0u && (p.w & 15ul) == 0ul;
#if defined(WFMT_Q4_K)
    bool staged = (MODE & 16u) == 0u && (p.row_bytes & 15u) == 0u && (p.w & 15ul) == 0ul;
#endif

    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> acc[FX * FW];
    [[unroll]] for (uint i = 0; i < FX * FW; i++) {
        acc[i] = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
    }

    for (uint k0 = kb; k0 < ke; k0 += BK) {
        // The slice's global loads; then, once every subgroup is done with the last slice's
        // tiles, the stores (q4_k: staged first, decoded after the barrier).
        fetch_x(m0, k0, ke, vec_x);
#if defined(WFMT_Q4_K)
        if (staged) {
            stage_q4k(n0, k0);
        } else {
            fetch_w(n0, k0, ke, vec_w);
        }
        barrier();
        if (staged) {
            decode_q4k(k0);
        }
#else
        fetch_w(n0, k0, ke, vec_w);
        barrier();
#endif
        put();
        barrier();
        if ((MODE & 4u) == 0u) {
            [[unroll]] for (uint kk = 0; kk < BK / 2; kk += 8) {
                coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a[FX];
                [[unroll]] for (uint i = 0; i < FX; i++) {
                    coopMatLoad(a[i], xs, (wx + i * 16) * SK2 + kk, SK2, gl_CooperativeMatrixLayoutRowMajor);
                }
                // B[k][n] = W[n][k]: the weight tile is B in column-major order.
                [[unroll]] for (uint j = 0; j < FW; j++) {
                    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b;
                    coopMatLoad(b, ws, (ww + j * 16) * SK2 + kk, SK2, gl_CooperativeMatrixLayoutColumnMajor);
                    [[unroll]] for (uint i = 0; i < FX; i++) {
                        acc[i * FW + j] = coopMatMulAdd(a[i], b, acc[i * FW + j]);
                    }
                }
            }
        }
    }

    uint64_t slice = p.part + uint64_t(gl_WorkGroupID.z) * p.rows * p.n * 4u;
    [[unroll]] for (uint i = 0; i < FX; i++) {
        [[unroll]] for (uint j = 0; j < FW; j++) {
            coopMatStore(acc[i * FW + j], cs, sg * 256, 16, gl_CooperativeMatrixLayoutRowMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            [[unroll]] for (uint t = 0; t < 8; t++) {
                uint e = lane + 32 * t;
                uint row = m0 + wx + i * 16 + e / 16;
                uint col = n0 + ww + j * 16 + e % 16;
                if (row >= p.rows || col >= p.n) {
                    continue;
                }
                float v = cs[sg * 256 + e];
                if (p.kslice != 0u) {
                    st_f32(slice, uint64_t(row) * p.n + col, v);
                    continue;
                }
                uint64_t dst;
                uint c;
                uint width;
                if (col < p.end0) {
                    dst = p.dst0; c = col; width = p.end0;
                } else if (col < p.end1) {
                    dst = p.dst1; c = col - p.end0; width = p.end1 - p.end0;
                } else if (col < p.end2) {
                    dst = p.dst2; c = col - p.end1; width = p.end2 - p.end1;
                } else {
                    dst = p.dst3; c = col - p.end2; width = p.n - p.end2;
                }
                st_f32(dst, uint64_t(row) * width + c, v);
            }
            subgroupBarrier();
        }
    }
}
