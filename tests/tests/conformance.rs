//! Every op at awkward shapes, on every backend plugin that loads here, through the loader.

use std::collections::BTreeSet;

use tandem_backend_api::{
    BackendError, ComputeBackend, DType, DeviceKind, GraphBuilder, Op, StepArgs, Support, TensorDesc, Usage,
    WeightRef,
};
use tandem_conformance::{assert_close, backends_under_test, cases, options_for, tolerance_floor};

#[test]
fn every_case_matches_the_oracle_and_the_cpu_reference() {
    let (mut backends, mut reference) = backends_under_test();
    let all = cases::all();
    // Which backend ran which case: a backend gets every case whose ops it says it supports,
    // and none of the others (the NPU runs attention only).
    let mut ran: Vec<(String, String)> = Vec::new();
    for case in &all {
        let want_ref = case
            .run(reference.as_mut())
            .unwrap_or_else(|e| panic!("{} on the reference: {e}", case.name));
        assert_close(&case.name, "cpu reference", &want_ref, &case.expected, case.tol);
        let ops = case_ops(case, reference.as_mut());
        for b in &mut backends {
            let refused = ops.iter().find_map(|op| match b.backend.supports(op) {
                Support::Yes => None,
                Support::No { reason } => Some(format!("{}: {reason}", op.name())),
            });
            if let Some(reason) = refused {
                // A backend that says no must also fail to compile the case, not run it wrongly.
                let err = case.run(b.backend.as_mut()).expect_err(&format!(
                    "{} on {}: supports said no ({reason}) but it ran",
                    case.name, b.name
                ));
                assert!(
                    matches!(err, BackendError::Unsupported { .. }),
                    "{} on {}: {err}",
                    case.name,
                    b.name
                );
                continue;
            }
            let got = case
                .run(b.backend.as_mut())
                .unwrap_or_else(|e| panic!("{} on {}: {e}", case.name, b.name));
            let tol = case.tol.max(tolerance_floor(&b.backend.info()));
            assert_close(&case.name, &b.name, &got, &case.expected, tol);
            let vs_ref: Vec<f64> = want_ref.iter().map(|v| *v as f64).collect();
            assert_close(
                &case.name,
                &format!("{} vs cpu", b.name),
                &got,
                &vs_ref,
                tol.max(1e-6),
            );
            ran.push((b.name.clone(), case.name.clone()));
        }
    }
    for b in &backends {
        let n = ran.iter().filter(|(name, _)| *name == b.name).count();
        assert!(n > 0, "{} ran no conformance case", b.name);
        if b.backend.info().kind == DeviceKind::Npu {
            // Every attention case but the soft-capped one (the NPU kernels have no softcap)
            // and those whose query-head group exceeds the NPU kernels' 8.
            let group = |n: &str| -> Option<usize> {
                let (h, k) = n
                    .split_once("heads=")?
                    .1
                    .split_whitespace()
                    .next()?
                    .split_once('/')?;
                Some(h.parse::<usize>().ok()? / k.parse::<usize>().ok()?)
            };
            let want: Vec<&str> = all
                .iter()
                .map(|c| c.name.as_str())
                .filter(|n| n.starts_with("attention") && n.contains("softcap=None"))
                .filter(|n| group(n).is_none_or(|g| g <= 8))
                .collect();
            let got: Vec<&str> = ran
                .iter()
                .filter(|(name, _)| *name == b.name)
                .map(|(_, case)| case.as_str())
                .filter(|n| n.starts_with("attention"))
                .collect();
            assert!(want.len() >= 4, "the suite lost its attention cases: {want:?}");
            assert_eq!(got, want, "{}: attention cases run", b.name);
        }
        if matches!(b.name.as_str(), "vulkan" | "wgpu") {
            // Images' rows (issue 58): both GPU backends run every such case, none refused.
            let image = |n: &&str| n.contains("image_attention") || n.starts_with("embed+extra");
            let want: Vec<&str> = all.iter().map(|c| c.name.as_str()).filter(image).collect();
            let got: Vec<&str> = ran
                .iter()
                .filter(|(name, _)| *name == b.name)
                .map(|(_, case)| case.as_str())
                .filter(image)
                .collect();
            assert!(want.len() >= 8, "the suite lost its image cases: {want:?}");
            assert_eq!(got, want, "{}: image cases run", b.name);
        }
        if matches!(b.name.as_str(), "vulkan" | "wgpu") {
            // The vision tower's ops: every case of them runs on both GPU backends' kernels.
            let vision = |n: &&str| {
                ["layer_norm", "matmul+bias+gelu", "block_attention"]
                    .iter()
                    .any(|p| n.starts_with(p))
            };
            let want: Vec<&str> = all.iter().map(|c| c.name.as_str()).filter(vision).collect();
            let got: Vec<&str> = ran
                .iter()
                .filter(|(name, _)| *name == b.name)
                .map(|(_, case)| case.as_str())
                .filter(vision)
                .collect();
            assert!(want.len() >= 8, "the suite lost its vision cases: {want:?}");
            assert_eq!(got, want, "{}: vision cases run", b.name);
        }
    }
}

