//! NPU detection over a filesystem root (`/` on a real machine, a fake tree in tests).
//!
//! Reads only sysfs/procfs/XRT files: `<root>/sys/bus/pci/devices/*` (vendor, device,
//! revision, the `driver` link, the driver's `vbnv`, `device_type`, `fw_version` attributes),
//! `<root>/sys/class/accel/accel*` and `<root>/dev/accel/accelN`, `<root>/sys/module/amdxdna`,
//! `<root>/proc/sys/kernel/osrelease` and `<root>/opt/xilinx/xrt/version.json`. Opening the
//! node (and so "busy") is [`crate::Amdxdna`]'s job.

mod generation;

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

pub use generation::{Generation, AMD_VENDOR, NPU_DEVICE_IDS};

/// A PCI function's identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PciId {
    /// Bus address, e.g. `0000:c5:00.1`.
    pub slot: String,
    /// Vendor id.
    pub vendor: u16,
    /// Device id.
    pub device: u16,
    /// Revision id.
    pub revision: u8,
}

impl fmt::Display for PciId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:04x} rev {:#04x} at {}",
            self.vendor, self.device, self.revision, self.slot
        )
    }
}

/// A usable NPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The accel node to open, e.g. `/dev/accel/accel0` (under the detection root).
    pub node: PathBuf,
    /// The PCI function.
    pub pci: PciId,
    /// Its generation.
    pub generation: Generation,
    /// The bound driver's name (target of the `driver` link), normally `amdxdna`.
    pub driver: Option<String>,
    /// The `vbnv` attribute (e.g. `RyzenAI-npu4`), or the driver's default for the generation.
    pub vbnv: String,
    /// The `device_type` attribute (0 = kernel-mode queue).
    pub device_type: Option<i32>,
    /// The `fw_version` attribute (`major.minor.patch.build`).
    pub firmware_version: Option<String>,
    /// The driver: `<root>/sys/module/amdxdna/version` when the module declares one (DKMS
    /// builds), else `in-tree (Linux <release>)`.
    pub driver_version: String,
    /// `<root>/proc/sys/kernel/osrelease`.
    pub kernel_release: Option<String>,
    /// XRT's `BUILD_VERSION` from `<root>/opt/xilinx/xrt/version.json`, when XRT is installed
    /// (not needed by this crate).
    pub xrt_version: Option<String>,
}

impl DeviceInfo {
    /// One line for logs.
    pub fn summary(&self) -> String {
        format!(
            "{} [{}] {} fw {} driver {}",
            self.node.display(),
            self.pci,
            self.generation,
            self.firmware_version.as_deref().unwrap_or("?"),
            self.driver_version
        )
    }
}

