//! A bounds-checked parser for the parts of an AXLF container (`.xclbin`) the NPU path needs:
//! the header, the section table, the `AIE_PARTITION` section (PDI images, column width, start
//! columns, CDO groups) and the `IP_LAYOUT` kernel names.
//!
//! Every read goes through a bounds-checked reader, which turns an out-of-range access into an
//! [`AxlfError`] naming the field and its offset; nothing here can panic on any input.

mod builder;
pub mod layout;

use std::ops::Range;

pub use builder::{AiePartitionSpec, AxlfBuilder, IpKernelSpec, PdiSpec};

use layout as l;

/// `enum axlf_section_kind`: the section kinds this crate names.
pub mod kind {
    /// `BITSTREAM`.
    pub const BITSTREAM: u32 = 0;
    /// `EMBEDDED_METADATA` (XML).
    pub const EMBEDDED_METADATA: u32 = 2;
    /// `MEM_TOPOLOGY`.
    pub const MEM_TOPOLOGY: u32 = 6;
    /// `CONNECTIVITY`.
    pub const CONNECTIVITY: u32 = 7;
    /// `IP_LAYOUT`: kernel (CU) instances and their names.
    pub const IP_LAYOUT: u32 = 8;
    /// `CLOCK_FREQ_TOPOLOGY`.
    pub const CLOCK_FREQ_TOPOLOGY: u32 = 11;
    /// `BUILD_METADATA`.
    pub const BUILD_METADATA: u32 = 14;
    /// `PDI`.
    pub const PDI: u32 = 18;
    /// `ASK_GROUP_TOPOLOGY` (the "GROUP_TOPOLOGY" section).
    pub const ASK_GROUP_TOPOLOGY: u32 = 26;
    /// `ASK_GROUP_CONNECTIVITY`.
    pub const ASK_GROUP_CONNECTIVITY: u32 = 27;
    /// `AIE_PARTITION`: the NPU partition and its PDIs.
    pub const AIE_PARTITION: u32 = 32;

    /// The header's name for a section kind, for messages.
    pub fn name(kind: u32) -> &'static str {
        match kind {
            BITSTREAM => "BITSTREAM",
            EMBEDDED_METADATA => "EMBEDDED_METADATA",
            MEM_TOPOLOGY => "MEM_TOPOLOGY",
            CONNECTIVITY => "CONNECTIVITY",
            IP_LAYOUT => "IP_LAYOUT",
            CLOCK_FREQ_TOPOLOGY => "CLOCK_FREQ_TOPOLOGY",
            BUILD_METADATA => "BUILD_METADATA",
            PDI => "PDI",
            ASK_GROUP_TOPOLOGY => "ASK_GROUP_TOPOLOGY",
            ASK_GROUP_CONNECTIVITY => "ASK_GROUP_CONNECTIVITY",
            AIE_PARTITION => "AIE_PARTITION",
            _ => "section",
        }
    }
}

/// `enum IP_TYPE`: `IP_KERNEL`.
pub const IP_KERNEL: u32 = 1;
/// `enum IP_TYPE`: `IP_PS_KERNEL` (NPU DPU kernels).
pub const IP_PS_KERNEL: u32 = 7;
/// `enum PS_SUBTYPE`: `ST_DPU`.
pub const ST_DPU: u8 = 1;
/// `enum CDO_Type`: `CT_PRIMARY`.
pub const CT_PRIMARY: u8 = 1;

