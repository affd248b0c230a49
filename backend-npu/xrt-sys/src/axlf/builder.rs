//! [`AxlfBuilder`]: writes valid synthetic xclbins (for tandem's and the backend's tests).

use super::layout as l;
use super::{kind, CT_PRIMARY, IP_PS_KERNEL, ST_DPU};

/// One PDI of an [`AiePartitionSpec`], with one CDO group listing `kernel_ids`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PdiSpec {
    /// The PDI's uuid.
    pub uuid: [u8; 16],
    /// The PDI image bytes.
    pub image: Vec<u8>,
    /// Kernel ids (IP_LAYOUT `m_kernel_id`) of the PDI's single CDO group.
    pub kernel_ids: Vec<u64>,
}

/// The content of an `AIE_PARTITION` section.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AiePartitionSpec {
    /// Partition name.
    pub name: String,
    /// `operations_per_cycle`.
    pub ops_per_cycle: u32,
    /// `info.column_width`.
    pub column_width: u16,
    /// `info.start_columns`.
    pub start_columns: Vec<u16>,
    /// The PDIs.
    pub pdis: Vec<PdiSpec>,
}

/// One PS (DPU) kernel of an `IP_LAYOUT` section.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpKernelSpec {
    /// `m_name` (at most 63 bytes are kept), e.g. `MLIR_AIE:MLIRAIE`.
    pub name: String,
    /// `ps_kernel.m_kernel_id` (12 bits).
    pub kernel_id: u16,
    /// `ps_kernel.m_functional` (2 bits; 0 = DPU).
    pub functional: u8,
}

/// Writes an xclbin: the `xclbin2\0` container header, a section table and the sections'
/// data, each 8-byte aligned, laid out as xclbinutil does. The result parses with
/// [`super::Xclbin::parse`].
///
/// ```
/// use xrt_sys::axlf::{AxlfBuilder, Xclbin};
/// let bytes = AxlfBuilder::mlir_aie("MLIR_AIE", 4, &[0xAA; 64]).build();
/// let xclbin = Xclbin::parse(bytes).unwrap();
/// assert_eq!(xclbin.aie_partition().unwrap().column_width, 4);
/// assert!(xclbin.kernel("MLIR_AIE").is_some());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AxlfBuilder {
    uuid: [u8; 16],
    timestamp: u64,
    sections: Vec<(u32, String, Vec<u8>)>,
}

impl AxlfBuilder {
    /// An empty xclbin (no sections).
    pub fn new() -> Self {
        Self::default()
    }

    /// An xclbin as mlir-aie's aiecc produces for one kernel: an `AIE_PARTITION` of `columns`
    /// columns with one PDI for kernel id 0x901 and an `IP_LAYOUT` naming `kernel:MLIRAIE`.
    pub fn mlir_aie(kernel: &str, columns: u16, pdi: &[u8]) -> Self {
        Self::new()
            .uuid([0x5a; 16])
            .aie_partition(&AiePartitionSpec {
                name: "QoS".into(),
                ops_per_cycle: 2048,
                column_width: columns,
                start_columns: vec![0],
                pdis: vec![PdiSpec {
                    uuid: [0x11; 16],
                    image: pdi.to_vec(),
                    kernel_ids: vec![0x901],
                }],
            })
            .ip_layout(&[IpKernelSpec {
                name: format!("{kernel}:MLIRAIE"),
                kernel_id: 0x901,
                functional: 0,
            }])
    }

    /// Sets the xclbin's uuid.
    pub fn uuid(mut self, uuid: [u8; 16]) -> Self {
        self.uuid = uuid;
        self
    }

    /// Sets `m_timeStamp`.
    pub fn timestamp(mut self, timestamp: u64) -> Self {
        self.timestamp = timestamp;
        self
    }

    /// Appends a raw section (`name` keeps at most 15 bytes).
    pub fn section(mut self, kind: u32, name: &str, data: Vec<u8>) -> Self {
        self.sections.push((kind, name.to_owned(), data));
        self
    }

    /// Appends an `AIE_PARTITION` section encoding `spec`.
    pub fn aie_partition(self, spec: &AiePartitionSpec) -> Self {
        let data = encode_aie_partition(spec);
        self.section(kind::AIE_PARTITION, "aie_partition", data)
    }

    /// Appends an `IP_LAYOUT` section of PS (DPU) kernels.
    pub fn ip_layout(self, kernels: &[IpKernelSpec]) -> Self {
        let mut data = vec![0u8; l::IPL_DATA + kernels.len() * l::IP_DATA_SIZE];
        put_u32(&mut data, l::IPL_COUNT, kernels.len() as u32);
        for (i, k) in kernels.iter().enumerate() {
            let at = l::IPL_DATA + i * l::IP_DATA_SIZE;
            let props = u32::from(ST_DPU)
                | (u32::from(k.functional & 0x3) << 4)
                | (u32::from(k.kernel_id & 0xfff) << 16);
            put_u32(&mut data, at + l::IP_TYPE, IP_PS_KERNEL);
            put_u32(&mut data, at + l::IP_PROPERTIES, props);
            put_str(&mut data, at + l::IP_NAME, &k.name, l::IP_NAME_LEN - 1);
        }
        self.section(kind::IP_LAYOUT, "ip_layout", data)
    }