/// The ops of a case's graph, recorded by building it on `backend`.
fn case_ops(case: &cases::Case, backend: &mut dyn ComputeBackend) -> Vec<Op> {
    let mut seen = BTreeSet::new();
    let mut ops = Vec::new();
    let mut rec = Recorder {
        inner: backend,
        ops: &mut seen,
        full: Some(&mut ops),
    };
    case.run(&mut rec).expect("the case runs on the reference");
    ops
}

#[test]
fn the_cases_cover_every_op() {
    // Record which ops each case's graph contains by building it on the reference backend.
    let (_, mut reference) = backends_under_test();
    let mut seen = BTreeSet::new();
    for case in cases::all() {
        // The graph is not exposed by `Case`; rebuild it through a recording backend.
        let mut rec = Recorder {
            inner: reference.as_mut(),
            ops: &mut seen,
            full: None,
        };
        case.run(&mut rec).unwrap();
    }
    let every = Op::KINDS;
    for name in every {
        assert!(seen.contains(name), "no conformance case exercises {name}");
    }
    assert_eq!(seen.len(), every.len(), "ops seen: {seen:?}");
}

/// Forwards to a backend and records the ops of every graph compiled.
struct Recorder<'a> {
    inner: &'a mut dyn tandem_backend_api::ComputeBackend,
    ops: &'a mut BTreeSet<&'static str>,
    full: Option<&'a mut Vec<Op>>,
}

impl tandem_backend_api::ComputeBackend for Recorder<'_> {
    fn info(&self) -> tandem_backend_api::BackendInfo {
        self.inner.info()
    }
    fn supports(&self, op: &Op) -> tandem_backend_api::Support {
        self.inner.supports(op)
    }
    fn alloc(&mut self, d: &TensorDesc, u: Usage) -> Result<tandem_backend_api::BufferId, BackendError> {
        self.inner.alloc(d, u)
    }
    fn write(&mut self, b: tandem_backend_api::BufferId, o: u64, d: &[u8]) -> Result<(), BackendError> {
        self.inner.write(b, o, d)
    }
    fn read(&mut self, b: tandem_backend_api::BufferId, o: u64, d: &mut [u8]) -> Result<(), BackendError> {
        self.inner.read(b, o, d)
    }
    fn free(&mut self, b: tandem_backend_api::BufferId) -> Result<(), BackendError> {
        self.inner.free(b)
    }
    fn compile(
        &mut self,
        g: &tandem_backend_api::Graph,
    ) -> Result<tandem_backend_api::ProgramId, BackendError> {
        for n in &g.nodes {
            self.ops.insert(n.op.kind());
            if let Some(full) = self.full.as_mut() {
                full.push(n.op.clone());
            }
        }
        self.inner.compile(g)
    }
    fn execute(
        &mut self,
        p: tandem_backend_api::ProgramId,
        a: &StepArgs<'_>,
    ) -> Result<tandem_backend_api::Ticket, BackendError> {
        self.inner.execute(p, a)
    }
    fn wait(&mut self, t: tandem_backend_api::Ticket) -> Result<(), BackendError> {
        self.inner.wait(t)
    }
    fn release(&mut self, p: tandem_backend_api::ProgramId) -> Result<(), BackendError> {
        self.inner.release(p)
    }
}