/// Why there is no usable NPU. `Display` says what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// No PCI function with an NPU id.
    #[error(
        "no AMD NPU found: no PCI device {AMD_VENDOR:04x}:1502 (Ryzen 7040/8040) or {AMD_VENDOR:04x}:17f0 \
         (Ryzen AI 300) under {}; this machine has no Ryzen AI NPU, or it is disabled in the firmware setup",
        scanned.display()
    )]
    NoDevice {
        /// The directory scanned.
        scanned: PathBuf,
    },
    /// The NPU is present but the amdxdna driver is not loaded.
    #[error(
        "the NPU {pci} is present but the amdxdna driver is not loaded (no /sys/module/amdxdna); \
         amdxdna is in mainline Linux since 6.14 (this kernel: {}){}",
        kernel_release.as_deref().unwrap_or("unknown"),
        if *too_old { ": upgrade to Linux 6.14 or newer, or install amd/xdna-driver's module" }
        else { ": run `modprobe amdxdna` (CONFIG_DRM_ACCEL_AMDXDNA) and check `dmesg`" }
    )]
    NoDriver {
        /// The device found.
        pci: PciId,
        /// The running kernel.
        kernel_release: Option<String>,
        /// Whether that kernel predates 6.14.
        too_old: bool,
    },
    /// Driver loaded, device present, but no accel node: usually missing or failed firmware.
    #[error(
        "the NPU {pci} ({generation}) has no accel node although the amdxdna driver is loaded{}: \
         its firmware is probably missing or failed to load; check that {firmware_dir} holds npu.sbin \
         (linux-firmware 20250212 or newer) and look for amdxdna errors in `dmesg`",
        match bound_driver { Some(d) if d != "amdxdna" => format!(" (the device is bound to {d})"),
            Some(_) => String::new(), None => " (no driver bound to the device)".to_string() }
    )]
    NoAccelNode {
        /// The device.
        pci: PciId,
        /// Its generation.
        generation: Generation,
        /// The driver bound to the device, if any.
        bound_driver: Option<String>,
        /// Where the driver looks for firmware.
        firmware_dir: String,
    },
    /// An NPU device id with a revision the driver table does not list.
    #[error(
        "the NPU {pci} has a PCI revision the amdxdna driver table does not list (known: 1502 rev 0x00, \
         17f0 revs 0x00/0x10/0x11/0x20); a newer kernel or amd/xdna-driver may support it"
    )]
    UnknownRevision {
        /// The device.
        pci: PciId,
    },
}

/// What [`detect`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Detection {
    /// Usable NPUs, ordered by PCI slot.
    Found(Vec<DeviceInfo>),
    /// None, and why.
    Unavailable(Unavailable),
}

/// Looks for NPUs under `root`. Order of checks: an NPU PCI device must exist (else
/// [`Unavailable::NoDevice`], even without the driver: a driver would not help), its revision
/// must be in the driver table ([`Unavailable::UnknownRevision`]), the driver must be loaded
/// ([`Unavailable::NoDriver`]), and the device must have an accel node
/// ([`Unavailable::NoAccelNode`]).
pub fn detect(root: &Path) -> Detection {
    let pci_dir = root.join("sys/bus/pci/devices");
    let candidates = npu_pci_devices(&pci_dir);
    if candidates.is_empty() {
        return Detection::Unavailable(Unavailable::NoDevice { scanned: pci_dir });
    }
    let known: Vec<(PathBuf, PciId, Generation)> = candidates
        .iter()
        .filter_map(|(dir, id)| {
            Some((
                dir.clone(),
                id.clone(),
                Generation::from_pci(id.device, id.revision)?,
            ))
        })
        .collect();
    let Some(first) = known.first() else {
        return Detection::Unavailable(Unavailable::UnknownRevision {
            pci: candidates[0].1.clone(),
        });
    };

    let kernel_release = read_trimmed(&root.join("proc/sys/kernel/osrelease"));
    if !root.join("sys/module/amdxdna").is_dir() {
        let too_old = kernel_release
            .as_deref()
            .and_then(kernel_version)
            .is_some_and(|v| v < (6, 14));
        return Detection::Unavailable(Unavailable::NoDriver {
            pci: first.1.clone(),
            kernel_release,
            too_old,
        });
    }
    let driver_version = read_trimmed(&root.join("sys/module/amdxdna/version")).unwrap_or_else(|| {
        format!(
            "in-tree (Linux {})",
            kernel_release.as_deref().unwrap_or("unknown")
        )
    });
    let xrt_version = xrt_version(root);

    let mut found = Vec::new();
    for (dir, pci, generation) in &known {
        let driver = link_name(&dir.join("driver"));
        let Some(accel) = accel_name(root, dir, &pci.slot) else {
            continue;
        };
        found.push(DeviceInfo {
            node: root.join("dev/accel").join(accel),
            pci: pci.clone(),
            generation: *generation,
            driver,
            vbnv: read_trimmed(&dir.join("vbnv"))
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| generation.default_vbnv().to_string()),
            device_type: read_trimmed(&dir.join("device_type")).and_then(|t| t.parse().ok()),
            firmware_version: read_trimmed(&dir.join("fw_version")),
            driver_version: driver_version.clone(),
            kernel_release: kernel_release.clone(),
            xrt_version: xrt_version.clone(),
        });
    }
    if found.is_empty() {
        let (dir, pci, generation) = first;
        return Detection::Unavailable(Unavailable::NoAccelNode {
            pci: pci.clone(),
            generation: *generation,
            bound_driver: link_name(&dir.join("driver")),
            firmware_dir: generation.firmware_dir().to_string(),
        });
    }
    Detection::Found(found)
}

