// Op::MatMul for many input rows (prefill): a 64 (input rows) x 64 (weight rows) output tile per
// workgroup of 256 invocations, each computing 4 x 4 outputs; per 32-wide slice of k the input
// tile and the dequantised weight tile are staged in workgroup memory, so each weight is decoded
// once per 64 input rows.
const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 32u;
var<workgroup> xs: array<f32, 2080>; // [BK][BM + 1]
var<workgroup> ws: array<f32, 2080>; // [BK][BN + 1]

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(workgroup_id) wid: vec3<u32>) {
    let tid = lid.x;
    let tx = tid % 16u;
    let ty = tid / 16u;
    let n0 = wid.x * BN;
    let m0 = wid.y * BM;
    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i++) {
        acc[i] = 0.0;
    }
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        for (var e = tid; e < BM * BK; e += 256u) {
            let r = e / BK;
            let c = e % BK;
            var v = 0.0;
            if (m0 + r < p.rows && k0 + c < p.k) {
                v = act[p.x + (m0 + r) * p.k + k0 + c];
            }
            xs[c * (BM + 1u) + r] = v;
        }
        // The weight tile: BN rows x BK values, decoded a unit at a time (a unit never crosses
        // a 32-aligned slice of k: UNIT is 1, 4 or 32).
        let per_row = BK / UNIT;
        for (var e = tid; e < BN * per_row; e += 256u) {
            let r = e / per_row;
            let uu = e % per_row;
            let kk = k0 + uu * UNIT;
            if (n0 + r < p.n_count && kk < p.k) {
                load_unit((n0 + r) * p.row_bytes, kk / UNIT);
                for (var i = 0u; i < UNIT; i++) {
                    ws[(uu * UNIT + i) * (BN + 1u) + r] = wu[i];
                }
            } else {
                for (var i = 0u; i < UNIT; i++) {
                    ws[(uu * UNIT + i) * (BN + 1u) + r] = 0.0;
                }
            }
        }
        workgroupBarrier();
        for (var c = 0u; c < BK; c++) {
            var a: array<f32, 4>;
            var b: array<f32, 4>;
            for (var i = 0u; i < 4u; i++) {
                a[i] = xs[c * (BM + 1u) + ty + 16u * i];
                b[i] = ws[c * (BN + 1u) + tx + 16u * i];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    acc[i * 4u + j] += a[i] * b[j];
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) {
            let row = m0 + ty + 16u * i;
            let col = n0 + tx + 16u * j;
            if (row < p.rows && col < p.n_count) {
                store(p.n_base + col, row, acc[i * 4u + j]);
            }
        }
    }
}