/// Bad graphs and step arguments are errors naming what is wrong, on every backend.
#[test]
fn bad_graphs_and_steps_are_errors_not_panics() {
    let (mut backends, reference) = backends_under_test();
    backends.push(tandem_conformance::UnderTest {
        name: "cpu reference".into(),
        backend: reference,
    });
    for b in &mut backends {
        let be = b.backend.as_mut();
        let w = be
            .alloc(&TensorDesc::new(DType::F32, [4, 3]), Usage::Weight)
            .unwrap();
        let table = WeightRef {
            buffer: w,
            desc: TensorDesc::new(DType::F32, [4, 3]),
        };
        let out = be
            .alloc(&TensorDesc::new(DType::F32, [6]), Usage::Activation)
            .unwrap();
        if !be
            .supports(&Op::Embed {
                table: table.clone(),
                scale: 1.0,
                extra: None,
            })
            .is_yes()
        {
            // A backend of a few ops (the NPU): the same checks through Input and Output.
            be.free(w).unwrap();
            input_output_misuse(&b.name, be, out);
            continue;
        }

        // A weight description that does not match its buffer.
        let mut g = GraphBuilder::new("wrong weight", 2, 0);
        let e = g.push1(Op::Embed {
            table: WeightRef {
                desc: TensorDesc::new(DType::F32, [4, 5]),
                ..table.clone()
            },
            scale: 1.0,
            extra: None,
        });
        g.push(Op::Output { x: e, buffer: out });
        let err = be.compile(&g.finish()).unwrap_err().to_string();
        assert!(err.contains("invalid argument"), "{}: {err}", b.name);

        // A matmul whose input width does not match the weight.
        let mut g = GraphBuilder::new("bad matmul", 2, 0);
        let e = g.push1(Op::Embed {
            table: table.clone(),
            scale: 1.0,
            extra: None,
        });
        let bad = g.push(Op::MatMul {
            x: e,
            weight: WeightRef {
                buffer: w,
                desc: TensorDesc::new(DType::F32, [3, 4]),
            },
            splits: vec![3],
        });
        g.push(Op::Output {
            x: bad[0],
            buffer: out,
        });
        let err = be.compile(&g.finish()).unwrap_err().to_string();
        assert!(err.contains("columns"), "{}: {err}", b.name);

        // A good program, then bad steps: a token outside the vocabulary, wrong lengths.
        let mut g = GraphBuilder::new("embed", 2, 0);
        let e = g.push1(Op::Embed {
            table: table.clone(),
            scale: 1.0,
            extra: None,
        });
        g.push(Op::Output { x: e, buffer: out });
        let p = be.compile(&g.finish()).unwrap();
        let step = |tokens: &'static [u32], positions: &'static [u32]| StepArgs {
            tokens,
            positions,
            slots: &[0, 0],
            select: &[],
        };
        let err = be.execute(p, &step(&[1, 4], &[0, 1])).unwrap_err().to_string();
        assert!(
            err.contains("token id 4") && err.contains("vocabulary of 4"),
            "{}: {err}",
            b.name
        );
        let err = be.execute(p, &step(&[1], &[0, 1])).unwrap_err().to_string();
        assert!(
            err.contains("tokens") && err.contains("2 rows"),
            "{}: {err}",
            b.name
        );
        let t = be.execute(p, &step(&[1, 3], &[0, 1])).unwrap();
        be.wait(t).unwrap();

        // Freeing a buffer a program uses is refused; out-of-range reads are errors.
        assert!(be.free(w).is_err(), "{}: freed a buffer in use", b.name);
        let mut big = vec![0u8; 100];
        let err = be.read(out, 0, &mut big).unwrap_err().to_string();
        assert!(err.contains("run past"), "{}: {err}", b.name);
        assert!(be
            .execute(tandem_backend_api::ProgramId(999_999), &step(&[1, 3], &[0, 1]))
            .is_err());
        be.release(p).unwrap();
        be.free(w).unwrap();
        be.free(out).unwrap();
        assert!(be.free(w).is_err(), "{}: double free accepted", b.name);
    }
}

