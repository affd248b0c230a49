//! Every `unsafe` operation of the crate: the ioctl call, `mmap`/`munmap` and the accesses
//! through a mapping, reading `CLOCK_MONOTONIC`, and taking ownership of file descriptors the
//! kernel returns (syncobj exports, duplicates). Everything above this module is safe code.

#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::ptr::NonNull;

use crate::uapi::{ioc_size, IoctlArg};

/// Opens `path` read-write with `O_CLOEXEC` (std sets it on every open; asked for again to be
/// explicit). Safe: plain `open(2)`.
pub(crate) fn open_rdwr_cloexec(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}

/// Issues ioctl `request` on `fd` with `arg`, retrying on `EINTR`. Returns the `errno` on
/// failure. Refuses (with `EINVAL`, without calling) a request whose encoded size is not
/// `size_of::<T>()`.
///
/// Pointers stored inside `arg` (as `u64` user addresses) must point at memory that stays
/// valid and correctly sized for the call's duration; the kernel validates them with
/// `copy_from_user`/`copy_to_user`, and the callers in this crate only store addresses of
/// locals that outlive the call.
pub(crate) fn ioctl<T: IoctlArg>(fd: BorrowedFd<'_>, request: u32, arg: &mut T) -> Result<(), i32> {
    if ioc_size(request) != std::mem::size_of::<T>() {
        return Err(libc::EINVAL);
    }
    loop {
        // SAFETY: `arg` is a live, exclusively borrowed `T` of exactly the size the request
        // encodes (checked above), so the kernel reads and writes only within it. `T` is a
        // sealed plain-old-data uAPI struct (`IoctlArg`): any bytes written are a valid `T`.
        // `fd` is a borrowed, open descriptor.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, arg as *mut T) };
        if rc == 0 {
            return Ok(());
        }
        let errno = io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
        if errno != libc::EINTR {
            return Err(errno);
        }
    }
}

/// Takes ownership of `fd`, a descriptor the kernel has just returned to this process through
/// an ioctl argument (`DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD`); `None` for a negative value.
///
/// Callers pass only the value the kernel wrote into the argument of a successful call, once.
pub(crate) fn owned_from_kernel(fd: i32) -> Option<OwnedFd> {
    if fd < 0 {
        return None;
    }
    // SAFETY: the kernel installed `fd` in this process's table for this call and handed it to
    // us alone (callers pass it once, straight from the ioctl's argument): nothing else owns
    // or will close it.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A new descriptor (`F_DUPFD_CLOEXEC`) for whatever `fd` refers to, owned by the caller: how a
/// raw descriptor from another component (a `SharedTimeline`) is used without owning it.
/// `EBADF` when `fd` is not open.
pub(crate) fn dup_raw(fd: i32) -> Result<OwnedFd, i32> {
    if fd < 0 {
        return Err(libc::EBADF);
    }
    // SAFETY: `fcntl(F_DUPFD_CLOEXEC)` reads no memory of ours; on a descriptor that is not
    // open it fails with EBADF rather than touching anything.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if new < 0 {
        return Err(last_errno());
    }
    owned_from_kernel(new).ok_or(libc::EBADF)
}

/// `CLOCK_MONOTONIC` now, in nanoseconds (the clock DRM syncobj deadlines use).
// `time_t`/`c_long` are i64 here but i32 on 32-bit targets: keep the conversion.
#[allow(clippy::useless_conversion)]
pub(crate) fn monotonic_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    i64::from(ts.tv_sec)
        .saturating_mul(1_000_000_000)
        .saturating_add(i64::from(ts.tv_nsec))
}

/// A shared mapping of a buffer object, unmapped on drop. All access is bounds-checked.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value (no thread affinity); `&self`
// methods only read and `&mut self` methods write, so the usual borrow rules make concurrent
// use sound.
unsafe impl Send for Mapping {}

