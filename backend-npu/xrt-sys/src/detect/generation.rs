//! NPU generations as the amdxdna driver's PCI table (`amdxdna_pci_drv.c`: `amdxdna_ids[]`)
//! and per-generation files (`npu1_regs.c`, `npu4_regs.c`, ...) define them.

use std::fmt;

/// AMD's PCI vendor id.
pub const AMD_VENDOR: u16 = 0x1022;
/// PCI device ids the mainline driver binds (`pci_ids[]`).
pub const NPU_DEVICE_IDS: [u16; 2] = [0x1502, 0x17f0];

/// An NPU generation: the driver's `(device, revision)` key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Generation {
    /// `1022:1502` rev 0x00: Phoenix / Hawk Point (XDNA, AIE2).
    Npu1,
    /// `1022:17f0` rev 0x00: early Strix parts (listed by mainline's first tables only).
    Npu2,
    /// `1022:17f0` rev 0x10: Strix Point / Krackan / Strix Halo (XDNA2, AIE2P).
    Npu4,
    /// `1022:17f0` rev 0x11 (XDNA2, AIE2P).
    Npu5,
    /// `1022:17f0` rev 0x20 (XDNA2, AIE2P).
    Npu6,
}

impl Generation {
    /// All generations, in table order.
    pub const ALL: [Generation; 5] = [
        Generation::Npu1,
        Generation::Npu2,
        Generation::Npu4,
        Generation::Npu5,
        Generation::Npu6,
    ];

    /// The generation the driver selects for a PCI `device`/`revision`, if any.
    pub fn from_pci(device: u16, revision: u8) -> Option<Self> {
        Some(match (device, revision) {
            (0x1502, 0x00) => Self::Npu1,
            (0x17f0, 0x00) => Self::Npu2,
            (0x17f0, 0x10) => Self::Npu4,
            (0x17f0, 0x11) => Self::Npu5,
            (0x17f0, 0x20) => Self::Npu6,
            _ => return None,
        })
    }

    /// `(device, revision)` of this generation.
    pub fn pci(self) -> (u16, u8) {
        match self {
            Self::Npu1 => (0x1502, 0x00),
            Self::Npu2 => (0x17f0, 0x00),
            Self::Npu4 => (0x17f0, 0x10),
            Self::Npu5 => (0x17f0, 0x11),
            Self::Npu6 => (0x17f0, 0x20),
        }
    }

    /// The driver's name, e.g. `npu4`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Npu1 => "npu1",
            Self::Npu2 => "npu2",
            Self::Npu4 => "npu4",
            Self::Npu5 => "npu5",
            Self::Npu6 => "npu6",
        }
    }

    /// The AIE architecture: `"aie2"` (XDNA) or `"aie2p"` (XDNA2).
    pub fn aie(self) -> &'static str {
        match self {
            Self::Npu1 => "aie2",
            _ => "aie2p",
        }
    }

    /// Columns of the array (npu1: 5, of which column 0 is not given to contexts; XDNA2: 8).
    pub fn columns(self) -> u32 {
        match self {
            Self::Npu1 => 5,
            _ => 8,
        }
    }

    /// First column a hardware context may use (`first_col` in the driver's dev info).
    pub fn first_column(self) -> u32 {
        match self {
            Self::Npu1 => 1,
            _ => 0,
        }
    }

    /// Rows of compute (core) tiles per column: 4 on every generation (plus one memory-tile
    /// row and one shim row, which are not counted).
    pub fn rows(self) -> u32 {
        4
    }

    /// Operations per cycle per column the driver assumes (`col_opc`).
    pub fn ops_per_cycle_per_column(self) -> u32 {
        match self {
            Self::Npu1 => 2048,
            _ => 4096,
        }
    }

    /// The driver's `default_vbnv`.
    pub fn default_vbnv(self) -> &'static str {
        match self {
            Self::Npu1 => "RyzenAI-npu1",
            Self::Npu2 => "RyzenAI-npu2",
            Self::Npu4 => "RyzenAI-npu4",
            Self::Npu5 => "RyzenAI-npu5",
            Self::Npu6 => "RyzenAI-npu6",
        }
    }

    /// Where the driver loads firmware from (its `fw_path`, under `/lib/firmware`). npu6 shares
    /// npu4's directory in the driver table.
    pub fn firmware_dir(self) -> &'static str {
        match self {
            Self::Npu1 => "/lib/firmware/amdnpu/1502_00/",
            Self::Npu2 => "/lib/firmware/amdnpu/17f0_00/",
            Self::Npu4 | Self::Npu6 => "/lib/firmware/amdnpu/17f0_10/",
            Self::Npu5 => "/lib/firmware/amdnpu/17f0_11/",
        }
    }

    /// Products, for messages.
    pub fn products(self) -> &'static str {
        match self {
            Self::Npu1 => "Ryzen 7040/8040 (Phoenix, Hawk Point)",
            Self::Npu2 => "early Strix",
            Self::Npu4 => "Ryzen AI 300 (Strix Point, Krackan Point, Strix Halo)",
            Self::Npu5 | Self::Npu6 => "Ryzen AI (XDNA2)",
        }
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}, {})", self.name(), self.aie(), self.products())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_round_trips() {
        for g in Generation::ALL {
            let (d, r) = g.pci();
            assert_eq!(Generation::from_pci(d, r), Some(g));
        }
        assert_eq!(Generation::from_pci(0x17f0, 0x12), None);
        assert_eq!(Generation::from_pci(0x1503, 0x00), None);
    }

    #[test]
    fn shapes() {
        assert_eq!(
            (
                Generation::Npu1.aie(),
                Generation::Npu1.columns(),
                Generation::Npu1.rows()
            ),
            ("aie2", 5, 4)
        );
        assert_eq!(
            (
                Generation::Npu4.aie(),
                Generation::Npu4.columns(),
                Generation::Npu4.rows()
            ),
            ("aie2p", 8, 4)
        );
        assert_eq!(Generation::Npu6.firmware_dir(), "/lib/firmware/amdnpu/17f0_10/");
    }
}
