use super::*;

fn sample() -> Vec<u8> {
    AxlfBuilder::new()
        .uuid([7; 16])
        .timestamp(1_700_000_000)
        .aie_partition(&AiePartitionSpec {
            name: "QoS".into(),
            ops_per_cycle: 4096,
            column_width: 4,
            start_columns: vec![0, 4],
            pdis: vec![
                PdiSpec {
                    uuid: [1; 16],
                    image: vec![0xA1; 100],
                    kernel_ids: vec![0x901],
                },
                PdiSpec {
                    uuid: [2; 16],
                    image: vec![0xB2; 33],
                    kernel_ids: vec![0x902, 0x903],
                },
            ],
        })
        .ip_layout(&[
            IpKernelSpec {
                name: "MLIR_AIE:MLIRAIE".into(),
                kernel_id: 0x901,
                functional: 0,
            },
            IpKernelSpec {
                name: "OTHER:CU1".into(),
                kernel_id: 0x903,
                functional: 1,
            },
        ])
        .section(kind::EMBEDDED_METADATA, "meta", b"<project/>".to_vec())
        .build()
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn section_header_at(i: usize) -> usize {
    l::AXLF_SECTIONS + i * l::SECTION_HEADER_SIZE
}

#[test]
fn builder_round_trip() {
    let bytes = sample();
    let x = Xclbin::parse(bytes.clone()).expect("valid");
    assert_eq!(x.bytes(), &bytes[..]);
    assert_eq!(x.header().length, bytes.len() as u64);
    assert_eq!(x.header().timestamp, 1_700_000_000);
    assert_eq!(x.header().version, (2, 0, 0));
    assert_eq!(x.uuid(), [7; 16]);
    assert_eq!(x.header().num_sections, 3);
    assert_eq!(x.sections().len(), 3);
    assert_eq!(x.sections()[0].kind, kind::AIE_PARTITION);
    assert_eq!(x.sections()[0].name, "aie_partition");
    assert_eq!(x.sections()[0].offset % 8, 0);
    assert_eq!(x.section(kind::EMBEDDED_METADATA), Some(&b"<project/>"[..]));

    let p = x.aie_partition().expect("partition");
    assert_eq!(p.name, "QoS");
    assert_eq!(p.ops_per_cycle, 4096);
    assert_eq!(p.column_width, 4);
    assert_eq!(p.start_columns, vec![0, 4]);
    assert_eq!(p.pdis.len(), 2);
    assert_eq!(p.pdis[0].uuid, [1; 16]);
    assert_eq!(x.pdi_image(&p.pdis[0]), &[0xA1; 100][..]);
    assert_eq!(x.pdi_image(&p.pdis[1]), &[0xB2; 33][..]);
    assert_eq!(p.pdis[1].cdo_groups[0].kernel_ids, vec![0x902, 0x903]);
    assert_eq!(p.pdis[1].cdo_groups[0].name, "DPU");
    assert_eq!(p.pdis[1].cdo_groups[0].cdo_type, CT_PRIMARY);

    assert_eq!(
        x.kernel_names(),
        vec!["MLIR_AIE:MLIRAIE".to_string(), "OTHER:CU1".to_string()]
    );
    let k = x.kernel("MLIR_AIE").expect("by kernel part");
    assert_eq!(k.kernel_id(), Some(0x901));
    assert_eq!(k.subtype(), Some(ST_DPU));
    assert_eq!(x.kernel("OTHER:CU1").map(IpData::functional), Some(1));
    assert!(x.kernel("MISSING").is_none());
    // PDI selection by the CDO group's kernel ids.
    assert_eq!(x.pdi_for(k).map(|p| p.uuid), Ok([1; 16]));
    assert_eq!(
        x.pdi_for(x.kernel("OTHER").expect("other")).map(|p| p.uuid),
        Ok([2; 16])
    );
}

#[test]
fn mlir_aie_shortcut_and_empty_file() {
    let x = Xclbin::parse(AxlfBuilder::mlir_aie("MLIR_AIE", 1, &[9; 16]).build()).expect("valid");
    let k = x.kernel("MLIR_AIE").expect("kernel");
    let pdi = x.pdi_for(k).expect("pdi");
    assert_eq!(x.pdi_image(pdi), &[9; 16][..]);

    let empty = Xclbin::parse(AxlfBuilder::new().build()).expect("no sections is valid");
    assert!(empty.aie_partition().is_none());
    assert!(empty.ip_layout().is_empty());
    assert_eq!(empty.bytes().len(), l::AXLF_SECTIONS);
}

#[test]
fn bad_magic() {
    let mut b = sample();
    b[6] = b'1';
    match Xclbin::parse(b) {
        Err(AxlfError::BadMagic { found }) => assert_eq!(&found, b"xclbin1\0"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        Xclbin::parse(b"xcl".to_vec()),
        Err(AxlfError::BadMagic { .. })
    ));
    assert!(matches!(
        Xclbin::parse(Vec::new()),
        Err(AxlfError::BadMagic { .. })
    ));
}

#[test]
fn truncated_header_names_the_field() {
    let b = sample();
    let err = Xclbin::parse(b[..100].to_vec()).unwrap_err();
    assert_eq!(
        err,
        AxlfError::Truncated {
            field: "axlf_header.m_length",
            offset: 304,
            need: 8,
            available: 0
        }
    );
    assert!(
        err.to_string().contains("axlf_header.m_length at offset 304"),
        "{err}"
    );
}

#[test]
fn truncated_file_is_a_length_mismatch() {
    let b = sample();
    let cut = b.len() - 1;
    assert_eq!(
        Xclbin::parse(b[..cut].to_vec()),
        Err(AxlfError::LengthMismatch {
            header: b.len() as u64,
            actual: cut
        })
    );
}

#[test]
fn truncation_at_every_length_is_an_error_never_a_panic() {
    let b = sample();
    for len in 0..b.len() {
        assert!(
            Xclbin::parse(b[..len].to_vec()).is_err(),
            "accepted a file cut at {len}"
        );
    }
    assert!(Xclbin::parse(b).is_ok());
}

#[test]
fn every_single_byte_corruption_parses_or_errors() {
    // Flip each header/table byte and every 7th data byte: any result but a panic is fine.
    let b = sample();
    for i in (0..b.len()).filter(|i| *i < 600 || i % 7 == 0) {
        for v in [0x00u8, 0xff, 0x80] {
            let mut c = b.clone();
            c[i] = v;
            let _ = Xclbin::parse(c);
        }
    }
}

#[test]
fn huge_section_count() {
    let mut b = sample();
    put_u32(&mut b, l::AXLF_HEADER + l::HDR_NUM_SECTIONS, u32::MAX);
    assert_eq!(
        Xclbin::parse(b.clone()),
        Err(AxlfError::CountOverflow {
            field: "axlf_header.m_numSections",
            offset: 448,
            count: u32::MAX as u64,
            max: 0x10000
        })
    );
    // Within the format's limit but beyond the file: the table is truncated.
    put_u32(&mut b, l::AXLF_HEADER + l::HDR_NUM_SECTIONS, 0x10000);
    assert!(matches!(
        Xclbin::parse(b),
        Err(AxlfError::Truncated {
            field: "axlf.m_sections",
            offset: 456,
            ..
        })
    ));
}

#[test]
fn section_out_of_range() {
    let mut b = sample();
    put_u64(&mut b, section_header_at(1) + l::SH_SIZE, 1 << 40);
    match Xclbin::parse(b.clone()) {
        Err(AxlfError::SectionOutOfRange {
            index: 1,
            kind: "IP_LAYOUT",
            size,
            ..
        }) => assert_eq!(size, 1 << 40),
        other => panic!("{other:?}"),
    }
    // offset + size overflowing u64 is out of range too.
    put_u64(&mut b, section_header_at(1) + l::SH_OFFSET, u64::MAX);
    assert!(matches!(
        Xclbin::parse(b),
        Err(AxlfError::SectionOutOfRange { index: 1, .. })
    ));
}

#[test]
fn overlapping_sections() {
    let b = sample();
    let x = Xclbin::parse(b.clone()).expect("valid");
    let first = x.sections()[0].offset;
    let mut c = b.clone();
    put_u64(&mut c, section_header_at(2) + l::SH_OFFSET, first + 8);
    assert_eq!(
        Xclbin::parse(c),
        Err(AxlfError::SectionOverlap {
            index: 2,
            offset: first + 8,
            other: "section 0".into()
        })
    );
    let mut d = b;
    put_u64(&mut d, section_header_at(0) + l::SH_OFFSET, 0);
    assert!(matches!(
        Xclbin::parse(d),
        Err(AxlfError::SectionOverlap {
            index: 0,
            offset: 0,
            ..
        })
    ));
}

#[test]
fn partition_arrays_are_bounds_checked() {
    let b = sample();
    let x = Xclbin::parse(b.clone()).expect("valid");
    let sec = x.sections()[0].offset as usize;

    // PDI count far beyond the section.
    let mut c = b.clone();
    put_u32(&mut c, sec + l::AP_AIE_PDI, u32::MAX);
    match Xclbin::parse(c) {
        Err(AxlfError::ArrayOutOfRange {
            field: "aie_partition.aie_pdi",
            field_offset: 120,
            count,
            ..
        }) => {
            assert_eq!(count, u32::MAX)
        }
        other => panic!("{other:?}"),
    }

    // A PDI image offset past the section end.
    let pdis = u32::from_le_bytes(
        b[sec + l::AP_AIE_PDI + 4..sec + l::AP_AIE_PDI + 8]
            .try_into()
            .unwrap(),
    );
    let mut d = b.clone();
    put_u32(&mut d, sec + pdis as usize + l::PDI_IMAGE + 4, 0x7fff_ffff);
    assert!(matches!(
        Xclbin::parse(d),
        Err(AxlfError::ArrayOutOfRange {
            field: "aie_pdi.pdi_image",
            ..
        })
    ));

    // The partition name's string offset outside the section.
    let mut e = b;
    put_u32(&mut e, sec + l::AP_MPO_NAME, 0xffff_fff0);
    assert_eq!(
        Xclbin::parse(e),
        Err(AxlfError::BadString {
            field: "aie_partition.mpo_name",
            offset: 0xffff_fff0
        })
    );
}

#[test]
fn ip_layout_count_is_checked() {
    let b = sample();
    let x = Xclbin::parse(b.clone()).expect("valid");
    let sec = x.sections()[1].offset as usize;
    for bad in [3u32, u32::MAX, 0x8000_0000] {
        let mut c = b.clone();
        put_u32(&mut c, sec + l::IPL_COUNT, bad);
        match Xclbin::parse(c) {
            Err(AxlfError::CountOverflow {
                field: "ip_layout.m_count",
                count,
                max: 2,
                ..
            }) => {
                assert_eq!(count, u64::from(bad))
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn pdi_choice_without_a_matching_id() {
    let b = AxlfBuilder::new()
        .aie_partition(&AiePartitionSpec {
            column_width: 1,
            pdis: vec![
                PdiSpec {
                    image: vec![1],
                    kernel_ids: vec![1],
                    ..Default::default()
                },
                PdiSpec {
                    image: vec![2],
                    kernel_ids: vec![2],
                    ..Default::default()
                },
            ],
            ..Default::default()
        })
        .ip_layout(&[IpKernelSpec {
            name: "K".into(),
            kernel_id: 7,
            functional: 0,
        }])
        .build();
    let x = Xclbin::parse(b).expect("valid");
    let err = x.pdi_for(x.kernel("K").expect("k")).unwrap_err();
    assert!(err.contains("2 PDIs"), "{err}");
}