/// Why an xclbin was rejected. Offsets are file offsets unless the field says otherwise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AxlfError {
    /// A field lies (partly) past the end of the data holding it.
    #[error("truncated: {field} at offset {offset} needs {need} bytes but only {available} remain")]
    Truncated {
        /// The field.
        field: &'static str,
        /// Its offset.
        offset: usize,
        /// Bytes it needs.
        need: usize,
        /// Bytes available from `offset` (0 if past the end).
        available: usize,
    },
    /// The first 8 bytes are not `xclbin2\0`.
    #[error("bad magic {found:02x?} at offset 0 (expected \"xclbin2\\0\"): not an xclbin")]
    BadMagic {
        /// What was found (zero-padded if the file is shorter).
        found: [u8; 8],
    },
    /// `axlf_header.m_length` claims more bytes than the file has.
    #[error("axlf_header.m_length (offset 304) says {header} bytes but the file has {actual}")]
    LengthMismatch {
        /// `m_length`.
        header: u64,
        /// The file size.
        actual: usize,
    },
    /// A count field is beyond what the format allows or the data can hold.
    #[error("{field} at offset {offset} is {count}, more than the {max} that fit")]
    CountOverflow {
        /// The count field.
        field: &'static str,
        /// Its offset.
        offset: usize,
        /// The value.
        count: u64,
        /// The limit.
        max: u64,
    },
    /// A section's offset/size points outside the file.
    #[error(
        "section {index} ({kind}) at offset {offset} with size {size} is outside the file of {file_len} bytes"
    )]
    SectionOutOfRange {
        /// Index in the section table.
        index: usize,
        /// Its kind's name.
        kind: &'static str,
        /// `m_sectionOffset`.
        offset: u64,
        /// `m_sectionSize`.
        size: u64,
        /// File size.
        file_len: usize,
    },
    /// A section overlaps the header/section table or another section.
    #[error("section {index} at offset {offset} overlaps {other}")]
    SectionOverlap {
        /// Index of the section.
        index: usize,
        /// Its offset.
        offset: u64,
        /// What it overlaps ("the header and section table" or "section N").
        other: String,
    },
    /// An `array_offset` inside a section points outside it.
    #[error(
        "{field} (section offset {field_offset}) describes {count} x {elem} bytes at section offset \
         {offset}, outside the {section_len}-byte section"
    )]
    ArrayOutOfRange {
        /// The array field.
        field: &'static str,
        /// Offset of the `array_offset` field within the section.
        field_offset: usize,
        /// Element count.
        count: u32,
        /// Element size.
        elem: usize,
        /// Array offset within the section.
        offset: u32,
        /// Section size.
        section_len: usize,
    },
    /// A string offset points outside its section or the string has no terminator.
    #[error("{field} string at section offset {offset} is outside the section or unterminated")]
    BadString {
        /// The string field.
        field: &'static str,
        /// Its offset within the section.
        offset: usize,
    },
    /// A section the path needs is absent.
    #[error("no {0} section")]
    MissingSection(&'static str),
}

/// Bounds-checked little-endian reads from a byte slice whose position in the file is `base`
/// (so errors report file offsets).
#[derive(Clone, Copy)]
pub(crate) struct Reader<'a> {
    data: &'a [u8],
    base: usize,
}

impl<'a> Reader<'a> {
    fn new(data: &'a [u8], base: usize) -> Self {
        Self { data, base }
    }

