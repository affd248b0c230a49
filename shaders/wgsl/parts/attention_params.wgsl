// The parameters and bindings of the second half of Op::Attention, shared by attention.wgsl,
// attention_gqa.wgsl (and its subgroup variant) and attention_tiled.wgsl: the backend plans
// them in this order. Offsets count f32 elements of the arena or u32 words of the arguments.
struct Params {
    q: u32,
    dst: u32,
    positions: u32,
    slots: u32,
    partial: u32,   // the split partials ([rows][heads][splits][2 + head_dim])
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    capacity: u32,
    scale: f32,
    window: u32,    // 0: none
    softcap: f32,   // 0: none
    f16: u32,
    splits: u32,
    coop: u32,      // attention.wgsl: cooperative scoring (single-row steps)
    skip_block: u32, // attention.wgsl: rows of blocks attention_tiled takes are skipped
    rows: u32,      // attention_tiled.wgsl: the step's rows
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read> args: array<u32>;
@group(0) @binding(4) var<storage, read_write> kc: array<u32>;
@group(0) @binding(5) var<storage, read_write> vc: array<u32>;