    /// The file bytes.
    pub fn build(&self) -> Vec<u8> {
        let table_end = l::AXLF_SECTIONS + self.sections.len() * l::SECTION_HEADER_SIZE;
        let mut out = vec![0u8; align8(table_end)];
        out[..8].copy_from_slice(l::MAGIC);
        out[l::AXLF_SIGNATURE_LENGTH..l::AXLF_SIGNATURE_LENGTH + 4].copy_from_slice(&(-1i32).to_le_bytes());
        out[l::AXLF_RESERVED..l::AXLF_UNIQUE_ID].fill(0xff);
        let h = l::AXLF_HEADER;
        put_u64(&mut out, h + l::HDR_TIMESTAMP, self.timestamp);
        out[h + l::HDR_VERSION_MAJOR] = 2;
        out[h + l::HDR_UUID..h + l::HDR_UUID + 16].copy_from_slice(&self.uuid);
        put_u32(&mut out, h + l::HDR_NUM_SECTIONS, self.sections.len() as u32);
        for (i, (kind, name, data)) in self.sections.iter().enumerate() {
            let offset = out.len();
            out.extend_from_slice(data);
            out.resize(align8(out.len()), 0);
            let at = l::AXLF_SECTIONS + i * l::SECTION_HEADER_SIZE;
            put_u32(&mut out, at + l::SH_KIND, *kind);
            put_str(&mut out, at + l::SH_NAME, name, 15);
            put_u64(&mut out, at + l::SH_OFFSET, offset as u64);
            put_u64(&mut out, at + l::SH_SIZE, data.len() as u64);
        }
        let len = out.len() as u64;
        put_u64(&mut out, h + l::HDR_LENGTH, len);
        out
    }
}

/// Lays out `aie_partition`, then the start columns, the `aie_pdi` array, each PDI's
/// `cdo_group` array, kernel ids, strings and images, all offsets relative to the section.
fn encode_aie_partition(spec: &AiePartitionSpec) -> Vec<u8> {
    let mut s = vec![0u8; l::AIE_PARTITION_SIZE];
    let name_off = push_cstr(&mut s, &spec.name);
    put_u32(&mut s, l::AP_MPO_NAME, name_off);
    put_u32(&mut s, l::AP_OPS_PER_CYCLE, spec.ops_per_cycle);
    put_u16(&mut s, l::AP_COLUMN_WIDTH, spec.column_width);
    let cols_off = pad8(&mut s);
    for c in &spec.start_columns {
        s.extend_from_slice(&c.to_le_bytes());
    }
    put_array(&mut s, l::AP_START_COLUMNS, spec.start_columns.len(), cols_off);
    let commit_off = push_cstr(&mut s, "");
    put_u32(&mut s, l::AP_KERNEL_COMMIT_ID, commit_off);

    let pdis_off = pad8(&mut s);
    s.resize(pdis_off as usize + spec.pdis.len() * l::AIE_PDI_SIZE, 0);
    put_array(&mut s, l::AP_AIE_PDI, spec.pdis.len(), pdis_off);
    for (i, pdi) in spec.pdis.iter().enumerate() {
        let at = pdis_off as usize + i * l::AIE_PDI_SIZE;
        s[at + l::PDI_UUID..at + l::PDI_UUID + 16].copy_from_slice(&pdi.uuid);

        let group_off = pad8(&mut s);
        s.resize(group_off as usize + l::CDO_GROUP_SIZE, 0);
        put_array(&mut s, at + l::PDI_CDO_GROUPS, 1, group_off);
        let g = group_off as usize;
        s[g + l::CDO_TYPE] = CT_PRIMARY;
        put_u64(&mut s, g + l::CDO_PDI_ID, i as u64);
        let ids_off = pad8(&mut s);
        for id in &pdi.kernel_ids {
            s.extend_from_slice(&id.to_le_bytes());
        }
        put_array(&mut s, g + l::CDO_DPU_KERNEL_IDS, pdi.kernel_ids.len(), ids_off);
        put_array(&mut s, g + l::CDO_PRE_CDO_GROUPS, 0, ids_off);
        let gname = push_cstr(&mut s, "DPU");
        put_u32(&mut s, g + l::CDO_MPO_NAME, gname);

        let image_off = pad8(&mut s);
        s.extend_from_slice(&pdi.image);
        put_array(&mut s, at + l::PDI_IMAGE, pdi.image.len(), image_off);
    }
    s
}

fn align8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// Pads `s` to 8 bytes and returns the new end as a section offset.
fn pad8(s: &mut Vec<u8>) -> u32 {
    s.resize(align8(s.len()), 0);
    s.len() as u32
}

fn push_cstr(s: &mut Vec<u8>, text: &str) -> u32 {
    let off = s.len() as u32;
    s.extend_from_slice(text.as_bytes());
    s.push(0);
    off
}

fn put_array(s: &mut [u8], at: usize, count: usize, offset: u32) {
    put_u32(s, at, count as u32);
    put_u32(s, at + 4, offset);
}

fn put_u16(s: &mut [u8], at: usize, v: u16) {
    s[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(s: &mut [u8], at: usize, v: u32) {
    s[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(s: &mut [u8], at: usize, v: u64) {
    s[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn put_str(s: &mut [u8], at: usize, text: &str, max: usize) {
    let b = &text.as_bytes()[..text.len().min(max)];
    s[at..at + b.len()].copy_from_slice(b);
}
