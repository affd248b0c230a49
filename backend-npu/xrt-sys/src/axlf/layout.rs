//! Byte offsets and sizes of the AXLF structures, from XRT's `xrt/detail/xclbin.h`.
//!
//! Computed from the C definitions with natural alignment (the header asserts the totals with
//! `XCLBIN_STATIC_ASSERT`, which the tests below repeat).

/// `axlf.m_magic`: the file's first 8 bytes.
pub const MAGIC: &[u8; 8] = b"xclbin2\0";

/// `struct axlf`: `m_magic[8]`.
pub const AXLF_MAGIC: usize = 0;
/// `axlf.m_signature_length` (`int32_t`, -1 = unsigned).
pub const AXLF_SIGNATURE_LENGTH: usize = 8;
/// `axlf.reserved[28]` (0xFF-filled by xclbinutil).
pub const AXLF_RESERVED: usize = 12;
/// `axlf.m_keyBlock[256]`.
pub const AXLF_KEY_BLOCK: usize = 40;
/// `axlf.m_uniqueId` (`uint64_t`).
pub const AXLF_UNIQUE_ID: usize = 296;
/// `axlf.m_header` (`struct axlf_header`, 152 bytes).
pub const AXLF_HEADER: usize = 304;
/// `axlf.m_sections[]`: the section header table.
pub const AXLF_SECTIONS: usize = AXLF_HEADER + AXLF_HEADER_SIZE;

/// `sizeof(struct axlf_header)`.
pub const AXLF_HEADER_SIZE: usize = 152;
/// `axlf_header.m_length` (`uint64_t`): total file size.
pub const HDR_LENGTH: usize = 0;
/// `axlf_header.m_timeStamp`.
pub const HDR_TIMESTAMP: usize = 8;
/// `axlf_header.m_featureRomTimeStamp`.
pub const HDR_FEATURE_ROM_TIMESTAMP: usize = 16;
/// `axlf_header.m_versionPatch` (`uint16_t`).
pub const HDR_VERSION_PATCH: usize = 24;
/// `axlf_header.m_versionMajor` (`uint8_t`).
pub const HDR_VERSION_MAJOR: usize = 26;
/// `axlf_header.m_versionMinor` (`uint8_t`).
pub const HDR_VERSION_MINOR: usize = 27;
/// `axlf_header.m_mode` (`uint16_t`).
pub const HDR_MODE: usize = 28;
/// `axlf_header.m_actionMask` (`uint16_t`).
pub const HDR_ACTION_MASK: usize = 30;
/// `axlf_header.m_interface_uuid[16]`.
pub const HDR_INTERFACE_UUID: usize = 32;
/// `axlf_header.m_platformVBNV[64]`.
pub const HDR_PLATFORM_VBNV: usize = 48;
/// `axlf_header.uuid` (union with `m_next_axlf[16]`).
pub const HDR_UUID: usize = 112;
/// `axlf_header.m_debug_bin[16]`.
pub const HDR_DEBUG_BIN: usize = 128;
/// `axlf_header.m_numSections` (`uint32_t`), followed by 4 bytes of padding.
pub const HDR_NUM_SECTIONS: usize = 144;
/// `XCLBIN_MAX_NUM_SECTION`.
pub const MAX_NUM_SECTIONS: u32 = 0x10000;

/// `sizeof(struct axlf_section_header)`.
pub const SECTION_HEADER_SIZE: usize = 40;
/// `axlf_section_header.m_sectionKind` (`uint32_t`).
pub const SH_KIND: usize = 0;
/// `axlf_section_header.m_sectionName[16]`.
pub const SH_NAME: usize = 4;
/// `axlf_section_header.m_sectionOffset` (`uint64_t`, after 4 bytes of padding).
pub const SH_OFFSET: usize = 24;
/// `axlf_section_header.m_sectionSize` (`uint64_t`).
pub const SH_SIZE: usize = 32;

/// `sizeof(struct array_offset)`: `{ uint32_t size; uint32_t offset; }`, offset from the
/// start of the section.
pub const ARRAY_OFFSET_SIZE: usize = 8;

