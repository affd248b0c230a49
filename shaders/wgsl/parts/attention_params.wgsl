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
    ends: u32,      // IMAGE_ROWS only: each row's last visible position (u32 words of args)
}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> act: array<f32>;
@group(0) @binding(2) var<storage, read> args: array<u32>;
@group(0) @binding(4) var<storage, read_write> kc: array<u32>;
@group(0) @binding(5) var<storage, read_write> vc: array<u32>;

// Images' blocks (Op::Attention's bidirectional_from; an override constant, so that text
// programs run the kernels without them): row r sees lo ..= row_end(r, pos), its block's last
// position (kit::step::visible_ends, written each step beside the positions), with lo from its
// own position.
override IMAGE_ROWS: bool = false;

// The last position row r (at `pos`) sees.
fn row_end(r: u32, pos: u32) -> u32 {
    if (IMAGE_ROWS) {
        return max(args[p.ends + r], pos);
    }
    return pos;
}
