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

/// Checks a region passed to [`crate::ComputeBackend::import_host`] for a tensor of `desc`: not
/// null, its start and length multiples of [`crate::HOST_IMPORT_ALIGN`], long enough. Returns
/// the pointer and the tensor's byte size (at most `len`), or an error saying which check failed.
pub fn check_host_region(
    ptr: *mut u8,
    len: usize,
    desc: &crate::TensorDesc,
) -> Result<(std::ptr::NonNull<u8>, usize), crate::BackendError> {
    use crate::{BackendError, HOST_IMPORT_ALIGN};
    let bytes = desc.byte_size()?;
    let ptr =
        std::ptr::NonNull::new(ptr).ok_or_else(|| BackendError::invalid("import_host: a null pointer"))?;
    if !(ptr.as_ptr() as usize).is_multiple_of(HOST_IMPORT_ALIGN) || !len.is_multiple_of(HOST_IMPORT_ALIGN) {
        return Err(BackendError::invalid(format!(
            "import_host: the region ({len} bytes at {:p}) is not aligned to {HOST_IMPORT_ALIGN} bytes",
            ptr.as_ptr()
        )));
    }
    if (len as u64) < bytes {
        return Err(BackendError::invalid(format!(
            "import_host: {len} bytes cannot hold {desc} ({bytes} bytes)"
        )));
    }
    // `bytes <= len`, a usize.
    Ok((ptr, bytes as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_regions_are_checked() {
        use crate::{DType, TensorDesc, HOST_IMPORT_ALIGN};
        let desc = TensorDesc::new(DType::F32, vec![4, 8]);
        let aligned = HOST_IMPORT_ALIGN as *mut u8;
        let (p, bytes) = check_host_region(aligned, HOST_IMPORT_ALIGN, &desc).unwrap();
        assert_eq!((p.as_ptr(), bytes), (aligned, 128));
        let err = |ptr: *mut u8, len: usize| check_host_region(ptr, len, &desc).unwrap_err().to_string();
        assert!(err(std::ptr::null_mut(), HOST_IMPORT_ALIGN).contains("null"));
        assert!(err(aligned.wrapping_add(64), HOST_IMPORT_ALIGN).contains("not aligned"));
        assert!(err(aligned, 64).contains("not aligned"));
        let big = TensorDesc::new(DType::F32, vec![HOST_IMPORT_ALIGN, 2]);
        assert!(check_host_region(aligned, HOST_IMPORT_ALIGN, &big)
            .unwrap_err()
            .to_string()
            .contains("cannot hold"));
    }

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
