//! ERT command packets (XRT's `xrt/detail/ert.h`, as the amdxdna driver reads them in
//! `amdxdna_ctx.[ch]`): the header word's bit fields, the packets that start an NPU kernel,
//! and decoding of the state the driver writes back.
//!
//! Two start formats exist:
//!
//! * [`start_cu_mlir_aie`] — `ERT_START_CU` (opcode 0, type `ERT_CU`) whose payload after the CU
//!   mask is the kernel's register map. For an IRON / mlir-aie `MLIR_AIE` kernel that map is
//!   `opcode: u64 @0x00, instr: u64 @0x08, ninstr: u32 @0x10, bo0..bo4: u64 @0x14..`. This is
//!   what XRT submits for such an xclbin kernel (taconite captured the identical packet from
//!   XRT on a Strix NPU) and what [`crate::Amdxdna`] sends by default.
//! * [`start_npu`] — `ERT_START_NPU` (opcode 20) whose payload is `struct ert_npu_data`
//!   (instruction buffer address, its size in bytes, property count) followed by the kernel's
//!   argument words. The driver forwards it to the firmware's DPU path. Provided and tested
//!   for layout; no NPU has run it through this crate.

use std::fmt;

/// `ERT_CMD_STATE_NEW` and friends (`enum ert_cmd_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CommandState {
    /// 1: set by the host before submission.
    New,
    /// 2.
    Queued,
    /// 3.
    Running,
    /// 4: the command completed.
    Completed,
    /// 5: the command failed.
    Error,
    /// 6: aborted.
    Abort,
    /// 7.
    Submitted,
    /// 8: timed out and reset.
    Timeout,
    /// 9: timed out and could not be reset.
    NoResponse,
    /// 10: soft kernel error.
    SkError,
    /// 11: soft kernel crashed.
    SkCrashed,
    /// Any other value of the 4-bit field (0 = `ERT_CMD_STATE_INVALID` in the driver).
    Other(u8),
}

impl CommandState {
    /// Decodes the 4-bit state field.
    pub fn from_bits(bits: u8) -> Self {
        match bits & 0xf {
            1 => Self::New,
            2 => Self::Queued,
            3 => Self::Running,
            4 => Self::Completed,
            5 => Self::Error,
            6 => Self::Abort,
            7 => Self::Submitted,
            8 => Self::Timeout,
            9 => Self::NoResponse,
            10 => Self::SkError,
            11 => Self::SkCrashed,
            other => Self::Other(other),
        }
    }

    /// The state of a packet from its header word.
    pub fn from_header(header: u32) -> Self {
        Self::from_bits((header & 0xf) as u8)
    }

    /// The 4-bit value.
    pub fn bits(self) -> u8 {
        match self {
            Self::New => 1,
            Self::Queued => 2,
            Self::Running => 3,
            Self::Completed => 4,
            Self::Error => 5,
            Self::Abort => 6,
            Self::Submitted => 7,
            Self::Timeout => 8,
            Self::NoResponse => 9,
            Self::SkError => 10,
            Self::SkCrashed => 11,
            Self::Other(v) => v & 0xf,
        }
    }

    /// Whether the command is finished (successfully or not).
    pub fn is_final(self) -> bool {
        !matches!(self, Self::New | Self::Queued | Self::Running | Self::Submitted)
    }
}

impl fmt::Display for CommandState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Self::New => "NEW",
            Self::Queued => "QUEUED",
            Self::Running => "RUNNING",
            Self::Completed => "COMPLETED",
            Self::Error => "ERROR",
            Self::Abort => "ABORT",
            Self::Submitted => "SUBMITTED",
            Self::Timeout => "TIMEOUT",
            Self::NoResponse => "NORESPONSE",
            Self::SkError => "SKERROR",
            Self::SkCrashed => "SKCRASHED",
            Self::Other(_) => "unknown",
        };
        write!(f, "{} ({name})", self.bits())
    }
}

