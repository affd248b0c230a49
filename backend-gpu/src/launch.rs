//! Launch geometry: workgroup counts and their layout over the grid's dimensions.

/// `a / b` rounded up, as a workgroup count (saturating at `u32::MAX`).
pub fn div_up(a: usize, b: usize) -> u32 {
    a.div_ceil(b).min(u32::MAX as usize) as u32
}

/// `groups` workgroups laid out along x, spilling into y past 32768 per dimension (kernels
/// number them `x + y * num_x`).
pub fn spread(groups: u32) -> [u32; 2] {
    let gx = groups.clamp(1, 32768);
    [gx, groups.div_ceil(gx).max(1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workgroups_round_up_and_spill_into_y() {
        assert_eq!(spread(70_000), [32768, 3]);
        assert_eq!(spread(0), [1, 1]);
        assert_eq!(spread(5), [5, 1]);
        assert_eq!(div_up(65, 64), 2);
        assert_eq!(div_up(64, 64), 1);
        assert_eq!(div_up(usize::MAX, 1), u32::MAX);
    }
}