impl Mapping {
    /// `mmap(NULL, len, PROT_READ|PROT_WRITE, MAP_SHARED, fd, offset)`.
    pub(crate) fn shared(fd: BorrowedFd<'_>, offset: u64, len: usize) -> Result<Self, i32> {
        if len == 0 {
            return Err(libc::EINVAL);
        }
        let off = libc::off_t::try_from(offset).map_err(|_| libc::EINVAL)?;
        // SAFETY: a fresh mapping at an address the kernel chooses; it aliases nothing in this
        // process. The fd is open for the call's duration.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                off,
            )
        };
        Self::from_raw(p, len)
    }

    /// Like [`Mapping::shared`] but at an address aligned to `align` (a power of two), as the
    /// firmware needs for the device heap: reserve `len + align` bytes of inaccessible address
    /// space, map the BO over the aligned part with `MAP_FIXED`, release the rest.
    pub(crate) fn shared_aligned(
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        align: usize,
    ) -> Result<Self, i32> {
        if len == 0 || !align.is_power_of_two() {
            return Err(libc::EINVAL);
        }
        let off = libc::off_t::try_from(offset).map_err(|_| libc::EINVAL)?;
        let reserve = len.checked_add(align).ok_or(libc::ENOMEM)?;
        // SAFETY: an anonymous PROT_NONE reservation at a kernel-chosen address; nothing in the
        // process refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(last_errno());
        }
        let start = base as usize;
        let aligned = (start + align - 1) & !(align - 1);
        // SAFETY: [aligned, aligned + len) lies inside the reservation made above (aligned -
        // start < align and reserve = len + align), which this function owns; MAP_FIXED
        // replaces exactly that part of it.
        let p = unsafe {
            libc::mmap(
                aligned as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                off,
            )
        };
        let failed = p == libc::MAP_FAILED;
        let errno = if failed { last_errno() } else { 0 };
        // SAFETY: unmapping only parts of our own reservation: all of it on failure, else the
        // unused head [start, aligned) and tail [aligned + len, start + reserve).
        unsafe {
            if failed {
                libc::munmap(base, reserve);
            } else {
                if aligned > start {
                    libc::munmap(base, aligned - start);
                }
                let end = aligned + len;
                if start + reserve > end {
                    libc::munmap(end as *mut libc::c_void, start + reserve - end);
                }
            }
        }
        if failed {
            return Err(errno);
        }
        Self::from_raw(p, len)
    }

    fn from_raw(p: *mut libc::c_void, len: usize) -> Result<Self, i32> {
        if p == libc::MAP_FAILED {
            return Err(last_errno());
        }
        NonNull::new(p.cast::<u8>())
            .map(|ptr| Self { ptr, len })
            .ok_or(libc::ENOMEM)
    }

    /// Mapped bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The mapping's address (what the NPU uses for a shared BO without a device address).
    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    fn check(&self, offset: usize, len: usize) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// Copies `data` to `offset`. Returns false (writing nothing) when out of range.
    pub(crate) fn write(&mut self, offset: usize, data: &[u8]) -> bool {
        if !self.check(offset, data.len()) {
            return false;
        }
        // SAFETY: [offset, offset + data.len()) is inside the live mapping (checked above);
        // `data` is ordinary memory, which cannot overlap the mapping through a `&[u8]` while
        // we hold `&mut self`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len()) };
        true
    }

    /// Copies from `offset` into `out`. Returns false (reading nothing) when out of range.
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        if !self.check(offset, out.len()) {
            return false;
        }
        // SAFETY: the source range is inside the live mapping (checked above); `out` is a
        // distinct, exclusively borrowed buffer.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        true
    }

    /// A volatile read of the `u32` at `offset` (4-byte aligned): the driver updates command
    /// headers behind the CPU's back.
    pub(crate) fn read_u32_volatile(&self, offset: usize) -> Option<u32> {
        if !offset.is_multiple_of(4) || !self.check(offset, 4) {
            return None;
        }
        // SAFETY: in range (checked), 4-byte aligned (mappings are page aligned and offset is
        // a multiple of 4), and any bit pattern is a valid u32.
        Some(unsafe { std::ptr::read_volatile(self.ptr.as_ptr().add(offset).cast::<u32>()) })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe a mapping this value created and still owns; after this
        // nothing refers to it.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

fn last_errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::uapi::{drm_gem_close, DRM_IOCTL_GEM_CLOSE, DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT};
    use std::os::fd::AsFd;

    #[test]
    fn ioctl_refuses_a_size_mismatch_without_calling() {
        let f = File::open("/dev/null").expect("/dev/null");
        let mut arg = drm_gem_close::default();
        assert_eq!(
            ioctl(f.as_fd(), DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT, &mut arg),
            Err(libc::EINVAL)
        );
        // The right size reaches the kernel, which rejects a DRM ioctl on /dev/null.
        assert_eq!(ioctl(f.as_fd(), DRM_IOCTL_GEM_CLOSE, &mut arg), Err(libc::ENOTTY));
    }

    #[test]
    fn aligned_shared_mapping_of_a_file() {
        // A temp file stands in for the DRM fd: a shared, file-backed mapping.
        let path = std::env::temp_dir().join(format!("xrt-sys-map-{}", std::process::id()));
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("tmp");
        f.set_len(2 * 4096).expect("size");
        let mut m = Mapping::shared_aligned(f.as_fd(), 0, 8192, 1 << 21).expect("map");
        assert_eq!(m.addr() % (1 << 21), 0);
        assert_eq!(m.len(), 8192);
        assert!(m.write(8188, &[1, 2, 3, 4]));
        assert!(!m.write(8189, &[1, 2, 3, 4]));
        assert!(!m.write(usize::MAX, &[1]));
        let mut out = [0u8; 4];
        assert!(m.read(8188, &mut out));
        assert_eq!(out, [1, 2, 3, 4]);
        assert_eq!(m.read_u32_volatile(8188), Some(u32::from_le_bytes([1, 2, 3, 4])));
        assert_eq!(m.read_u32_volatile(8190), None);
        drop(m);
        let plain = Mapping::shared(f.as_fd(), 0, 4096).expect("map");
        let mut b = [0u8; 1];
        assert!(plain.read(0, &mut b));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn dup_raw_duplicates_open_descriptors_only() {
        let f = File::open("/dev/null").expect("/dev/null");
        let dup = dup_raw(f.as_raw_fd()).expect("an open fd duplicates");
        assert_ne!(dup.as_raw_fd(), f.as_raw_fd());
        assert_eq!(dup_raw(-1).unwrap_err(), libc::EBADF);
        // A descriptor number far above any this test opened.
        assert_eq!(dup_raw(1 << 20).unwrap_err(), libc::EBADF);
        assert!(owned_from_kernel(-1).is_none());
    }

    #[test]
    fn monotonic_clock_advances() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(a > 0 && b >= a);
    }
}
