// Parameters and output placement shared by matvec.wgsl and matmul_tiled.wgsl. The weight rows
// bound are rows n_base .. n_base + n_count of the matrix (a large weight is bound in chunks of
// rows, each within the device's binding limit); output column j = n_base + local row goes to
// split s, the first with j < end_s (end_3 = n). The cooperative-matrix prefill path
// (matmul_half.wgsl and its staging kernels) also reads: h_a, h_b, the f16 staging buffer's
// offsets (in halves) of the input rows and of the weight rows; kp, the staged rows' stride (k
// rounded up to 16, zeros past k); np, the staged weight rows (n_count rounded up to the tile).
struct Params {
    x: u32,
    k: u32,
    rows: u32,
    row_bytes: u32,
    n_base: u32,
    n_count: u32,
    n: u32,
    dst0: u32,
    dst1: u32,
    dst2: u32,
    dst3: u32,
    end0: u32,
    end1: u32,
    end2: u32,
    h_a: u32,
    h_b: u32,
    kp: u32,
    np: u32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;

fn store(j: u32, row: u32, v: f32) {
    var dst = p.dst3;
    var start = p.end2;
    var end = p.n;
    if (j < p.end0) {
        dst = p.dst0;
        start = 0u;
        end = p.end0;
    } else if (j < p.end1) {
        dst = p.dst1;
        start = p.end0;
        end = p.end1;
    } else if (j < p.end2) {
        dst = p.dst2;
        start = p.end1;
        end = p.end2;
    }
    act[dst + row * (end - start) + (j - start)] = v;
}