    fn bytes(&self, field: &'static str, off: usize, len: usize) -> Result<&'a [u8], AxlfError> {
        off.checked_add(len)
            .and_then(|end| self.data.get(off..end))
            .ok_or(AxlfError::Truncated {
                field,
                offset: self.base.saturating_add(off),
                need: len,
                available: self.data.len().saturating_sub(off),
            })
    }

    fn array<const N: usize>(&self, field: &'static str, off: usize) -> Result<[u8; N], AxlfError> {
        let b = self.bytes(field, off, N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn u8(&self, field: &'static str, off: usize) -> Result<u8, AxlfError> {
        Ok(self.array::<1>(field, off)?[0])
    }

    fn u16(&self, field: &'static str, off: usize) -> Result<u16, AxlfError> {
        Ok(u16::from_le_bytes(self.array(field, off)?))
    }

    fn u32(&self, field: &'static str, off: usize) -> Result<u32, AxlfError> {
        Ok(u32::from_le_bytes(self.array(field, off)?))
    }

    fn u64(&self, field: &'static str, off: usize) -> Result<u64, AxlfError> {
        Ok(u64::from_le_bytes(self.array(field, off)?))
    }

    /// A fixed-size `char[N]` field up to its first NUL, lossily decoded.
    fn fixed_str(&self, field: &'static str, off: usize, len: usize) -> Result<String, AxlfError> {
        let b = self.bytes(field, off, len)?;
        let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        Ok(String::from_utf8_lossy(&b[..end]).into_owned())
    }

    /// A NUL-terminated string at `off` (an `mpo_*` offset from the section start).
    fn c_str(&self, field: &'static str, off: usize) -> Result<String, AxlfError> {
        let tail = self
            .data
            .get(off..)
            .ok_or(AxlfError::BadString { field, offset: off })?;
        let end = tail
            .iter()
            .position(|&c| c == 0)
            .ok_or(AxlfError::BadString { field, offset: off })?;
        Ok(String::from_utf8_lossy(&tail[..end]).into_owned())
    }

    /// An `array_offset` at `off`: checks `count * elem` bytes at its offset fit the data and
    /// returns (count, byte range within the data).
    fn array_offset(
        &self,
        field: &'static str,
        off: usize,
        elem: usize,
    ) -> Result<(usize, Range<usize>), AxlfError> {
        let count = self.u32(field, off)?;
        let offset = self.u32(field, off + 4)?;
        let out_of_range = AxlfError::ArrayOutOfRange {
            field,
            field_offset: off,
            count,
            elem,
            offset,
            section_len: self.data.len(),
        };
        let start = offset as usize;
        let end = (count as usize)
            .checked_mul(elem)
            .and_then(|n| n.checked_add(start));
        match end {
            Some(end) if end <= self.data.len() => Ok((count as usize, start..end)),
            _ => Err(out_of_range),
        }
    }
}

/// The fixed fields of `struct axlf_header` (plus the container's unique id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AxlfHeader {
    /// `m_length`: total file size the header declares.
    pub length: u64,
    /// `m_timeStamp`: seconds since the epoch.
    pub timestamp: u64,
    /// `(m_versionMajor, m_versionMinor, m_versionPatch)`.
    pub version: (u8, u8, u16),
    /// `m_mode` (`enum XCLBIN_MODE`).
    pub mode: u16,
    /// `m_actionMask`.
    pub action_mask: u16,
    /// `m_interface_uuid`.
    pub interface_uuid: [u8; 16],
    /// `m_platformVBNV` up to its NUL.
    pub platform_vbnv: String,
    /// `uuid`: the xclbin's identity.
    pub uuid: [u8; 16],
    /// `m_numSections`.
    pub num_sections: u32,
    /// `axlf.m_uniqueId`.
    pub unique_id: u64,
}

/// One `struct axlf_section_header`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionHeader {
    /// `m_sectionKind` (see [`kind`]).
    pub kind: u32,
    /// `m_sectionName` up to its NUL.
    pub name: String,
    /// `m_sectionOffset`: file offset of the data.
    pub offset: u64,
    /// `m_sectionSize`.
    pub size: u64,
}

impl SectionHeader {
    /// The section's bytes as a range of the file (already bounds-checked at parse time).
    fn range(&self) -> Range<usize> {
        // Both fit in usize: checked against the file length during parsing.
        self.offset as usize..(self.offset + self.size) as usize
    }
}

/// One `struct cdo_group` of a PDI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdoGroup {
    /// Its name (`mpo_name`).
    pub name: String,
    /// `cdo_type` (`enum CDO_Type`).
    pub cdo_type: u8,
    /// `pdi_id`.
    pub pdi_id: u64,
    /// `dpu_kernel_ids`: the kernels (IP_LAYOUT `m_kernel_id`) this group configures.
    pub kernel_ids: Vec<u64>,
    /// `pre_cdo_groups`.
    pub pre_cdo_groups: Vec<u32>,
}

/// One `struct aie_pdi`: a PDI image the firmware loads into the partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AiePdi {
    /// The PDI container's uuid.
    pub uuid: [u8; 16],
    /// Where the image lies in the file (see [`Xclbin::pdi_image`]).
    pub image: Range<usize>,
    /// Its CDO groups.
    pub cdo_groups: Vec<CdoGroup>,
}