/// Bad programs and steps on a backend that runs no embedding: an input wider than its buffer,
/// wrong step lengths, freeing a buffer in use, a read past the end, a double free.
fn input_output_misuse(name: &str, be: &mut dyn ComputeBackend, out: tandem_backend_api::BufferId) {
    let inp = be
        .alloc(&TensorDesc::new(DType::F32, [6]), Usage::Activation)
        .unwrap();
    let mut g = GraphBuilder::new("too wide", 2, 0);
    let x = g.push1(Op::Input {
        buffer: inp,
        cols: 4,
        selected: false,
    });
    g.push(Op::Output { x, buffer: out });
    let err = be.compile(&g.finish()).unwrap_err().to_string();
    assert!(err.contains("invalid argument"), "{name}: {err}");
    let mut g = GraphBuilder::new("copy", 2, 0);
    let x = g.push1(Op::Input {
        buffer: inp,
        cols: 3,
        selected: false,
    });
    g.push(Op::Output { x, buffer: out });
    let p = be.compile(&g.finish()).unwrap();
    let step = |tokens: &'static [u32]| StepArgs {
        tokens,
        positions: &[0, 1],
        slots: &[0, 0],
        select: &[],
    };
    let err = be.execute(p, &step(&[1])).unwrap_err().to_string();
    assert!(err.contains("tokens") && err.contains("2 rows"), "{name}: {err}");
    let data: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
    be.write(inp, 0, &data).unwrap();
    let t = be.execute(p, &step(&[0, 0])).unwrap();
    be.wait(t).unwrap();
    let mut back = vec![0u8; 24];
    be.read(out, 0, &mut back).unwrap();
    assert_eq!(back, data, "{name}: input copied to output");
    assert!(be.free(inp).is_err(), "{name}: freed a buffer in use");
    let mut big = vec![0u8; 100];
    let err = be.read(out, 0, &mut big).unwrap_err().to_string();
    assert!(err.contains("run past"), "{name}: {err}");
    be.release(p).unwrap();
    be.free(inp).unwrap();
    be.free(out).unwrap();
    assert!(be.free(inp).is_err(), "{name}: double free accepted");
}

/// Attention refuses positions the ring no longer holds.
#[test]
fn attention_positions_past_the_cache_are_errors() {
    let (mut backends, reference) = backends_under_test();
    backends.push(tandem_conformance::UnderTest {
        name: "cpu reference".into(),
        backend: reference,
    });
    for b in &mut backends {
        let be = b.backend.as_mut();
        let act = |be: &mut dyn tandem_backend_api::ComputeBackend, n| {
            be.alloc(&TensorDesc::new(DType::F32, [n]), Usage::Activation)
                .unwrap()
        };
        let (qb, kb, vb, ob) = (act(be, 8), act(be, 8), act(be, 8), act(be, 8));
        let cd = TensorDesc::new(DType::F32, [1, 4, 4]);
        let (kc, vc) = (
            be.alloc(&cd, Usage::KvCache).unwrap(),
            be.alloc(&cd, Usage::KvCache).unwrap(),
        );
        let mut g = GraphBuilder::new("attn", 2, 0);
        let q = g.push1(Op::Input {
            buffer: qb,
            cols: 4,
            selected: false,
        });
        let k = g.push1(Op::Input {
            buffer: kb,
            cols: 4,
            selected: false,
        });
        let v = g.push1(Op::Input {
            buffer: vb,
            cols: 4,
            selected: false,
        });
        let cache = tandem_backend_api::KvCacheRef {
            k: kc,
            v: vc,
            dtype: DType::F32,
            slots: 1,
            capacity: 4,
        };
        let o = g.push1(Op::Attention {
            q,
            k,
            v,
            cache,
            heads: 1,
            kv_heads: 1,
            head_dim: 4,
            scale: 0.5,
            window: None,
            softcap: None,
            bidirectional_from: None,
        });
        g.push(Op::Output { x: o, buffer: ob });
        let p = be.compile(&g.finish()).unwrap();
        let ok = StepArgs {
            tokens: &[0, 0],
            positions: &[2, 3],
            slots: &[0, 0],
            select: &[],
        };
        be.execute(p, &ok).unwrap();
        let past = StepArgs {
            tokens: &[0, 0],
            positions: &[3, 4],
            slots: &[0, 0],
            select: &[],
        };
        let err = be.execute(p, &past).unwrap_err().to_string();
        assert!(err.contains("do not fit the KV cache"), "{}: {err}", b.name);
        let bad_slot = StepArgs {
            tokens: &[0, 0],
            positions: &[0, 1],
            slots: &[0, 1],
            select: &[],
        };
        let err = be.execute(p, &bad_slot).unwrap_err().to_string();
        assert!(err.contains("slot 1"), "{}: {err}", b.name);
    }
}

