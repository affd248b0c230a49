// Whether every row of the block of `block` rows that holds row `r` (of `rows`) belongs to one
// slot, from the slots at word `slots` of the step arguments. attention_tiled takes exactly
// those blocks; attention (with `skip_block`) and attention_combine (by `mode`) tell them apart
// with it, so all three agree.
fn one_slot_block(slots: u32, r: u32, rows: u32, block: u32) -> bool {
    let r0 = r - r % block;
    let end = min(r0 + block, rows);
    let first = args[slots + r0];
    for (var i = r0 + 1u; i < end; i++) {
        if (args[slots + i] != first) {
            return false;
        }
    }
    return true;
}