/// `ERT_START_CU` (= `ERT_START_KERNEL`).
pub const ERT_START_CU: u8 = 0;
/// `ERT_START_DPU`.
pub const ERT_START_DPU: u8 = 18;
/// `ERT_CMD_CHAIN`.
pub const ERT_CMD_CHAIN: u8 = 19;
/// `ERT_START_NPU`.
pub const ERT_START_NPU: u8 = 20;
/// `enum ert_cmd_type`: `ERT_DEFAULT`.
pub const ERT_DEFAULT: u8 = 0;
/// `enum ert_cmd_type`: `ERT_CU`.
pub const ERT_CU: u8 = 3;
/// The `MLIR_AIE` kernel's `opcode` argument that runs its instruction stream.
pub const MLIR_AIE_OPCODE_RUN: u64 = 3;
/// Buffer arguments an `MLIR_AIE` kernel takes (`bo0`..`bo4`).
pub const MAX_BO_ARGS: usize = 5;
/// Largest `count` the 11-bit field holds.
pub const MAX_COUNT: u16 = (1 << 11) - 1;

/// The header word of a start-kernel packet (`struct ert_start_kernel_cmd`):
/// `state:4 | stat_enabled:1 | unused:5 | extra_cu_masks:2 | count:11 | opcode:5 | type:4`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Bits 0-3.
    pub state: u8,
    /// Bit 4.
    pub stat_enabled: bool,
    /// Bits 10-11: CU masks after the mandatory one.
    pub extra_cu_masks: u8,
    /// Bits 12-22: payload words after the header.
    pub count: u16,
    /// Bits 23-27.
    pub opcode: u8,
    /// Bits 28-31.
    pub cmd_type: u8,
}

impl Header {
    /// Packs the fields (each masked to its width).
    pub fn encode(&self) -> u32 {
        u32::from(self.state & 0xf)
            | (u32::from(self.stat_enabled) << 4)
            | (u32::from(self.extra_cu_masks & 0x3) << 10)
            | (u32::from(self.count & MAX_COUNT) << 12)
            | (u32::from(self.opcode & 0x1f) << 23)
            | (u32::from(self.cmd_type & 0xf) << 28)
    }

    /// Unpacks a header word.
    pub fn decode(word: u32) -> Self {
        Self {
            state: (word & 0xf) as u8,
            stat_enabled: word & (1 << 4) != 0,
            extra_cu_masks: ((word >> 10) & 0x3) as u8,
            count: ((word >> 12) & u32::from(MAX_COUNT)) as u16,
            opcode: ((word >> 23) & 0x1f) as u8,
            cmd_type: ((word >> 28) & 0xf) as u8,
        }
    }

    /// The decoded state.
    pub fn command_state(&self) -> CommandState {
        CommandState::from_bits(self.state)
    }
}

/// Why a packet could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// More buffer arguments than the kernel takes.
    #[error("{given} buffer arguments; an NPU kernel takes at most {max}")]
    TooManyArgs {
        /// Given.
        given: usize,
        /// Allowed.
        max: usize,
    },
    /// The CU index does not fit the single 32-bit CU mask.
    #[error("CU index {0} does not fit the CU mask (0..32)")]
    CuIndex(u32),
    /// The payload does not fit the 11-bit count.
    #[error("payload of {0} words exceeds the packet's 11-bit count")]
    TooLong(usize),
}

fn split(addr: u64) -> [u32; 2] {
    [addr as u32, (addr >> 32) as u32]
}

fn finish(opcode: u8, cu_index: u32, payload: Vec<u32>) -> Result<Vec<u32>, PacketError> {
    if cu_index >= 32 {
        return Err(PacketError::CuIndex(cu_index));
    }
    let count = payload.len() + 1; // + the CU mask
    if count > usize::from(MAX_COUNT) {
        return Err(PacketError::TooLong(count));
    }
    let header = Header {
        state: CommandState::New.bits(),
        stat_enabled: false,
        extra_cu_masks: 0,
        count: count as u16,
        opcode,
        cmd_type: ERT_CU,
    };
    let mut words = Vec::with_capacity(count + 1);
    words.push(header.encode());
    words.push(1 << cu_index);
    words.extend(payload);
    Ok(words)
}