/// Every plugin that loads here honours `memory_limit`: it reports the limit as its memory,
/// allocates within it, refuses past it with `OutOfMemory`, and refuses a limit larger than its
/// device. KV caches in f16: device memory on every backend, two bytes an element on all.
#[test]
fn every_backend_honours_memory_limit() {
    let found = tandem_conformance::discover();
    let mut tested = Vec::new();
    for lib in &found.plugins {
        let mut o = options_for(lib.name());
        o.set(tandem_backend_api::MEMORY_LIMIT, "1MiB");
        let mut be = match lib.create(&o) {
            Ok(b) => b,
            Err(BackendError::Unavailable { reason }) => {
                eprintln!("memory_limit: skipping {}: {reason}", lib.name());
                continue;
            }
            Err(e) => panic!("{} with memory_limit = 1MiB: {e}", lib.name()),
        };
        let name = lib.name();
        assert_eq!(be.info().memory_bytes, Some(1 << 20), "{name}");
        let cache = |n: usize| TensorDesc::new(DType::F16, [n]);
        let k = be
            .alloc(&cache(3 << 17), Usage::KvCache)
            .unwrap_or_else(|e| panic!("{name}: 768 KiB within 1 MiB: {e}"));
        let err = be
            .alloc(&cache(1 << 18), Usage::KvCache)
            .expect_err(&format!("{name}: 512 KiB more than 1 MiB allows"));
        assert!(matches!(err, BackendError::OutOfMemory { .. }), "{name}: {err}");
        be.free(k).unwrap();
        let k = be
            .alloc(&cache(1 << 18), Usage::KvCache)
            .unwrap_or_else(|e| panic!("{name}: 512 KiB once freed: {e}"));
        be.free(k).unwrap();
        drop(be);
        // More than any device holds (u64 bytes end near 16 EiB), where the backend knows its
        // device's memory (the CPU does not where /proc/meminfo cannot be read).
        let knows = lib
            .create(&options_for(name))
            .is_ok_and(|b| b.info().memory_bytes.is_some());
        if knows {
            o.set(tandem_backend_api::MEMORY_LIMIT, "16000000TiB");
            let err = lib
                .create(&o)
                .err()
                .unwrap_or_else(|| panic!("{name}: a limit past the device"));
            assert!(err.to_string().contains("memory_limit"), "{name}: {err}");
        }
        tested.push(name.to_string());
    }
    eprintln!("memory_limit: tested {tested:?}");
    assert!(tested.iter().any(|n| n == "cpu"), "{tested:?}");
}