/// The `AIE_PARTITION` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AiePartition {
    /// `schema_version`.
    pub schema_version: u8,
    /// Its name (`mpo_name`).
    pub name: String,
    /// `operations_per_cycle`: what XRT passes as the context's `max_opc`.
    pub ops_per_cycle: u32,
    /// `inference_fingerprint`.
    pub inference_fingerprint: u64,
    /// `pre_post_fingerprint`.
    pub pre_post_fingerprint: u64,
    /// `info.column_width`: columns the partition spans.
    pub column_width: u16,
    /// `info.start_columns`: columns the partition may start at.
    pub start_columns: Vec<u16>,
    /// `aie_pdi`: the PDIs.
    pub pdis: Vec<AiePdi>,
}

/// One `struct ip_data` of `IP_LAYOUT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpData {
    /// `m_type` (`enum IP_TYPE`; [`IP_PS_KERNEL`] for NPU kernels).
    pub ip_type: u32,
    /// `properties` (for PS kernels: subtype, functional and kernel id bit fields).
    pub properties: u32,
    /// `m_base_address`.
    pub base_address: u64,
    /// `m_name` up to its NUL, e.g. `MLIR_AIE:MLIRAIE` (kernel `:` compute unit).
    pub name: String,
}

impl IpData {
    /// The kernel part of the name (before `:`), e.g. `MLIR_AIE`.
    pub fn kernel_name(&self) -> &str {
        self.name.split(':').next().unwrap_or(&self.name)
    }

    /// `ps_kernel.m_subtype` (bits 0-1) for a PS kernel.
    pub fn subtype(&self) -> Option<u8> {
        (self.ip_type == IP_PS_KERNEL).then_some((self.properties & 0x3) as u8)
    }

    /// `ps_kernel.m_functional` (bits 4-5) for a PS kernel: the CU function XRT passes as
    /// `cu_func`; 0 (`FC_DPU`) otherwise.
    pub fn functional(&self) -> u8 {
        if self.ip_type == IP_PS_KERNEL {
            ((self.properties >> 4) & 0x3) as u8
        } else {
            0
        }
    }

    /// `ps_kernel.m_kernel_id` (bits 16-27) for a PS kernel: the id CDO groups list.
    pub fn kernel_id(&self) -> Option<u16> {
        (self.ip_type == IP_PS_KERNEL).then_some(((self.properties >> 16) & 0xfff) as u16)
    }

    /// Whether `name` names this IP: the full name or its kernel part.
    pub fn matches(&self, name: &str) -> bool {
        self.name == name || self.kernel_name() == name
    }
}

/// A parsed xclbin that owns its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xclbin {
    bytes: Vec<u8>,
    header: AxlfHeader,
    sections: Vec<SectionHeader>,
    aie_partition: Option<AiePartition>,
    ip_layout: Vec<IpData>,
}

impl Xclbin {
    /// Parses `bytes` (taking ownership). Never panics.
    pub fn parse(bytes: Vec<u8>) -> Result<Self, AxlfError> {
        let r = Reader::new(&bytes, 0);
        let magic_len = bytes.len().min(8);
        if bytes.get(..8) != Some(l::MAGIC.as_slice()) {
            let mut found = [0u8; 8];
            found[..magic_len].copy_from_slice(&bytes[..magic_len]);
            return Err(AxlfError::BadMagic { found });
        }
        let header = parse_header(&r)?;
        if header.length > bytes.len() as u64 {
            return Err(AxlfError::LengthMismatch {
                header: header.length,
                actual: bytes.len(),
            });
        }
        let sections = parse_sections(&r, header.num_sections)?;
        check_overlaps(&sections)?;

        let mut xclbin = Self {
            header,
            sections,
            aie_partition: None,
            ip_layout: Vec::new(),
            bytes: Vec::new(),
        };
        if let Some(s) = xclbin.sections.iter().find(|s| s.kind == kind::AIE_PARTITION) {
            let range = s.range();
            xclbin.aie_partition = Some(parse_aie_partition(Reader::new(
                &bytes[range.clone()],
                range.start,
            ))?);
        }
        if let Some(s) = xclbin.sections.iter().find(|s| s.kind == kind::IP_LAYOUT) {
            let range = s.range();
            xclbin.ip_layout = parse_ip_layout(Reader::new(&bytes[range.clone()], range.start))?;
        }
        xclbin.bytes = bytes;
        Ok(xclbin)
    }

