//! Handing a checkpoint map's pages back once a tensor has been copied out of them, so that a
//! load holds each weight once (in the backend's buffer) rather than twice (there and in the
//! page cache pages mapped into the process), and the process's peak memory is what placement
//! estimated.
//!
//! The range given back is the tensor's, widened outwards to whole [`WINDOW`]s. Kernels that
//! keep a file's page cache in large folios (Linux 6.18 on ext4, seen here) map a whole folio
//! on a fault: reading the first bytes of one tensor maps the tail of the tensor before it, or
//! all of a small one, again. Given back only inwards, those pages stayed mapped: 58 MB of the
//! default model's 250 MB held at once at the end of a load (peak RSS 1.16 times the estimate).
//! Widened, each release also drops what the previous read mapped around it, so at most about
//! one folio stays mapped. Dropping a neighbour's pages early costs only a minor fault when it
//! is read: the map is read-only, so its bytes come back from the file unchanged.

use memmap2::{Mmap, UncheckedAdvice};

/// The release window: the largest folio the page cache maps at once on x86-64 and 4 KiB-page
/// arm64 (a PMD, 2 MiB), and a multiple of every page size Linux uses (4 KiB to 64 KiB), so
/// the call is valid wherever the map is.
const WINDOW: usize = 2 << 20;

/// The range of `map` (offsets) that releasing `data` gives back: `data`'s offsets widened to
/// whole windows and clipped to the map, or `None` when `data` is not inside `map` or is empty.
fn window(map_start: usize, map_len: usize, data_start: usize, data_len: usize) -> Option<(usize, usize)> {
    let offset = data_start.checked_sub(map_start)?;
    let end = offset.checked_add(data_len)?;
    if data_len == 0 || end > map_len {
        return None;
    }
    let from = offset / WINDOW * WINDOW;
    let to = end.next_multiple_of(WINDOW).min(map_len);
    Some((from, to))
}

/// Releases the pages of `map` under `data` (a slice of it), widened to whole windows: the
/// next read of them faults them back in from the file. A slice that is not in `map` is left
/// alone.
pub(crate) fn release(map: &Mmap, data: &[u8]) {
    let Some((from, to)) = window(
        map.as_ptr() as usize,
        map.len(),
        data.as_ptr() as usize,
        data.len(),
    ) else {
        return;
    };
    // SAFETY: `map` is a read-only map of a file (memmap2's `Mmap`), so MADV_DONTNEED only drops
    // the process's view of clean file pages: later reads of the range, by any slice of the map,
    // see the file's bytes again, and no slice of the map changes. `from..to` lies inside the
    // map and `from` is a multiple of every page size from the map's (page-aligned) start;
    // memmap2 aligns the address down to a page in any case. A failure only leaves the pages
    // mapped.
    let _ = unsafe { map.unchecked_advise_range(UncheckedAdvice::DontNeed, from, to - from) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_widens_to_whole_windows_and_stays_inside_the_map() {
        let m = 0x7000_0000;
        let len = 5 * WINDOW + 100;
        // A small tensor in the middle of a window takes the whole window.
        assert_eq!(window(m, len, m + WINDOW + 10, 64), Some((WINDOW, 2 * WINDOW)));
        // One across a boundary takes both windows.
        assert_eq!(window(m, len, m + 2 * WINDOW - 8, 16), Some((WINDOW, 3 * WINDOW)));
        // The last window ends at the map's end.
        assert_eq!(window(m, len, m + 5 * WINDOW + 1, 99), Some((5 * WINDOW, len)));
        // Outside the map, or empty: nothing.
        assert_eq!(window(m, len, m - 1, 8), None);
        assert_eq!(window(m, len, m + len - 4, 8), None);
        assert_eq!(window(m, len, m + 8, 0), None);
    }

    #[test]
    fn released_pages_read_back_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("f.bin");
        let bytes: Vec<u8> = (0..3 * WINDOW + 5).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).expect("write");
        let file = std::fs::File::open(&path).expect("open");
        // SAFETY: the file is this test's own and nothing writes it while it is mapped.
        let map = unsafe { Mmap::map(&file) }.expect("map");
        let sum = |m: &Mmap| m.iter().map(|&b| b as u64).sum::<u64>();
        let before = sum(&map);
        release(&map, &map[WINDOW + 3..WINDOW + 70]);
        release(&map, &map[..]);
        assert_eq!(sum(&map), before);
        assert_eq!(&map[..], &bytes[..]);
    }
}