/// PCI functions with AMD's vendor id and an NPU device id, sorted by slot.
fn npu_pci_devices(pci_dir: &Path) -> Vec<(PathBuf, PciId)> {
    let Ok(entries) = fs::read_dir(pci_dir) else {
        return Vec::new();
    };
    let mut out: Vec<(PathBuf, PciId)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let dir = e.path();
            let vendor = read_hex(&dir.join("vendor"))?;
            let device = read_hex(&dir.join("device"))?;
            if vendor != u32::from(AMD_VENDOR) || !NPU_DEVICE_IDS.iter().any(|&d| u32::from(d) == device) {
                return None;
            }
            let revision = read_hex(&dir.join("revision")).unwrap_or(0);
            let slot = e.file_name().to_string_lossy().into_owned();
            Some((
                dir,
                PciId {
                    slot,
                    vendor: vendor as u16,
                    device: device as u16,
                    revision: revision as u8,
                },
            ))
        })
        .collect();
    out.sort_by(|a, b| a.1.slot.cmp(&b.1.slot));
    out
}

/// The accel device name (`accelN`) of the PCI function at `dir`: from its `accel/`
/// subdirectory, else from `<root>/sys/class/accel/*/device` links pointing at `slot`.
fn accel_name(root: &Path, dir: &Path, slot: &str) -> Option<String> {
    let is_accel = |name: &str| {
        name.strip_prefix("accel")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let from_dir = |d: PathBuf| -> Vec<String> {
        fs::read_dir(d)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut own: Vec<String> = from_dir(dir.join("accel"))
        .into_iter()
        .filter(|n| is_accel(n))
        .collect();
    own.sort();
    if let Some(name) = own.into_iter().next() {
        return Some(name);
    }
    let class = root.join("sys/class/accel");
    let mut linked: Vec<String> = from_dir(class.clone())
        .into_iter()
        .filter(|n| is_accel(n) && link_name(&class.join(n).join("device")).as_deref() == Some(slot))
        .collect();
    linked.sort();
    linked.into_iter().next()
}

/// XRT's `BUILD_VERSION` from `version.json` (`{"BUILD_VERSION" : "2.19.0", ...}`).
fn xrt_version(root: &Path) -> Option<String> {
    let text = fs::read_to_string(root.join("opt/xilinx/xrt/version.json")).ok()?;
    json_string_field(&text, "BUILD_VERSION")
}

/// The string value of `"key"` in a flat JSON object (enough for XRT's version.json; no
/// escapes inside the value).
fn json_string_field(text: &str, key: &str) -> Option<String> {
    let at = text.find(&format!("\"{key}\""))? + key.len() + 2;
    let rest = text
        .get(at..)?
        .trim_start()
        .strip_prefix(':')?
        .trim_start()
        .strip_prefix('"')?;
    let end = rest.find('"')?;
    Some(rest[..end].to_string())
}

/// `major.minor` of a kernel release string such as `6.14.0-15-generic`.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

fn read_hex(path: &Path) -> Option<u32> {
    let text = read_trimmed(path)?;
    u32::from_str_radix(text.trim_start_matches("0x").trim_start_matches("0X"), 16).ok()
}

/// The file name a symlink points at (e.g. `driver` -> `.../drivers/amdxdna` gives `amdxdna`).
fn link_name(path: &Path) -> Option<String> {
    fs::read_link(path)
        .ok()?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests;
