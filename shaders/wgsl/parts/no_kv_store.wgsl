// norm_rope.wgsl without a K/V store (the q norm, or a rope not read as an attention's K).
fn store_kv(tid: u32, r: u32, head: u32, at: u32, pos: u32, store: bool, cols: u32) {}
