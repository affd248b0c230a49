// The push constants of the KHR prefill kernels (`matmul_khr`, `matmul_khr64`), included by them:
// the weight, the input, up to four outputs split at columns end0 < end1 < end2, the sizes, and
// the split-k partials.
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