/// Vulkan's `matvec_dot_<fmt>` (taken by default where the device's packed 8-bit dot product
/// is accelerated, forced here with `int_dot = true`, so lavapipe runs it too): every block
/// format at decode's row counts against the oracle, at the cases' own tolerance (its input
/// is rounded to 16 bits per block of 32, as the CPU backend's is).
#[test]
fn vulkan_integer_dot_products_match_the_oracle() {
    let mut options = options_for("vulkan");
    options.set("int_dot", "true");
    let mut backend = match tandem_conformance::discover().create("vulkan", &options) {
        Ok(b) => b,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipping: the vulkan backend is unavailable here: {e}");
            return;
        }
        Err(e) => panic!("CI must run the vulkan backend (lavapipe): {e}"),
    };
    let features = backend.info().features;
    if !features
        .iter()
        .any(|f| f.starts_with("int8_dot") && !f.contains("off"))
    {
        eprintln!("skipping: this Vulkan device has no integer dot products ({features:?})");
        return;
    }
    for case in cases::int_dot_matmuls() {
        let got = case
            .run(backend.as_mut())
            .unwrap_or_else(|e| panic!("{} on vulkan(int_dot): {e}", case.name));
        assert_close(&case.name, "vulkan(int_dot)", &got, &case.expected, case.tol);
    }
    // One-row q4_k products take the dots only from 100M weight elements (27B's FFN);
    // `TANDEM_VULKAN_DOT_Q4K1=1` sends this small one there (no other test here forces
    // `int_dot`, which the variable needs).
    let one_row_q4k: Vec<_> = cases::int_dot_matmuls()
        .into_iter()
        .filter(|c| c.name.starts_with("matmul q4_k rows=1 "))
        .collect();
    assert_eq!(one_row_q4k.len(), 1, "the one-row q4_k case");
    let case = &one_row_q4k[0];
    std::env::set_var("TANDEM_VULKAN_DOT_Q4K1", "1");
    let got = case.run(backend.as_mut());
    std::env::remove_var("TANDEM_VULKAN_DOT_Q4K1");
    let got = got.unwrap_or_else(|e| panic!("{} on vulkan(int_dot, dots for q4_k): {e}", case.name));
    assert_close(
        &case.name,
        "vulkan(int_dot, one-row q4_k)",
        &got,
        &case.expected,
        case.tol,
    );
    assert!(features.iter().any(|f| f == "precision=exact"), "{features:?}");
    // `precision = "fast"`: the input at 8 bits, against the oracle that quantises it the same
    // way.
    options.set("precision", "fast");
    let mut backend = tandem_conformance::discover()
        .create("vulkan", &options)
        .unwrap_or_else(|e| panic!("vulkan with precision = fast: {e}"));
    let features = backend.info().features;
    assert!(features.iter().any(|f| f == "precision=fast"), "{features:?}");
    for case in cases::int8_dot_matmuls() {
        let got = case
            .run(backend.as_mut())
            .unwrap_or_else(|e| panic!("{} on vulkan(fast): {e}", case.name));
        assert_close(&case.name, "vulkan(fast)", &got, &case.expected, case.tol);
    }
    options.set("precision", "sloppy");
    let err = match tandem_conformance::discover().create("vulkan", &options) {
        Ok(_) => panic!("vulkan took precision = sloppy"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("'precision'") && err.contains("sloppy"), "{err}");
}

/// The wgpu backend's kernel variants: the main test runs the variant the adapter gets (on
/// lavapipe, subgroup reductions); here the portable variant is forced (`features = portable`,
/// what an adapter without optional features runs), with fusion off the unfused kernels of the
/// chains the backend fuses, and the integer-dot decode matvecs (`features = int_dot`, taken by
/// default where the device's packed dot product is accelerated; lavapipe has it, not
/// accelerated) on every block format at decode's row counts and on the fused gate/up GeGlu.
/// Every case wgpu supports, against the oracle at the case's own tolerance.
#[test]
fn wgpu_variants_match_the_oracle() {
    for (label, key, value, want) in [
        ("wgpu(portable)", "features", "portable", "kernels=portable"),
        ("wgpu(unfused)", "fuse", "false", "kernels="),
        ("wgpu(int_dot)", "features", "int_dot", "kernels=int_dot"),
        ("wgpu(int_dot, fast)", "features", "int_dot", "precision=fast"),
    ] {
        let fast = label.contains("fast");
        let mut options = options_for("wgpu");
        options.set(key, value);
        if fast {
            options.set("precision", "fast");
        }
        let mut backend = match tandem_conformance::discover().create("wgpu", &options) {
            Ok(b) => b,
            Err(e) if std::env::var_os("CI").is_none() => {
                eprintln!("skipping {label}: unavailable here: {e}");
                continue;
            }
            Err(e) => panic!("CI must run {label} (lavapipe): {e}"),
        };
        let features = backend.info().features;
        assert!(
            features.iter().any(|f| f.starts_with(want)),
            "{label}: {features:?}"
        );
        let int_dot = value == "int_dot";
        let mut cases = if fast { Vec::new() } else { cases::all() };
        if fast {
            cases.extend(cases::int8_dot_matmuls());
        } else if int_dot {
            cases.extend(cases::int_dot_matmuls());
        }
        let mut ran = 0;
        for case in cases {
            // The unfused kernels differ from the fused ones only in the chains; the integer-dot
            // variant from the portable one only in the matmuls.
            if key == "fuse" && !(case.name.contains("rms_norm+") || case.name.contains("qk_norm")) {
                continue;
            }
            if int_dot && !case.name.starts_with("matmul") {
                continue;
            }
            match case.run(backend.as_mut()) {
                Ok(got) => {
                    assert_close(&case.name, label, &got, &case.expected, case.tol);
                    ran += 1;
                }
                Err(e) => panic!("{} on {label}: {e}", case.name),
            }
        }
        assert!(ran >= 5, "{label} ran {ran} cases");
    }
}

