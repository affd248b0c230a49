// norm_rope.wgsl's K/V store (a NormRope group whose rope feeds an attention as K), by the
// workgroups of the set that stores (`store`, rows of `cols` columns): the rotated head (in
// `rot`) as K and the row's V head go to row positions[r] % capacity of slot slots[r], as
// kv_store.wgsl stores them (f16 caches two values per word; heads are even).
@group(0) @binding(4) var<storage, read_write> kc: array<u32>;
@group(0) @binding(5) var<storage, read_write> vc: array<u32>;

fn store_kv(tid: u32, r: u32, head: u32, at: u32, pos: u32, store: bool, cols: u32) {
    workgroupBarrier();
    if (!store) {
        return;
    }
    let hd = p.head_dim;
    let slot = args[p.slots + r];
    let c0 = (slot * p.capacity + pos % p.capacity) * cols + head * hd;
    if (p.f16 != 0u) {
        for (var d = 2u * tid; d < hd; d += 2u * WG) {
            kc[(c0 + d) / 2u] = pack2x16float(vec2<f32>(rot[d], rot[d + 1u]));
            vc[(c0 + d) / 2u] = pack2x16float(vec2<f32>(act[p.v + at + d], act[p.v + at + d + 1u]));
        }
    } else {
        for (var d = tid; d < hd; d += WG) {
            kc[c0 + d] = bitcast<u32>(rot[d]);
            vc[c0 + d] = bitcast<u32>(act[p.v + at + d]);
        }
    }
}
