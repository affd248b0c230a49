//! The Vulkan plugin beyond the conformance cases: every weight format its kernels decode, in
//! matmuls (decode and batch shapes, fused splits) and embeddings, against the CPU reference;
//! formats it does not decode are refused by name; a device that does not exist is a clear
//! `Unavailable`. The backend runs with the Khronos validation layer on (any message fails).
//!
//! Without a Vulkan device (no loader, no lavapipe) these tests say so and pass, except under CI
//! (`CI` set), where the backend must be available.

use half::{bf16, f16};
use tandem_backend_api::{
    BackendError, BackendOptions, ComputeBackend, DType, GraphBuilder, Op, StepArgs, Support, TensorDesc,
    Usage, WeightRef,
};
use tandem_conformance::{assert_close, discover, options_for, Rng};

/// Every weight format the Vulkan kernels decode.
const WEIGHT_FORMATS: [DType; 10] = [
    DType::F32,
    DType::F16,
    DType::Bf16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q4K,
    DType::Q6K,
];

fn vulkan() -> Option<Box<dyn ComputeBackend>> {
    vulkan_with(options_for("vulkan"))
}

fn vulkan_with(options: tandem_backend_api::BackendOptions) -> Option<Box<dyn ComputeBackend>> {
    match discover().create("vulkan", &options) {
        Ok(b) => Some(b),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipping: the Vulkan backend is unavailable here: {e}");
            None
        }
        Err(e) => panic!("CI must run the Vulkan backend (lavapipe): {e}"),
    }
}

fn cpu() -> Box<dyn ComputeBackend> {
    discover()
        .create("cpu", &tandem_conformance::reference_options())
        .expect("cpu plugin")
}

/// Byte offsets of the f16 scale fields of one block, per format.
fn scale_fields(d: DType) -> &'static [usize] {
    match d {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q4K => &[0, 2],
        DType::Q6K => &[208],
        _ => &[],
    }
}