    /// Parses a copy of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, AxlfError> {
        Self::parse(bytes.to_vec())
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The header.
    pub fn header(&self) -> &AxlfHeader {
        &self.header
    }

    /// The xclbin's uuid.
    pub fn uuid(&self) -> [u8; 16] {
        self.header.uuid
    }

    /// The section table.
    pub fn sections(&self) -> &[SectionHeader] {
        &self.sections
    }

    /// The data of the first section of `kind`.
    pub fn section(&self, kind: u32) -> Option<&[u8]> {
        let s = self.sections.iter().find(|s| s.kind == kind)?;
        self.bytes.get(s.range())
    }

    /// The `AIE_PARTITION` section, if any.
    pub fn aie_partition(&self) -> Option<&AiePartition> {
        self.aie_partition.as_ref()
    }

    /// The `IP_LAYOUT` entries (empty without that section).
    pub fn ip_layout(&self) -> &[IpData] {
        &self.ip_layout
    }

    /// The `IP_LAYOUT` names.
    pub fn kernel_names(&self) -> Vec<String> {
        self.ip_layout.iter().map(|ip| ip.name.clone()).collect()
    }

    /// The `IP_LAYOUT` entry naming `name` (full name or kernel part before `:`).
    pub fn kernel(&self, name: &str) -> Option<&IpData> {
        self.ip_layout.iter().find(|ip| ip.matches(name))
    }

    /// The bytes of a PDI image of this xclbin's partition.
    pub fn pdi_image(&self, pdi: &AiePdi) -> &[u8] {
        self.bytes.get(pdi.image.clone()).unwrap_or(&[])
    }

    /// The PDI that configures `kernel`: the one whose CDO groups list the kernel's id, or the
    /// only PDI of the partition.
    pub fn pdi_for(&self, kernel: &IpData) -> Result<&AiePdi, String> {
        let part = self
            .aie_partition
            .as_ref()
            .ok_or("the xclbin has no AIE_PARTITION section")?;
        if let Some(id) = kernel.kernel_id() {
            let by_id = part
                .pdis
                .iter()
                .find(|p| p.cdo_groups.iter().any(|g| g.kernel_ids.contains(&u64::from(id))));
            if let Some(p) = by_id {
                return Ok(p);
            }
        }
        match part.pdis.as_slice() {
            [only] => Ok(only),
            [] => Err("the AIE_PARTITION section holds no PDI".into()),
            many => Err(format!(
                "the AIE_PARTITION holds {} PDIs and none of their CDO groups lists kernel id {:?}",
                many.len(),
                kernel.kernel_id()
            )),
        }
    }
}

fn parse_header(r: &Reader<'_>) -> Result<AxlfHeader, AxlfError> {
    let h = l::AXLF_HEADER;
    Ok(AxlfHeader {
        length: r.u64("axlf_header.m_length", h + l::HDR_LENGTH)?,
        timestamp: r.u64("axlf_header.m_timeStamp", h + l::HDR_TIMESTAMP)?,
        version: (
            r.u8("axlf_header.m_versionMajor", h + l::HDR_VERSION_MAJOR)?,
            r.u8("axlf_header.m_versionMinor", h + l::HDR_VERSION_MINOR)?,
            r.u16("axlf_header.m_versionPatch", h + l::HDR_VERSION_PATCH)?,
        ),
        mode: r.u16("axlf_header.m_mode", h + l::HDR_MODE)?,
        action_mask: r.u16("axlf_header.m_actionMask", h + l::HDR_ACTION_MASK)?,
        interface_uuid: r.array("axlf_header.m_interface_uuid", h + l::HDR_INTERFACE_UUID)?,
        platform_vbnv: r.fixed_str("axlf_header.m_platformVBNV", h + l::HDR_PLATFORM_VBNV, 64)?,
        uuid: r.array("axlf_header.uuid", h + l::HDR_UUID)?,
        num_sections: r.u32("axlf_header.m_numSections", h + l::HDR_NUM_SECTIONS)?,
        unique_id: r.u64("axlf.m_uniqueId", l::AXLF_UNIQUE_ID)?,
    })
}

