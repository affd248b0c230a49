// q6_k, unit u: 32 values s = u % 4 of half h = (u / 4) % 2 of super-block u / 8 (210 bytes: 128
// of low nibbles, 64 of high bit pairs, 16 signed scales, d). Value l of the unit: low bits
// from byte 64h + 32(s % 2) + l (nibble s / 2), high bits from byte 128 + 32h + l at shift 2s,
// scale byte 192 + 8h + 2s + l / 16; value d * scale * (q - 32).
const UNIT: u32 = 32u;
var<private> wu: array<f32, 32>;
fn load_unit(row: u32, u: u32) {
    let b = row + (u >> 3u) * 210u;
    let h = (u >> 2u) & 1u;
    let s = u & 3u;
    let d = f16_at(b + 208u);
    let qloff = b + 64u * h + 32u * (s & 1u);
    let lshift = (s >> 1u) * 4u;
    let qhoff = b + 128u + 32u * h;
    let hshift = 2u * s;
    let scs = ld16(b + 192u + 8u * h + 2u * s);
    let ds0 = d * sext8(scs);
    let ds1 = d * sext8(scs >> 8u);
    for (var i = 0u; i < 8u; i++) {
        let lo = ld32(qloff + 4u * i) >> lshift;
        let hi = ld32(qhoff + 4u * i) >> hshift;
        var ds = ds1;
        if (i < 4u) {
            ds = ds0;
        }
        for (var j = 0u; j < 4u; j++) {
            let q = i32(((lo >> (8u * j)) & 15u) | (((hi >> (8u * j)) & 3u) << 4u)) - 32;
            wu[4u * i + j] = ds * f32(q);
        }
    }
}