/// `ERT_START_CU` for an IRON `MLIR_AIE` kernel: header, CU mask, then the register map
/// `opcode (u64) = 3, instr (u64), ninstr (u32), bo0..bo4 (u64 each, zero when absent)`.
/// 64-bit values are split low word first. `ninstr` is passed through as given (mlir-aie's C++
/// hosts pass the instruction count in 32-bit words).
pub fn start_cu_mlir_aie(
    cu_index: u32,
    instr_addr: u64,
    ninstr: u32,
    bo_addrs: &[u64],
) -> Result<Vec<u32>, PacketError> {
    if bo_addrs.len() > MAX_BO_ARGS {
        return Err(PacketError::TooManyArgs {
            given: bo_addrs.len(),
            max: MAX_BO_ARGS,
        });
    }
    let mut regmap = Vec::with_capacity(15);
    regmap.extend(split(MLIR_AIE_OPCODE_RUN));
    regmap.extend(split(instr_addr));
    regmap.push(ninstr);
    for i in 0..MAX_BO_ARGS {
        regmap.extend(split(bo_addrs.get(i).copied().unwrap_or(0)));
    }
    finish(ERT_START_CU, cu_index, regmap)
}

/// `ERT_START_NPU`: header, CU mask, `struct ert_npu_data { u64 instruction_buffer;
/// u32 instruction_buffer_size /* bytes */; u32 instruction_prop_count /* 0 */ }`, then each
/// argument's 64-bit address as two words, low first.
pub fn start_npu(
    cu_index: u32,
    instr_addr: u64,
    instr_bytes: u32,
    arg_addrs: &[u64],
) -> Result<Vec<u32>, PacketError> {
    if arg_addrs.len() > MAX_BO_ARGS {
        return Err(PacketError::TooManyArgs {
            given: arg_addrs.len(),
            max: MAX_BO_ARGS,
        });
    }
    let mut payload = Vec::with_capacity(4 + 2 * arg_addrs.len());
    payload.extend(split(instr_addr));
    payload.push(instr_bytes);
    payload.push(0); // instruction_prop_count
    for &a in arg_addrs {
        payload.extend(split(a));
    }
    finish(ERT_START_NPU, cu_index, payload)
}

/// Words of `struct amdxdna_cmd_chain` before the command handles: `command_count`,
/// `submit_index`, `error_index`, `reserved[3]`.
pub const CHAIN_HEADER_WORDS: usize = 6;

/// `ERT_CMD_CHAIN`: header (type `ERT_DEFAULT`, no CU mask), then `struct amdxdna_cmd_chain {
/// u32 command_count; u32 submit_index; u32 error_index; u32 reserved[3]; u64 data[]; }` where
/// `data` holds each chained command BO's handle, low word first (the driver's
/// `amdxdna_ctx.h`; its multi-command path runs them in order on one context and, when one
/// fails, writes its index to `error_index`).
pub fn cmd_chain(command_handles: &[u32]) -> Result<Vec<u32>, PacketError> {
    let count = CHAIN_HEADER_WORDS + 2 * command_handles.len();
    if count > usize::from(MAX_COUNT) {
        return Err(PacketError::TooLong(count));
    }
    let header = Header {
        state: CommandState::New.bits(),
        stat_enabled: false,
        extra_cu_masks: 0,
        count: count as u16,
        opcode: ERT_CMD_CHAIN,
        cmd_type: ERT_DEFAULT,
    };
    let mut words = Vec::with_capacity(count + 1);
    words.push(header.encode());
    words.extend([command_handles.len() as u32, 0, 0, 0, 0, 0]);
    for &h in command_handles {
        words.extend(split(u64::from(h)));
    }
    Ok(words)
}

/// The `error_index` word of a chain packet read back (`words` from the header on), or `None`
/// when the packet is too short to hold one.
pub fn chain_error_index(words: &[u32]) -> Option<u32> {
    words.get(3).copied()
}

