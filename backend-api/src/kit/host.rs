//! The host's memory, for backends whose buffers live in it (the CPU, an NPU sharing DRAM): the
//! device figure their [`crate::MEMORY_LIMIT`] budget is checked against.

/// The host's total memory in bytes (`MemTotal` of `/proc/meminfo`); `None` where that cannot
/// be read (not Linux, no procfs).
pub fn host_memory_bytes() -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_total(&text))
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find_map(|l| l.strip_prefix("MemTotal:"))?;
    let mut parts = line.split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    let scale = match parts.next() {
        None => 1,
        Some(unit) if unit.eq_ignore_ascii_case("kb") => 1024,
        Some(_) => return None,
    };
    value.checked_mul(scale).filter(|b| *b > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_is_read_in_bytes() {
        let text = "MemTotal:       16318412 kB\nMemFree:         1234 kB\n";
        assert_eq!(mem_total(text), Some(16_318_412 * 1024));
        assert_eq!(mem_total("MemFree: 5 kB\n"), None);
        assert_eq!(mem_total("MemTotal: lots kB\n"), None);
        assert_eq!(mem_total("MemTotal: 0 kB\n"), None);
        if std::path::Path::new("/proc/meminfo").exists() {
            assert!(host_memory_bytes().is_some_and(|b| b > 1 << 20));
        }
    }
}