fn parse_sections(r: &Reader<'_>, count: u32) -> Result<Vec<SectionHeader>, AxlfError> {
    if count > l::MAX_NUM_SECTIONS {
        return Err(AxlfError::CountOverflow {
            field: "axlf_header.m_numSections",
            offset: l::AXLF_HEADER + l::HDR_NUM_SECTIONS,
            count: count.into(),
            max: l::MAX_NUM_SECTIONS.into(),
        });
    }
    let table_len = count as usize * l::SECTION_HEADER_SIZE;
    // Fails before allocating anything sized by `count`.
    r.bytes("axlf.m_sections", l::AXLF_SECTIONS, table_len)?;
    let file_len = r.data.len();
    let mut sections = Vec::with_capacity(count as usize);
    for index in 0..count as usize {
        let at = l::AXLF_SECTIONS + index * l::SECTION_HEADER_SIZE;
        let s = SectionHeader {
            kind: r.u32("axlf_section_header.m_sectionKind", at + l::SH_KIND)?,
            name: r.fixed_str("axlf_section_header.m_sectionName", at + l::SH_NAME, 16)?,
            offset: r.u64("axlf_section_header.m_sectionOffset", at + l::SH_OFFSET)?,
            size: r.u64("axlf_section_header.m_sectionSize", at + l::SH_SIZE)?,
        };
        let end = s.offset.checked_add(s.size);
        if end.is_none_or(|end| end > file_len as u64) {
            return Err(AxlfError::SectionOutOfRange {
                index,
                kind: kind::name(s.kind),
                offset: s.offset,
                size: s.size,
                file_len,
            });
        }
        sections.push(s);
    }
    Ok(sections)
}

fn check_overlaps(sections: &[SectionHeader]) -> Result<(), AxlfError> {
    let table_end = (l::AXLF_SECTIONS + sections.len() * l::SECTION_HEADER_SIZE) as u64;
    let mut spans: Vec<(u64, u64, usize)> = sections
        .iter()
        .enumerate()
        .filter(|(_, s)| s.size > 0)
        .map(|(i, s)| (s.offset, s.size, i))
        .collect();
    for &(offset, _, index) in &spans {
        if offset < table_end {
            return Err(AxlfError::SectionOverlap {
                index,
                offset,
                other: "the header and section table".into(),
            });
        }
    }
    spans.sort_unstable();
    for pair in spans.windows(2) {
        let (a_off, a_size, a_index) = pair[0];
        let (b_off, _, b_index) = pair[1];
        // a_off + a_size cannot overflow: checked against the file length.
        if b_off < a_off + a_size {
            return Err(AxlfError::SectionOverlap {
                index: b_index,
                offset: b_off,
                other: format!("section {a_index}"),
            });
        }
    }
    Ok(())
}

