// First half of Op::Attention: the step's keys and values go to row positions[r] % capacity of
// slot slots[r]. f32 caches take one value per invocation, f16 caches a pair (one word).
struct Params {
    k: u32,
    v: u32,
    positions: u32,
    slots: u32,
    kv_cols: u32,
    capacity: u32,
    f16: u32,
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read> args: array<u32>;
@group(0) @binding(4) var<storage, read_write> kc: array<u32>;
@group(0) @binding(5) var<storage, read_write> vc: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let r = wid.y;
    let pos = args[p.positions + r];
    let slot = args[p.slots + r];
    let row = slot * p.capacity + pos % p.capacity;
    let src = r * p.kv_cols;
    if (p.f16 != 0u) {
        let c = 2u * gid.x;
        if (c >= p.kv_cols) {
            return;
        }
        let at = (row * p.kv_cols + c) / 2u;
        kc[at] = pack2x16float(vec2<f32>(act[p.k + src + c], act[p.k + src + c + 1u]));
        vc[at] = pack2x16float(vec2<f32>(act[p.v + src + c], act[p.v + src + c + 1u]));
    } else {
        let c = gid.x;
        if (c >= p.kv_cols) {
            return;
        }
        kc[row * p.kv_cols + c] = bitcast<u32>(act[p.k + src + c]);
        vc[row * p.kv_cols + c] = bitcast<u32>(act[p.v + src + c]);
    }
}
