// Reading attention's K and V caches (one f32 or two f16 per word, `p.f16`), shared by
// attention.wgsl and attention_gqa.wgsl.
fn k_at(i: u32) -> f32 {
    if (p.f16 != 0u) {
        return unpack2x16float(kc[i >> 1u])[i & 1u];
    }
    return bitcast<f32>(kc[i]);
}

fn v_at(i: u32) -> f32 {
    if (p.f16 != 0u) {
        return unpack2x16float(vc[i >> 1u])[i & 1u];
    }
    return bitcast<f32>(vc[i]);
}

// A query value, or 0 past the head.
fn q_or0(qrow: u32, d: u32, hd: u32) -> f32 {
    var v = 0.0;
    if (d < hd) {
        v = act[qrow + d];
    }
    return v;
}

// A cached value, or 0 past the head.
fn k_or0(at: u32, d: u32, hd: u32) -> f32 {
    return select(0.0, k_at(at + d), d < hd);
}
fn v_or0(at: u32, d: u32, hd: u32) -> f32 {
    return select(0.0, v_at(at + d), d < hd);
}

// Values d .. d + 3 of a cached K row (0 past the head). Built whole, not by component in a
// loop (a dynamically indexed vector can end up in memory).
fn k4(at: u32, d: u32, hd: u32) -> vec4<f32> {
    if (d + 4u <= hd) {
        return vec4<f32>(k_at(at + d), k_at(at + d + 1u), k_at(at + d + 2u), k_at(at + d + 3u));
    }
    return vec4<f32>(k_or0(at, d, hd), k_or0(at, d + 1u, hd), k_or0(at, d + 2u, hd), k_or0(at, d + 3u, hd));
}

// Values d, d + 64, d + 128, d + 192 of a cached V row (0 past the head).
fn v4(at: u32, d: u32, hd: u32) -> vec4<f32> {
    if (d + 192u < hd) {
        return vec4<f32>(v_at(at + d), v_at(at + d + 64u), v_at(at + d + 128u), v_at(at + d + 192u));
    }
    return vec4<f32>(v_or0(at, d, hd), v_or0(at, d + 64u, hd), v_or0(at, d + 128u, hd), v_or0(at, d + 192u, hd));
}

