// Op::MatMul for many input rows (prefill): a 64 (input rows) x 64 (weight rows) output tile per
// workgroup of 256 invocations, each computing 4 x 4 outputs held in four vec4 registers; per
// 32-wide slice of k the input tile and the dequantised weight tile (groups of 4 neighbouring
// values, two per invocation) are staged in workgroup memory, so each weight is decoded once
// per 64 input rows. The tiles are laid out so that an invocation's four rows (and four weight
// rows) are one vec4: two workgroup-memory loads per 16 multiply-adds.
const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 32u;
var<workgroup> xs: array<vec4<f32>, 544>; // [BK][BM / 4 + 1]: rows 4i .. 4i + 3 of column c at c * 17 + i
var<workgroup> ws: array<vec4<f32>, 544>; // [BK][BN / 4 + 1]

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(workgroup_id) wid: vec3<u32>) {
    let tid = lid.x;
    let tx = tid % 16u;
    let ty = tid / 16u;
    let n0 = wid.x * BN;
    let m0 = wid.y * BM;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    let per_row = BK / GROUP;
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        // Four rows of one column per invocation, stored as one vec4 (neighbouring invocations
        // read neighbouring columns).
        for (var e = tid; e < BM / 4u * BK; e += 256u) {
            let i = e / BK;
            let c = e % BK;
            var v = vec4<f32>(0.0);
            if (k0 + c < p.k) {
                let at = p.x + (m0 + 4u * i) * p.k + k0 + c;
                let r = m0 + 4u * i;
                v = vec4<f32>(
                    select(0.0, act[at], r < p.rows),
                    select(0.0, act[at + p.k], r + 1u < p.rows),
                    select(0.0, act[at + 2u * p.k], r + 2u < p.rows),
                    select(0.0, act[at + 3u * p.k], r + 3u < p.rows));
            }
            xs[c * 17u + i] = v;
        }
        // The weight tile: BN rows x BK values, a group (1 or 4 values, never crossing a
        // 32-aligned slice of k) at a time.
        for (var e = tid; e < BN * per_row; e += 256u) {
            let r = e / per_row;
            let c = (e % per_row) * GROUP;
            var w = vec4<f32>(0.0);
            if (n0 + r < p.n_count && k0 + c < p.k) {
                w = load_group((n0 + r) * p.row_bytes, (k0 + c) / GROUP);
            }
            let i = r / 4u;
            let j = r % 4u;
            ws[c * 17u + i][j] = w.x;
            if (GROUP == 4u) {
                ws[(c + 1u) * 17u + i][j] = w.y;
                ws[(c + 2u) * 17u + i][j] = w.z;
                ws[(c + 3u) * 17u + i][j] = w.w;
            }
        }
        workgroupBarrier();
        for (var c = 0u; c < BK; c++) {
            let a = xs[c * 17u + ty];
            let b = ws[c * 17u + tx];
            acc0 += a.x * b;
            acc1 += a.y * b;
            acc2 += a.z * b;
            acc3 += a.w * b;
        }
        workgroupBarrier();
    }
    let rows = vec4<u32>(m0 + 4u * ty, m0 + 4u * ty + 1u, m0 + 4u * ty + 2u, m0 + 4u * ty + 3u);
    let accs = array<vec4<f32>, 4>(acc0, acc1, acc2, acc3);
    for (var i = 0u; i < 4u; i++) {
        let acc = accs[i];
        let row = rows[i];
        for (var j = 0u; j < 4u; j++) {
            let col = n0 + 4u * tx + j;
            if (row < p.rows && col < p.n_count) {
                store(p.n_base + col, row, acc[j]);
            }
        }
    }
}