/// Weights allocated as `Usage::HostWeight` (the prefill op offload's: host memory a device
/// copies into its own before each product, on backends listing `host_weights`; any other
/// backend holds them as weights) give exactly the products `Usage::Weight` gives, on every
/// plugin that loads here, through the plugin boundary's usage code.
#[test]
fn host_weights_give_what_weights_give() {
    let (mut backends, reference) = backends_under_test();
    backends.push(tandem_conformance::UnderTest {
        name: "cpu reference".into(),
        backend: reference,
    });
    let (n, k, rows) = (40usize, 64usize, 3usize);
    let mut rng = tandem_conformance::Rng::new(5);
    let x = rng.vec(rows * k, 1.0);
    let w = rng.vec(n * k, 0.5);
    let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    let desc = TensorDesc::new(DType::F32, [n, k]);
    let mut tested = Vec::new();
    for b in &mut backends {
        let be = b.backend.as_mut();
        let probe = Op::MatMul {
            x: tandem_backend_api::ValueId(0),
            weight: WeightRef {
                buffer: tandem_backend_api::BufferId(0),
                desc: desc.clone(),
            },
            splits: vec![n],
        };
        if !be.supports(&probe).is_yes() {
            continue;
        }
        let mut run = |usage: Usage| -> Vec<u8> {
            let wb = be.alloc(&desc, usage).unwrap();
            be.write(wb, 0, &bytes(&w)).unwrap();
            let xb = be
                .alloc(&TensorDesc::new(DType::F32, [rows * k]), Usage::Activation)
                .unwrap();
            be.write(xb, 0, &bytes(&x)).unwrap();
            let ob = be
                .alloc(&TensorDesc::new(DType::F32, [rows * n]), Usage::Activation)
                .unwrap();
            let mut g = GraphBuilder::new("host weights", rows, 0);
            let xi = g.push1(Op::Input {
                buffer: xb,
                cols: k,
                selected: false,
            });
            let y = g.push(Op::MatMul {
                x: xi,
                weight: WeightRef {
                    buffer: wb,
                    desc: desc.clone(),
                },
                splits: vec![n],
            });
            g.push(Op::Output { x: y[0], buffer: ob });
            let p = be.compile(&g.finish()).unwrap();
            let args = StepArgs {
                tokens: &[0; 3],
                positions: &[0, 1, 2],
                slots: &[0; 3],
                select: &[],
            };
            be.execute(p, &args).unwrap();
            let mut out = vec![0u8; rows * n * 4];
            be.read(ob, 0, &mut out).unwrap();
            be.release(p).unwrap();
            for buf in [wb, xb, ob] {
                be.free(buf).unwrap();
            }
            out
        };
        let (as_weight, as_host) = (run(Usage::Weight), run(Usage::HostWeight));
        assert!(as_weight.iter().any(|&b| b != 0), "{}: no product", b.name);
        assert_eq!(as_weight, as_host, "{}: host weights give other products", b.name);
        tested.push(b.name.clone());
    }
    eprintln!("host weights: tested {tested:?}");
    assert!(tested.iter().any(|n| n == "cpu reference"), "{tested:?}");
}