/// `sizeof(struct aie_partition)`.
pub const AIE_PARTITION_SIZE: usize = 184;
/// `aie_partition.schema_version` (`uint8_t`).
pub const AP_SCHEMA_VERSION: usize = 0;
/// `aie_partition.mpo_name` (`uint32_t` offset of a NUL-terminated string).
pub const AP_MPO_NAME: usize = 4;
/// `aie_partition.operations_per_cycle` (`uint32_t`).
pub const AP_OPS_PER_CYCLE: usize = 8;
/// `aie_partition.inference_fingerprint` (`uint64_t`).
pub const AP_INFERENCE_FINGERPRINT: usize = 16;
/// `aie_partition.pre_post_fingerprint` (`uint64_t`).
pub const AP_PRE_POST_FINGERPRINT: usize = 24;
/// `aie_partition.info` (`struct aie_partition_info`, 88 bytes).
pub const AP_INFO: usize = 32;
/// `aie_partition.info.column_width` (`uint16_t`).
pub const AP_COLUMN_WIDTH: usize = AP_INFO;
/// `aie_partition.info.start_columns` (`array_offset` of `uint16_t`).
pub const AP_START_COLUMNS: usize = AP_INFO + 8;
/// `aie_partition.aie_pdi` (`array_offset` of `struct aie_pdi`).
pub const AP_AIE_PDI: usize = 120;
/// `aie_partition.kernel_commit_id` (`uint32_t` string offset).
pub const AP_KERNEL_COMMIT_ID: usize = 128;
/// `sizeof(struct aie_partition_info)`.
pub const AIE_PARTITION_INFO_SIZE: usize = 88;

/// `sizeof(struct aie_pdi)`.
pub const AIE_PDI_SIZE: usize = 96;
/// `aie_pdi.uuid[16]`.
pub const PDI_UUID: usize = 0;
/// `aie_pdi.pdi_image` (`array_offset` of bytes).
pub const PDI_IMAGE: usize = 16;
/// `aie_pdi.cdo_groups` (`array_offset` of `struct cdo_group`).
pub const PDI_CDO_GROUPS: usize = 24;

/// `sizeof(struct cdo_group)`.
pub const CDO_GROUP_SIZE: usize = 96;
/// `cdo_group.mpo_name`.
pub const CDO_MPO_NAME: usize = 0;
/// `cdo_group.cdo_type` (`uint8_t`).
pub const CDO_TYPE: usize = 4;
/// `cdo_group.pdi_id` (`uint64_t`).
pub const CDO_PDI_ID: usize = 8;
/// `cdo_group.dpu_kernel_ids` (`array_offset` of `uint64_t`).
pub const CDO_DPU_KERNEL_IDS: usize = 16;
/// `cdo_group.pre_cdo_groups` (`array_offset` of `uint32_t`).
pub const CDO_PRE_CDO_GROUPS: usize = 24;

/// `ip_layout.m_count` (`int32_t`), then 4 bytes of padding.
pub const IPL_COUNT: usize = 0;
/// `ip_layout.m_ip_data[]`.
pub const IPL_DATA: usize = 8;
/// `sizeof(struct ip_data)`.
pub const IP_DATA_SIZE: usize = 80;
/// `ip_data.m_type` (`uint32_t`, `enum IP_TYPE`).
pub const IP_TYPE: usize = 0;
/// `ip_data.properties` (`uint32_t`; for `IP_PS_KERNEL`: subtype:2, :2, functional:2, :10,
/// kernel_id:12, :4).
pub const IP_PROPERTIES: usize = 4;
/// `ip_data.m_base_address` (`uint64_t`).
pub const IP_BASE_ADDRESS: usize = 8;
/// `ip_data.m_name[64]`.
pub const IP_NAME: usize = 16;
/// Length of `ip_data.m_name`.
pub const IP_NAME_LEN: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_match_the_static_asserts_of_xclbin_h() {
        assert_eq!(AXLF_HEADER_SIZE, 152);
        assert_eq!(AXLF_SECTIONS, 456);
        assert_eq!(AXLF_HEADER + HDR_NUM_SECTIONS, 448);
        assert_eq!(SECTION_HEADER_SIZE, 40);
        assert_eq!(AIE_PARTITION_SIZE, 184);
        assert_eq!(AP_INFO + AIE_PARTITION_INFO_SIZE, AP_AIE_PDI);
        assert_eq!(AP_KERNEL_COMMIT_ID + 4 + 52, AIE_PARTITION_SIZE);
        assert_eq!(PDI_CDO_GROUPS + ARRAY_OFFSET_SIZE + 64, AIE_PDI_SIZE);
        assert_eq!(CDO_PRE_CDO_GROUPS + ARRAY_OFFSET_SIZE + 64, CDO_GROUP_SIZE);
        assert_eq!(IP_NAME + IP_NAME_LEN, IP_DATA_SIZE);
        // axlf: magic 8 + signature 4 + reserved 28 + key block 256 = 296, unique id 8.
        assert_eq!(AXLF_KEY_BLOCK + 256, AXLF_UNIQUE_ID);
        assert_eq!(AXLF_RESERVED + 28, AXLF_KEY_BLOCK);
    }
}