/// `rows` x `k` weights stored as `d`: random floats for float formats, random blocks with
/// small positive f16 scales (and mins of either sign) for block formats.
fn weight_bytes(rng: &mut Rng, d: DType, rows: usize, k: usize) -> Vec<u8> {
    match d {
        DType::F32 => rng
            .vec(rows * k, 1.0)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::F16 => rng
            .vec(rows * k, 1.0)
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect(),
        DType::Bf16 => rng
            .vec(rows * k, 1.0)
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect(),
        _ => {
            let len = d.row_bytes(k).expect("whole blocks") * rows;
            let mut b: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            for block in b.chunks_exact_mut(d.block_bytes()) {
                for (i, &at) in scale_fields(d).iter().enumerate() {
                    let mag = 0.002 + (rng.next_u64() % 1000) as f32 * 1e-5;
                    let v = if i == 1 && rng.next_u64().is_multiple_of(2) {
                        -mag
                    } else {
                        mag
                    };
                    block[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
                }
            }
            b
        }
    }
}

/// Runs `Input x -> MatMul(W, splits) -> Outputs` and `Embed(W) -> Output` on a backend.
fn run_format(
    be: &mut dyn ComputeBackend,
    d: DType,
    rows: usize,
    k: usize,
    bytes: &[u8],
    x: &[f32],
) -> Result<Vec<f32>, BackendError> {
    run_split_format(be, d, rows, k, bytes, x, &[20, 10, 7])
}

/// As [`run_format`], with the weight's rows split over outputs of `splits` columns.
fn run_split_format(
    be: &mut dyn ComputeBackend,
    d: DType,
    rows: usize,
    k: usize,
    bytes: &[u8],
    x: &[f32],
    splits: &[usize],
) -> Result<Vec<f32>, BackendError> {
    let n: usize = splits.iter().sum();
    let desc = TensorDesc::new(d, [n, k]);
    let w = be.alloc(&desc, Usage::Weight)?;
    be.write(w, 0, bytes)?;
    let xin = be.alloc(&TensorDesc::new(DType::F32, [rows, k]), Usage::Activation)?;
    be.write(
        xin,
        0,
        &x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
    )?;
    let splits = splits.to_vec();
    let outs: Vec<_> = splits
        .iter()
        .map(|c| be.alloc(&TensorDesc::new(DType::F32, [rows, *c]), Usage::Activation))
        .collect::<Result<_, _>>()?;
    let emb = be.alloc(&TensorDesc::new(DType::F32, [rows, k]), Usage::Activation)?;
    let weight = WeightRef { buffer: w, desc };
    let mut g = GraphBuilder::new(format!("{d} x{rows}"), rows, 0);
    let xv = g.push1(Op::Input {
        buffer: xin,
        cols: k,
        selected: false,
    });
    let ys = g.push(Op::MatMul {
        x: xv,
        weight: weight.clone(),
        splits: splits.clone(),
    });
    for (y, o) in ys.iter().zip(&outs) {
        g.push(Op::Output { x: *y, buffer: *o });
    }
    let e = g.push1(Op::Embed {
        table: weight,
        scale: 0.5,
        extra: None,
    });
    g.push(Op::Output { x: e, buffer: emb });
    let p = be.compile(&g.finish())?;
    let tokens: Vec<u32> = (0..rows as u32).map(|r| (r * 7 + 3) % n as u32).collect();
    let zeros = vec![0u32; rows];
    let t = be.execute(
        p,
        &StepArgs {
            tokens: &tokens,
            positions: &zeros,
            slots: &zeros,
            select: &[],
        },
    )?;
    be.wait(t)?;
    let mut got = Vec::new();
    for (o, c) in outs.iter().chain([&emb]).zip(splits.iter().chain([&k])) {
        let mut buf = vec![0u8; rows * c * 4];
        be.read(*o, 0, &mut buf)?;
        got.extend(
            buf.chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
    }
    be.release(p)?;
    for b in outs.into_iter().chain([emb, xin, w]) {
        be.free(b)?;
    }
    Ok(got)
}

#[test]
fn every_weight_format_matches_the_cpu_reference() {
    let Some(mut vk) = vulkan() else { return };
    let mut reference = cpu();
    let mut rng = Rng::new(13);
    // From 64 rows a device with cooperative matrices takes matmul_coopmat, which rounds
    // activations and weights to f16 (11-bit significands, f32 accumulation): about 2^-12
    // relative error per product, well under 5e-3 of the largest output for these k; the f32
    // kernels keep 1e-5, but where the device's integer dot products are on (the H200's are;
    // lavapipe's are off), block formats' few-row products take `matvec_dot` on 16-bit
    // activations (2^-16 of each block's largest per element): 5e-5 (measured 1.3e-5 on the
    // H200, q4_0, one row, k = 512).
    let features = vk.info().features;
    let coopmat = features.iter().any(|f| f == "cooperative_matrix");
    let int_dot = features
        .iter()
        .any(|f| f == "int8_dot" || f == "int8_dot(not accelerated)");
    let tol = |rows: usize, d: DType| {
        let float = matches!(d, DType::F32 | DType::F16 | DType::Bf16);
        if coopmat && rows >= 64 {
            5e-3
        } else if int_dot && !float {
            5e-5
        } else {
            1e-5
        }
    };
    for d in WEIGHT_FORMATS {
        // A whole number of 256-blocks and an odd one (k-quants), an odd number of 32-blocks,
        // and for the float formats widths that are and are not a multiple of 16 (the
        // matrix-vector kernel's slots of 16 values) or 4.
        let ks: &[usize] = match d {
            // q4_k's one-row kernel: 9 blocks take two trips of 5 subgroups, one partly idle.
            DType::Q4K => &[512, 768, 2304],
            DType::Q6K => &[512, 768],
            DType::F32 | DType::F16 | DType::Bf16 => &[512, 208, 200, 230, 97],
            _ => &[512, 32 * 7],
        };
        // The matrix-vector kernel's weight rows per workgroup and slots per loop trip: as
        // chosen, then forced to 1 row (two slots per trip), 8 (two rows per subgroup in
        // subgroup mode), 8 with four slots a trip, 16 with three.
        let forced = [
            (&ks[0], Some(("1", None))),
            (&ks[0], Some(("8", None))),
            (&ks[0], Some(("8", Some("4")))),
            (&ks[0], Some(("16", Some("3")))),
        ];
        let set = |var: &str, value: Option<&str>| match value {
            Some(v) => std::env::set_var(var, v),
            None => std::env::remove_var(var),
        };
        for (&k, cols) in ks.iter().map(|k| (k, None)).chain(forced) {
            set("TANDEM_VULKAN_MATVEC_COLS", cols.map(|(c, _)| c));
            set("TANDEM_VULKAN_MATVEC_U", cols.and_then(|(_, u)| u));
            let bytes = weight_bytes(&mut rng, d, 37, k);
            // Matrix-vector rows 1..8 (R = 1, 2, 4, 8), several row slices (9, 17, 32, 33),
            // 70 rows (the tiled kernel, with partial tiles).
            let all = [1usize, 2, 3, 5, 8, 9, 17, 32, 33, 70];
            let row_counts = if cols.is_some() { &all[..7] } else { &all[..] };
            for &rows in row_counts {
                let x = rng.vec(rows * k, 1.0);
                let want = run_format(reference.as_mut(), d, rows, k, &bytes, &x).unwrap();
                let got = run_format(vk.as_mut(), d, rows, k, &bytes, &x)
                    .unwrap_or_else(|e| panic!("{d} with {rows} rows, k = {k} on vulkan: {e}"));
                let want: Vec<f64> = want.iter().map(|v| *v as f64).collect();
                assert_close(
                    &format!("matmul+embed {d} x{rows} k={k} cols={cols:?}"),
                    "vulkan vs cpu",
                    &got,
                    &want,
                    tol(rows, d),
                );
            }
        }
        std::env::remove_var("TANDEM_VULKAN_MATVEC_COLS");
        std::env::remove_var("TANDEM_VULKAN_MATVEC_U");
    }
}

/// Prefill products at odd sizes on every weight format: 100, 511, 512 and 513 rows (partial
/// tiles of input rows), 133 weight rows split 70 + 63 (partial tiles of weight rows, a split
/// inside a tile), k not a multiple of the tile's 32 (float formats) or an odd number of
/// blocks. Where the device has cooperative matrices (not lavapipe: the H200 runs this binary
/// with them) the KHR kernels take these rows: as chosen (`matmul_coopmat` at 100 rows, from 128
/// `matmul_khr` for q4_k and `matmul_khr64` for the others, and at 513 rows each of the two
/// forced on every format), with k split in 3 (partial tiles summed by `matmul_reduce`), with
/// block formats dequantised first, and `matmul_coopmat` at 513 rows with each of its tile shapes
/// forced, with its f32 input converted in the loads (not by `to_f16` first), with q4_k decoded
/// in the loads and with k taken 64 at a time.
#[test]
fn prefill_products_at_odd_sizes_match_the_cpu_reference() {
    let Some(mut vk) = vulkan() else { return };
    let mut reference = cpu();
    let mut rng = Rng::new(23);
    let coopmat = vk.info().features.iter().any(|f| f == "cooperative_matrix");
    let tol = if coopmat { 5e-3 } else { 1e-5 };
    let splits = [70usize, 63];
    // Settings ((variable, value) pairs) tried in turn where the device has cooperative
    // matrices; the tuning variables of `matmul_coopmat` alone come with it forced.
    const COOPMAT: (&str, &str) = ("TANDEM_VULKAN_COOPMAT_KERNEL", "coopmat");
    let knobs: &[&[(&str, &str)]] = if coopmat {
        &[
            &[],
            &[("TANDEM_VULKAN_COOPMAT_KSPLIT", "3")],
            &[("TANDEM_VULKAN_COOPMAT_DEQUANT", "1")],
            &[COOPMAT],
            &[COOPMAT, ("TANDEM_VULKAN_COOPMAT_KSPLIT", "3")],
            &[COOPMAT, ("TANDEM_VULKAN_COOPMAT_TILE", "32x64")],
            &[COOPMAT, ("TANDEM_VULKAN_COOPMAT_TILE", "64x128")],
            &[COOPMAT, ("TANDEM_VULKAN_COOPMAT_TILE", "128x64")],
            &[COOPMAT, ("TANDEM_VULKAN_COOPMAT_X16", "0")],
            // q4_k decoded in the loads rather than staged.
            &[COOPMAT, ("TANDEM_VULKAN_COOPMAT_MODE", "16")],
            &[COOPMAT, ("TANDEM_VULKAN_COOPMAT_BK", "64")],
            // Each KHR kernel from 128 rows on every format (by default q4_k takes
            // matmul_khr and the others matmul_khr64).
            &[("TANDEM_VULKAN_COOPMAT_KERNEL", "khr")],
            &[("TANDEM_VULKAN_COOPMAT_KERNEL", "khr64")],
            &[
                ("TANDEM_VULKAN_COOPMAT_KERNEL", "khr64"),
                ("TANDEM_VULKAN_COOPMAT_KSPLIT", "3"),
            ],
        ]
    } else {
        &[&[]]
    };
    for d in WEIGHT_FORMATS {
        let k = match d {
            DType::F32 | DType::F16 | DType::Bf16 => 1000,
            DType::Q4K | DType::Q6K => 768,
            _ => 32 * 37,
        };
        let bytes = weight_bytes(&mut rng, d, splits.iter().sum(), k);
        for &setting in knobs {
            for &(var, value) in setting {
                std::env::set_var(var, value);
            }
            let rows_list: &[usize] = if setting.is_empty() {
                &[100, 511, 512, 513]
            } else {
                &[513]
            };
            let named: Vec<String> = setting.iter().map(|(v, x)| format!("{v}={x}")).collect();
            for &rows in rows_list {
                let x = rng.vec(rows * k, 1.0);
                let want = run_split_format(reference.as_mut(), d, rows, k, &bytes, &x, &splits).unwrap();
                let got = run_split_format(vk.as_mut(), d, rows, k, &bytes, &x, &splits)
                    .unwrap_or_else(|e| panic!("{d} with {rows} rows, k = {k} on vulkan: {e}"));
                let want: Vec<f64> = want.iter().map(|v| *v as f64).collect();
                assert_close(
                    &format!("matmul {d} x{rows} k={k} {}", named.join(" ")),
                    "vulkan vs cpu",
                    &got,
                    &want,
                    tol,
                );
            }
            for &(var, _) in setting {
                std::env::remove_var(var);
            }
        }
    }
}

/// Prefill-sized matmuls whose outputs split at multiples of 128 columns: where the device has
/// NV cooperative matrix 2, `matmul_cm2` stores each 128-column tile into its own output (on
/// lavapipe, the tiled kernel runs).
#[test]
fn prefill_matmuls_split_at_tile_boundaries_match_the_cpu_reference() {
    let Some(mut vk) = vulkan() else { return };
    let mut reference = cpu();
    let mut rng = Rng::new(17);
    let coopmat = vk.info().features.iter().any(|f| f == "cooperative_matrix");
    let tol = if coopmat { 5e-3 } else { 1e-5 };
    let splits = [128usize, 256, 64];
    for d in [
        DType::F16,
        DType::Bf16,
        DType::Q4_0,
        DType::Q8_0,
        DType::Q4K,
        DType::Q6K,
    ] {
        let k = if matches!(d, DType::F16 | DType::Bf16) {
            200
        } else {
            512
        };
        let bytes = weight_bytes(&mut rng, d, splits.iter().sum(), k);
        for rows in [64usize, 130] {
            let x = rng.vec(rows * k, 1.0);
            let want = run_split_format(reference.as_mut(), d, rows, k, &bytes, &x, &splits).unwrap();
            let got = run_split_format(vk.as_mut(), d, rows, k, &bytes, &x, &splits)
                .unwrap_or_else(|e| panic!("{d} with {rows} rows, k = {k} on vulkan: {e}"));
            let want: Vec<f64> = want.iter().map(|v| *v as f64).collect();
            assert_close(
                &format!("matmul {d} x{rows} k={k} splits={splits:?}"),
                "vulkan vs cpu",
                &got,
                &want,
                tol,
            );
        }
    }
}

#[test]
fn formats_without_a_kernel_are_refused_by_name() {
    let Some(mut vk) = vulkan() else { return };
    let desc = TensorDesc::new(DType::Q2K, [4, 256]);
    let op = Op::Embed {
        table: WeightRef {
            buffer: tandem_backend_api::BufferId::UNBOUND,
            desc: desc.clone(),
        },
        scale: 1.0,
        extra: None,
    };
    match vk.supports(&op) {
        Support::No { reason } => assert!(reason.contains("q2_k"), "{reason}"),
        Support::Yes => panic!("q2_k claimed supported"),
    }
    let w = vk.alloc(&desc, Usage::Weight).unwrap();
    let out = vk
        .alloc(&TensorDesc::new(DType::F32, [1, 256]), Usage::Activation)
        .unwrap();
    let mut g = GraphBuilder::new("q2_k embed", 1, 0);
    let e = g.push1(Op::Embed {
        table: WeightRef { buffer: w, desc },
        scale: 1.0,
        extra: None,
    });
    g.push(Op::Output { x: e, buffer: out });
    let err = vk.compile(&g.finish()).unwrap_err();
    assert!(
        matches!(err, BackendError::Unsupported { .. }) && err.to_string().contains("q2_k"),
        "{err}"
    );
}

#[test]
fn a_device_that_is_not_there_is_unavailable_by_name() {
    if vulkan().is_none() {
        return;
    }
    let mut o = BackendOptions::default();
    o.set("device", "no-such-gpu-anywhere");
    let err = match discover().create("vulkan", &o) {
        Ok(_) => panic!("a device named no-such-gpu-anywhere was found"),
        Err(e) => e,
    };
    let text = err.to_string();
    assert!(
        text.contains("unavailable") && text.contains("no-such-gpu-anywhere"),
        "{text}"
    );
    // An index past the list, likewise.
    o.set("device", "999");
    let err = discover().create("vulkan", &o).err().expect("device 999");
    assert!(err.to_string().contains("'999'"), "{err}");
}

/// `wait_spin_us`: a wait that polls the timeline first (forced here, as lavapipe's default
/// is not to) returns the same product as one that blocks; a value that is not a number of
/// microseconds is refused by name.
#[test]
fn polling_waits_give_the_same_results_and_bad_values_are_refused() {
    let mut o = options_for("vulkan");
    o.set("wait_spin_us", "2000");
    let Some(mut polling) = vulkan_with(o.clone()) else {
        return;
    };
    let Some(mut blocking) = vulkan() else { return };
    let mut rng = Rng::new(7);
    let (rows, k) = (3, 64);
    let bytes = weight_bytes(&mut rng, DType::Q8_0, 37, k);
    let x = rng.vec(rows * k, 1.0);
    let a = run_format(polling.as_mut(), DType::Q8_0, rows, k, &bytes, &x).expect("polling");
    let b = run_format(blocking.as_mut(), DType::Q8_0, rows, k, &bytes, &x).expect("blocking");
    assert_eq!(a, b);
    o.set("wait_spin_us", "soon");
    let err = discover()
        .create("vulkan", &o)
        .err()
        .expect("wait_spin_us = soon");
    assert!(
        err.to_string().contains("wait_spin_us") && err.to_string().contains("soon"),
        "{err}"
    );
}

#[test]
fn more_than_the_device_holds_is_out_of_memory() {
    let Some(mut vk) = vulkan() else { return };
    for usage in [Usage::Weight, Usage::Activation] {
        let err = vk
            .alloc(&TensorDesc::new(DType::F32, [1 << 40]), usage)
            .expect_err("4 TiB allocated");
        assert!(
            matches!(err, BackendError::OutOfMemory { requested, .. } if requested == 4 << 40),
            "{usage:?}: {err}"
        );
    }
    // The backend still works afterwards.
    let b = vk
        .alloc(&TensorDesc::new(DType::F32, [16]), Usage::Weight)
        .unwrap();
    vk.write(b, 0, &[1u8; 64]).unwrap();
    vk.free(b).unwrap();
}

#[test]
fn info_memory_profile_and_bandwidth() {
    let mut options = options_for("vulkan");
    options.set("profile", "true");
    let Some(mut vk) = vulkan_with(options) else {
        return;
    };
    let info = vk.info();
    assert_eq!(info.name, "vulkan");
    assert!(
        info.features.iter().any(|f| f.starts_with("vulkan 1.")),
        "{info:?}"
    );
    let before = vk.memory().unwrap().expect("device memory is reported");
    let kb = vk
        .alloc(&TensorDesc::new(DType::F32, [1024, 1024]), Usage::Weight)
        .unwrap();
    let after = vk.memory().unwrap().unwrap();
    assert!(
        after.in_use_bytes >= before.in_use_bytes + (4 << 20),
        "{before:?} -> {after:?}"
    );
    // A program's per-node times: one per node once it has run.
    let out = vk
        .alloc(&TensorDesc::new(DType::F32, [2, 1024]), Usage::Activation)
        .unwrap();
    let mut g = GraphBuilder::new("embed", 2, 0);
    let e = g.push1(Op::Embed {
        table: WeightRef {
            buffer: kb,
            desc: TensorDesc::new(DType::F32, [1024, 1024]),
        },
        scale: 1.0,
        extra: None,
    });
    let s = g.push1(Op::Softcap { x: e, cap: 3.0 });
    g.push(Op::Output { x: s, buffer: out });
    let p = vk.compile(&g.finish()).unwrap();
    assert!(vk.profile(p).unwrap().is_empty(), "times before any execution");
    let t = vk
        .execute(
            p,
            &StepArgs {
                tokens: &[1, 2],
                positions: &[0, 1],
                slots: &[0, 0],
                select: &[],
            },
        )
        .unwrap();
    vk.wait(t).unwrap();
    if info.features.iter().any(|f| f == "timestamps") {
        let times = vk.profile(p).unwrap();
        assert_eq!(times.len(), 3);
        assert_eq!(times[1].op, "softcap");
        assert!(
            times.iter().all(|t| t.seconds >= 0.0 && t.seconds < 10.0),
            "{times:?}"
        );
        let bw = vk.copy_bandwidth().unwrap().expect("measured");
        assert!(bw > 1e6, "{bw}");
    }
    vk.release(p).unwrap();
    vk.free(out).unwrap();
    vk.free(kb).unwrap();
}