fn parse_aie_partition(r: Reader<'_>) -> Result<AiePartition, AxlfError> {
    r.bytes("aie_partition", 0, l::AIE_PARTITION_SIZE)?;
    let (_, start_cols) = r.array_offset("aie_partition.info.start_columns", l::AP_START_COLUMNS, 2)?;
    let start_columns = r.data[start_cols]
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    let (count, pdis_range) = r.array_offset("aie_partition.aie_pdi", l::AP_AIE_PDI, l::AIE_PDI_SIZE)?;
    let mut pdis = Vec::with_capacity(count);
    for i in 0..count {
        pdis.push(parse_pdi(&r, pdis_range.start + i * l::AIE_PDI_SIZE)?);
    }
    Ok(AiePartition {
        schema_version: r.u8("aie_partition.schema_version", l::AP_SCHEMA_VERSION)?,
        name: r.c_str(
            "aie_partition.mpo_name",
            r.u32("aie_partition.mpo_name", l::AP_MPO_NAME)? as usize,
        )?,
        ops_per_cycle: r.u32("aie_partition.operations_per_cycle", l::AP_OPS_PER_CYCLE)?,
        inference_fingerprint: r.u64("aie_partition.inference_fingerprint", l::AP_INFERENCE_FINGERPRINT)?,
        pre_post_fingerprint: r.u64("aie_partition.pre_post_fingerprint", l::AP_PRE_POST_FINGERPRINT)?,
        column_width: r.u16("aie_partition.info.column_width", l::AP_COLUMN_WIDTH)?,
        start_columns,
        pdis,
    })
}

fn parse_pdi(r: &Reader<'_>, at: usize) -> Result<AiePdi, AxlfError> {
    let uuid = r.array("aie_pdi.uuid", at + l::PDI_UUID)?;
    let (_, image) = r.array_offset("aie_pdi.pdi_image", at + l::PDI_IMAGE, 1)?;
    let (count, groups) = r.array_offset("aie_pdi.cdo_groups", at + l::PDI_CDO_GROUPS, l::CDO_GROUP_SIZE)?;
    let mut cdo_groups = Vec::with_capacity(count);
    for i in 0..count {
        cdo_groups.push(parse_cdo_group(r, groups.start + i * l::CDO_GROUP_SIZE)?);
    }
    // Section-relative range -> file range.
    let image = (r.base + image.start)..(r.base + image.end);
    Ok(AiePdi {
        uuid,
        image,
        cdo_groups,
    })
}

fn parse_cdo_group(r: &Reader<'_>, at: usize) -> Result<CdoGroup, AxlfError> {
    let name_off = r.u32("cdo_group.mpo_name", at + l::CDO_MPO_NAME)? as usize;
    let (_, ids) = r.array_offset("cdo_group.dpu_kernel_ids", at + l::CDO_DPU_KERNEL_IDS, 8)?;
    let (_, pre) = r.array_offset("cdo_group.pre_cdo_groups", at + l::CDO_PRE_CDO_GROUPS, 4)?;
    Ok(CdoGroup {
        name: r.c_str("cdo_group.mpo_name", name_off)?,
        cdo_type: r.u8("cdo_group.cdo_type", at + l::CDO_TYPE)?,
        pdi_id: r.u64("cdo_group.pdi_id", at + l::CDO_PDI_ID)?,
        kernel_ids: r.data[ids]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
        pre_cdo_groups: r.data[pre]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    })
}

fn parse_ip_layout(r: Reader<'_>) -> Result<Vec<IpData>, AxlfError> {
    let raw = r.u32("ip_layout.m_count", l::IPL_COUNT)?;
    let room = r.data.len().saturating_sub(l::IPL_DATA) / l::IP_DATA_SIZE;
    // m_count is an int32_t: a negative value reads as > i32::MAX here and fails the check.
    if raw as usize > room || raw > i32::MAX as u32 {
        return Err(AxlfError::CountOverflow {
            field: "ip_layout.m_count",
            offset: r.base + l::IPL_COUNT,
            count: raw.into(),
            max: room as u64,
        });
    }
    (0..raw as usize)
        .map(|i| {
            let at = l::IPL_DATA + i * l::IP_DATA_SIZE;
            Ok(IpData {
                ip_type: r.u32("ip_data.m_type", at + l::IP_TYPE)?,
                properties: r.u32("ip_data.properties", at + l::IP_PROPERTIES)?,
                base_address: r.u64("ip_data.m_base_address", at + l::IP_BASE_ADDRESS)?,
                name: r.fixed_str("ip_data.m_name", at + l::IP_NAME, l::IP_NAME_LEN)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