/// The little-endian bytes of a packet, as written into the command BO.
pub fn to_bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_lists_its_commands_after_the_chain_header() {
        let p = cmd_chain(&[7, 9]).unwrap();
        let h = Header::decode(p[0]);
        assert_eq!((h.opcode, h.cmd_type, h.count), (ERT_CMD_CHAIN, ERT_DEFAULT, 10));
        assert_eq!(&p[1..], &[2, 0, 0, 0, 0, 0, 7, 0, 9, 0]);
        assert_eq!(chain_error_index(&p), Some(0));
        assert_eq!(cmd_chain(&[1; 1021]), Err(PacketError::TooLong(2048)));
    }

    #[test]
    fn header_bitfields() {
        let h = Header {
            state: 1,
            stat_enabled: true,
            extra_cu_masks: 2,
            count: 16,
            opcode: ERT_START_NPU,
            cmd_type: ERT_CU,
        };
        // 1 | 1<<4 | 2<<10 | 16<<12 | 20<<23 | 3<<28
        assert_eq!(
            h.encode(),
            0x0000_0001 | 0x10 | 0x800 | 0x1_0000 | 0x0A00_0000 | 0x3000_0000
        );
        assert_eq!(Header::decode(h.encode()), h);
        assert_eq!(Header::decode(0xffff_ffff).count, 0x7ff);
        assert_eq!(Header::decode(0xffff_ffff).opcode, 0x1f);
    }

    #[test]
    fn state_decoding() {
        assert_eq!(CommandState::from_header(0x3001_0001), CommandState::New);
        assert_eq!(CommandState::from_header(0x3001_0004), CommandState::Completed);
        assert_eq!(CommandState::from_header(0x3001_0005), CommandState::Error);
        assert_eq!(CommandState::from_header(0x3001_0008), CommandState::Timeout);
        assert_eq!(CommandState::from_header(0x3001_0000), CommandState::Other(0));
        assert!(CommandState::Completed.is_final());
        assert!(CommandState::Abort.is_final());
        assert!(!CommandState::Running.is_final());
        for b in 0..16u8 {
            assert_eq!(CommandState::from_bits(b).bits(), b);
        }
        assert_eq!(CommandState::Error.to_string(), "5 (ERROR)");
    }

    #[test]
    fn start_cu_packet_byte_for_byte() {
        // Instruction stream at device address 0x0402_8000, 812 words, three buffers at host
        // (SVA) addresses.
        let p = start_cu_mlir_aie(
            0,
            0x0402_8000,
            812,
            &[0x7b7d_41cd_f000, 0x7b7d_419b_f000, 0x7b7d_4169_f000],
        )
        .expect("encodes");
        #[rustfmt::skip]
        let expected: [u8; 68] = [
            0x01, 0x00, 0x01, 0x30, // header: state NEW, count 16, opcode 0, type ERT_CU (3)
            0x01, 0x00, 0x00, 0x00, // cu_mask: CU 0
            0x03, 0x00, 0x00, 0x00, // opcode lo = 3
            0x00, 0x00, 0x00, 0x00, // opcode hi
            0x00, 0x80, 0x02, 0x04, // instr lo
            0x00, 0x00, 0x00, 0x00, // instr hi
            0x2c, 0x03, 0x00, 0x00, // ninstr = 812
            0x00, 0xf0, 0xcd, 0x41, 0x7d, 0x7b, 0x00, 0x00, // bo0
            0x00, 0xf0, 0x9b, 0x41, 0x7d, 0x7b, 0x00, 0x00, // bo1
            0x00, 0xf0, 0x69, 0x41, 0x7d, 0x7b, 0x00, 0x00, // bo2
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // bo3 (absent)
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // bo4 (absent)
        ];
        assert_eq!(to_bytes(&p), expected);
        let h = Header::decode(p[0]);
        assert_eq!((h.count, h.opcode, h.cmd_type), (16, ERT_START_CU, ERT_CU));
        assert_eq!(h.command_state(), CommandState::New);
    }

    #[test]
    fn start_npu_packet_byte_for_byte() {
        let p = start_npu(2, 0x1_0000_2000, 0x40, &[0x1122_3344_5566_7788, 0x99]).expect("encodes");
        #[rustfmt::skip]
        let expected: [u8; 40] = [
            0x01, 0x90, 0x00, 0x3a, // header: NEW, count 9 (mask + 8 payload words), opcode 20, type 3
            0x04, 0x00, 0x00, 0x00, // cu_mask: CU 2
            0x00, 0x20, 0x00, 0x00, // instruction_buffer lo
            0x01, 0x00, 0x00, 0x00, // instruction_buffer hi
            0x40, 0x00, 0x00, 0x00, // instruction_buffer_size (bytes)
            0x00, 0x00, 0x00, 0x00, // instruction_prop_count
            0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, // arg 0
            0x99, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // arg 1
        ];
        assert_eq!(to_bytes(&p), expected);
    }

    #[test]
    fn packet_errors() {
        assert_eq!(
            start_cu_mlir_aie(0, 0, 0, &[0; 6]),
            Err(PacketError::TooManyArgs { given: 6, max: 5 })
        );
        assert_eq!(start_npu(32, 0, 0, &[]), Err(PacketError::CuIndex(32)));
    }
}
