//! Handing a checkpoint map's pages back once a tensor has been copied out of them, so that a
//! load holds each weight once (in the backend's buffer) rather than twice (there and in the
//! page cache pages mapped into the process), and the process's peak memory is what placement
//! estimated.

use memmap2::{Mmap, UncheckedAdvice};

/// Inward alignment of the released range: a multiple of every page size Linux uses (4 KiB to
/// 64 KiB), so the call is valid wherever the map is.
const ALIGN: usize = 64 << 10;

/// Releases the whole pages of `map` that `data` (a slice of it) covers: the next read of them
/// faults them back in from the file. A slice that is not in `map` is left alone.
pub(crate) fn release(map: &Mmap, data: &[u8]) {
    let base = map.as_ptr() as usize;
    let start = data.as_ptr() as usize;
    let Some(offset) = start.checked_sub(base) else {
        return;
    };
    let end = offset + data.len();
    if end > map.len() {
        return;
    }
    let (from, to) = (offset.next_multiple_of(ALIGN), end / ALIGN * ALIGN);
    if to <= from {
        return;
    }
    // SAFETY: `map` is a read-only map of a file (memmap2's `Mmap`), so MADV_DONTNEED only drops
    // the process's view of clean file pages: later reads of the range see the file's bytes
    // again, and no slice of the map changes. `from..to` lies inside the map and starts on a
    // page boundary. A failure (an unusual page size) only leaves the pages mapped.
    let _ = unsafe { map.unchecked_advise_range(UncheckedAdvice::DontNeed, from, to - from) };
}
