// Op::TopK, one pass of those `kit::top_k` plans: bitonic sorts of N = 2048 keys in workgroup
// memory. A key is (high, low) = (the value's bits made monotonic, NaN as -inf; the index's
// complement), compared high word first, so a larger key ranks first; (0, 0) pads. Keys live in
// the arena as two words (bit patterns stored through f32).
// - The first pass (`from_values`): workgroup (g, r) sorts values g N .. g N + N - 1 of row r.
// - Later passes: workgroup (g, r) sorts the `per` keys from g per of row r's lists that the
//   pass before wrote.
// Each workgroup keeps its first k keys: as list g of row r (`[rows][groups][k]` keys at
// `dst`), or, in the last pass (one workgroup per row), in the output row as k values then k
// indices.
struct Params {
    src: u32,
    dst: u32,
    n: u32,         // elements of a source row: values (first pass) or keys
    k: u32,
    per: u32,       // source elements per workgroup
    from_values: u32,
    last: u32,
    groups: u32,    // workgroups per row in this pass
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;

const NT: u32 = 256u;
const N: u32 = 2048u;
var<workgroup> keys: array<vec2<u32>, 2048>;

fn key_of(v: f32, index: u32) -> vec2<u32> {
    var b = bitcast<u32>(v);
    if ((b & 0x7F800000u) == 0x7F800000u && (b & 0x007FFFFFu) != 0u) {
        b = 0xFF800000u; // NaN ranks as -inf
    }
    let o = select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
    return vec2<u32>(o, 0xFFFFFFFFu - index);
}

fn greater(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x > b.x || (a.x == b.x && a.y > b.y);
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tid = lid.x;
    let g = wid.x;
    let r = wid.y;
    for (var t = tid; t < N; t += NT) {
        let e = g * p.per + t;
        var key = vec2<u32>(0u);
        if (t < p.per && e < p.n) {
            if (p.from_values != 0u) {
                key = key_of(act[p.src + r * p.n + e], e);
            } else {
                let at = p.src + 2u * (r * p.n + e);
                key = vec2<u32>(bitcast<u32>(act[at]), bitcast<u32>(act[at + 1u]));
            }
        }
        keys[t] = key;
    }
    workgroupBarrier();
    // Bitonic sort, larger keys first.
    for (var size = 2u; size <= N; size <<= 1u) {
        for (var stride = size >> 1u; stride > 0u; stride >>= 1u) {
            for (var t = tid; t < N / 2u; t += NT) {
                let i = 2u * t - (t & (stride - 1u));
                let j = i + stride;
                let larger_first = (i & size) == 0u;
                let a = keys[i];
                let b = keys[j];
                if (greater(b, a) == larger_first && any(a != b)) {
                    keys[i] = b;
                    keys[j] = a;
                }
            }
            workgroupBarrier();
        }
    }
    for (var t = tid; t < p.k; t += NT) {
        let key = keys[t];
        if (p.last != 0u) {
            let o = key.x;
            let b = select(~o, o & 0x7FFFFFFFu, (o & 0x80000000u) != 0u);
            let at = p.dst + r * 2u * p.k;
            act[at + t] = bitcast<f32>(b);
            act[at + p.k + t] = f32(0xFFFFFFFFu - key.y);
        } else {
            let at = p.dst + 2u * ((r * p.groups + g) * p.k + t);
            act[at] = bitcast<f32>(key.x);
            act[at + 1u] = bitcast<f32>(key.y);
        }
    }
}
