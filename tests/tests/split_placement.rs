//! One model split across backends ("units"): `--backend A+B` (attention on A, the rest on B;
//! `cpu+cpu` two CPU instances) and per-phase `[placement.prefill]` / `[placement.decode]`
//! lists, loaded through `runtime::load` exactly as the CLI loads them, on the tiny transformers
//! fixtures only (the Vulkan backend runs on lavapipe in CI, slowly: no large model here).
//!
//! - Every split gives the single `cpu` backend's greedy continuation and transformers' logits
//!   at every position, prefilled and decoded (so across the KV hand-off between phases).
//! - The bytes the scheduler copies between units and the KV cache handed between phases are
//!   exactly what the placement report (`engine placement`) predicts.
//! - A decode step of a split session allocates nothing on the engine side once warm.
//!
//! Without a Vulkan device the Vulkan cases say so and pass, except under CI (`CI` set), where
//! a missing device is a failure.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::PathBuf;

use serde_json::Value;
use tandem_conformance::{discover, ids, options_for, plugin_dirs};
use tandem_engine::runtime::load::{load, plan, KvCacheType, Loaded, ModelOptions, Planned};
use tandem_engine::runtime::notice::Notice;
use tandem_engine::runtime::placement_report::PlacementReport;
use tandem_engine::runtime::plugins::PluginSearch;
use tandem_engine::runtime::session::{Session, Step};
use tandem_engine::runtime::settings::Settings;

// ---------------------------------------------------------------------------------------------
// Counting allocations of the calling thread (see `decode_steps_of_a_split_allocate_nothing`).

struct Counting;

thread_local! {
    /// `Some(n)`: counting, `n` allocations so far on this thread.
    static ALLOCATIONS: Cell<Option<usize>> = const { Cell::new(None) };
}

fn note_allocation() {
    // `try_with`: the allocator may run while this thread's locals are torn down.
    let _ = ALLOCATIONS.try_with(|c| {
        if let Some(n) = c.get() {
            c.set(Some(n + 1));
        }
    });
}

// SAFETY: forwards every call to the system allocator unchanged; it only counts, in a
// const-initialised thread-local `Cell` (which never allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note_allocation();
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through this allocator, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_allocation();
        // SAFETY: as in `alloc` and `dealloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs `f`, returning its result and the allocations it made on this thread.
fn count_allocations<R>(f: impl FnOnce() -> R) -> (R, usize) {
    ALLOCATIONS.set(Some(0));
    let r = f();
    let n = ALLOCATIONS.replace(None).unwrap_or(0);
    (r, n)
}

// ---------------------------------------------------------------------------------------------
// Fixtures, settings and loading.

/// Six layers (five sliding with a window of 4, one global), GQA, 486-token vocabulary.
const FIXTURE: &str = "text-published";
/// The fixtures of the whole-model checks: [`FIXTURE`], and two layers (one sliding, one global)
/// with attention and final-logit soft-capping.
const CASES: [&str; 2] = [FIXTURE, "softcap"];
/// Longest sequence: every fixture sequence fits, and the sliding layers' rings stay smaller.
const CONTEXT: usize = 64;
/// Rows per prefill step: the 16-token sequences cross several chunk boundaries.
const CHUNK: usize = 4;
/// The GPU tolerance of gpu_models.rs (and assert_last_logits): 1e-2 of the largest logit.
const VULKAN_TOL: f64 = 1e-2;
/// The CPU backend's tolerance against transformers (fixtures.rs, batched_decode.rs).
const CPU_TOL: f64 = 1e-4;

/// All on the Vulkan backend for prefill, all on the CPU for decode.
const PREFILL_VULKAN_DECODE_CPU: &str = "[placement.prefill]\nattention = [\"vulkan\"]\nffn = [\"vulkan\"]\ndefault = [\"vulkan\"]\n[placement.decode]\nattention = [\"cpu\"]\nffn = [\"cpu\"]\ndefault = [\"cpu\"]\n";
/// The reverse.
const PREFILL_CPU_DECODE_VULKAN: &str = "[placement.prefill]\nattention = [\"cpu\"]\nffn = [\"cpu\"]\ndefault = [\"cpu\"]\n[placement.decode]\nattention = [\"vulkan\"]\nffn = [\"vulkan\"]\ndefault = [\"vulkan\"]\n";

fn fixture(case: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/models")
        .join(case)
}

fn reference(case: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(case).join("reference.json")).unwrap()).unwrap()
}

/// The plugin search path of the conformance suite (next to the test binary).
fn search() -> PluginSearch {
    PluginSearch::only(&plugin_dirs())
}

/// Whether the Vulkan backend can be created here; a failure under CI.
fn vulkan_available() -> bool {
    match discover().create("vulkan", &options_for("vulkan")) {
        Ok(_) => true,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipping: the Vulkan backend is unavailable here: {e}");
            false
        }
        Err(e) => panic!("CI must run the Vulkan backend (lavapipe): {e}"),
    }
}

/// `placement` (a tandem.toml fragment) read through `Settings::load`, with the Vulkan backend's
/// validation layer on as the rest of the suite runs it (`options_for`).
fn settings(placement: &str) -> Settings {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tandem.toml");
    std::fs::write(&path, placement).unwrap();
    tandem_conformance::under_test(Settings::load(&path).unwrap_or_else(|e| panic!("{e}")))
}

/// `backend` as `--backend` takes it, or with ` --gpu-layers N` after it.
fn options(case: &str, backend: &str, chunk: usize) -> ModelOptions {
    let (backend, gpu_layers) = match backend.split_once(" --gpu-layers ") {
        Some((b, n)) => (b, Some(n.parse().unwrap())),
        None => (backend, None),
    };
    ModelOptions {
        model: Some(fixture(case)),
        backend: backend.to_string(),
        context: Some(CONTEXT),
        chunk,
        kv_cache: Default::default(),
        gpu_layers,
        images: 0,
        mmproj: None,
    }
}

/// `[placement.layers]` putting the first half of `case`'s layers on `first` and the rest on
/// `second` (the head on the faster, the embedding with layer 0).
fn halves(case: &str, first: &str, second: &str) -> String {
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(case).join("config.json")).unwrap()).unwrap();
    let c = &config.get("text_config").unwrap_or(&config);
    let n = c["num_hidden_layers"].as_u64().unwrap();
    let h = n / 2;
    format!(
        "[placement.layers]\n\"{first}\" = \"0-{}\"\n\"{second}\" = \"{h}-{}\"\n",
        h - 1,
        n - 1
    )
}

/// Loads fixture `case` as `--backend backend` with `placement` in the config; also returns
/// the notices.
fn load_case(case: &str, backend: &str, placement: &str, chunk: usize) -> (Loaded, Vec<Notice>) {
    load_options(&options(case, backend, chunk), placement)
}

/// Loads as `opts` say, with `placement` in the config; also returns the notices.
fn load_options(opts: &ModelOptions, placement: &str) -> (Loaded, Vec<Notice>) {
    let mut notices = Vec::new();
    let loaded = load(
        &search(),
        &settings(placement),
        opts,
        1,
        &mut |n| notices.push(n),
        &mut |_: u64, _: u64| {},
    )
    .unwrap_or_else(|e| {
        // The whole chain: an upload error's cause is in its source.
        let mut why = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            why.push_str(&format!(": {c}"));
            cause = c.source();
        }
        panic!("loading {opts:?} with {placement:?}: {why}")
    });
    (loaded, notices)
}

/// [`load_case`] of [`FIXTURE`].
fn load_with(backend: &str, placement: &str, chunk: usize) -> (Loaded, Vec<Notice>) {
    load_case(FIXTURE, backend, placement, chunk)
}

/// Plans [`FIXTURE`] as [`load_with`] would load it.
fn plan_with(backend: &str, placement: &str, chunk: usize) -> Planned {
    plan_options(&options(FIXTURE, backend, chunk), placement)
}

/// Plans as [`load_options`] would load.
fn plan_options(opts: &ModelOptions, placement: &str) -> Planned {
    plan(&search(), &settings(placement), opts, 1, &mut |_| {})
        .unwrap_or_else(|e| panic!("planning {opts:?} with {placement:?}: {e}"))
}

fn report(backend: &str, placement: &str, chunk: usize) -> PlacementReport {
    plan_with(backend, placement, chunk).report()
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .fold(0, |b, (i, x)| if *x > v[b] { i } else { b }) as u32
}

/// Asserts `got` is within `tol` x the largest magnitude of `want`, and has its argmax.
fn assert_row(label: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{label}: vocabulary");
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let (worst, err) = got
        .iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).abs())
        .enumerate()
        .fold((0, 0.0f64), |b, (i, e)| if e > b.1 { (i, e) } else { b });
    assert!(
        got.iter().all(|g| g.is_finite()) && err <= tol * scale,
        "{label}: logit {worst} is {}, expected {} (error {err:.3e} > {tol} x {scale})",
        got[worst],
        want[worst]
    );
    let want_best = want
        .iter()
        .enumerate()
        .fold(0, |b, (i, v)| if *v > want[b] { i } else { b });
    assert_eq!(argmax(got) as usize, want_best, "{label}: argmax");
}

/// Every reference sequence: its first `prefilled` tokens prefilled (logits of every row), the
/// rest decoded one step at a time, each position's logits against transformers'.
fn assert_sequences(label: &str, session: &mut Session, r: &Value, prefilled: usize, tol: f64) {
    for (si, seq) in r["sequences"].as_array().unwrap().iter().enumerate() {
        let tokens = ids(&seq["tokens"]);
        let want: Vec<Vec<f64>> = serde_json::from_value(seq["logits"].clone()).unwrap();
        let vocab = want[0].len();
        session.reset(0);
        let got = session.prefill(0, &tokens[..prefilled], true).unwrap();
        assert_eq!(got.len(), prefilled * vocab, "{label}: prefill logits");
        for p in 0..prefilled {
            let row = &got[p * vocab..(p + 1) * vocab];
            assert_row(
                &format!("{label}: sequence {si}, prefilled position {p}"),
                row,
                &want[p],
                tol,
            );
        }
        for (p, &t) in tokens.iter().enumerate().skip(prefilled) {
            let got = session.step(Step::decode(&[t], &[0], &[0])).unwrap();
            assert_row(
                &format!("{label}: sequence {si}, decoded position {p}"),
                got,
                &want[p],
                tol,
            );
        }
        assert_eq!(session.len(0), tokens.len(), "{label}: cached tokens");
    }
}

/// Greedy continuations of the reference prompts that fit the context.
fn greedy(loaded: &mut Loaded, r: &Value) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    for g in r["greedy"].as_array().unwrap() {
        let prompt = ids(&g["prompt"]);
        let n = g["max_new_tokens"].as_u64().unwrap() as usize;
        if prompt.len() + n > CONTEXT {
            continue;
        }
        let got = tandem_conformance::greedy_ids(&mut loaded.session, &loaded.tokenizer, &prompt, n);
        out.push(got);
    }
    out
}

/// Checks one placement: its units, the note naming the split, transformers' logits at every
/// position, and the single CPU backend's greedy continuations (which are transformers').
fn check_placement(case: &str, label: &str, backend: &str, placement: &str, units: &[&str], tol: f64) {
    let label = &format!("{case}, {label}");
    let r = reference(case);
    let (mut cpu, _) = load_case(case, "cpu", "", CHUNK);
    let want_greedy = greedy(&mut cpu, &r);
    assert!(!want_greedy.is_empty(), "no greedy prompt fits the context");
    let reference_greedy: Vec<Vec<u32>> = r["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| ids(&g["prompt"]).len() + g["max_new_tokens"].as_u64().unwrap() as usize <= CONTEXT)
        .map(|g| ids(&g["generated"]))
        .collect();
    assert_eq!(
        want_greedy, reference_greedy,
        "{case}: the CPU backend's greedy continuations"
    );

    let (mut split, notices) = load_case(case, backend, placement, CHUNK);
    assert_eq!(split.session.unit_names(), units, "{label}: units");
    assert!(
        notices
            .iter()
            .any(|n| matches!(n, Notice::Note(m) if m.starts_with("placement ("))),
        "{label}: no note naming the split: {notices:?}"
    );
    // The first six tokens of each sequence (16 and 12 long) prefilled in chunks of 4 and 2, the
    // rest decoded: the decode steps run past every sliding window, on the other phase's unit
    // where the phases differ (after the KV hand-off).
    assert_sequences(label, &mut split.session, &r, 6, tol);
    assert_eq!(greedy(&mut split, &r), want_greedy, "{label}: greedy");
}

// ---------------------------------------------------------------------------------------------
// a. Splits give the single backend's results.

#[test]
fn cpu_plus_cpu_matches_cpu_and_transformers() {
    for case in CASES {
        check_placement(case, "cpu+cpu", "cpu+cpu", "", &["cpu#2", "cpu"], CPU_TOL);
    }
}

#[test]
fn vulkan_splits_match_cpu_and_transformers() {
    if !vulkan_available() {
        return;
    }
    let cases: [(&str, &str, &str, &[&str]); 5] = [
        ("cpu+vulkan", "cpu+vulkan", "", &["cpu", "vulkan"]),
        // Two Vulkan instances: every boundary is a real copy between two device contexts.
        ("vulkan+vulkan", "vulkan+vulkan", "", &["vulkan#2", "vulkan"]),
        ("vulkan+cpu", "vulkan+cpu", "", &["vulkan", "cpu"]),
        (
            "prefill on vulkan, decode on cpu",
            "auto",
            PREFILL_VULKAN_DECODE_CPU,
            &["vulkan", "cpu"],
        ),
        (
            "prefill on cpu, decode on vulkan",
            "auto",
            PREFILL_CPU_DECODE_VULKAN,
            &["cpu", "vulkan"],
        ),
    ];
    for case in CASES {
        for (label, backend, placement, units) in cases {
            check_placement(case, label, backend, placement, units, VULKAN_TOL);
        }
    }
}

/// Whole layers per unit (`[placement.layers]`, `--gpu-layers`) give the single CPU backend's
/// greedy continuations and transformers' logits, prefilled and decoded.
#[test]
fn layer_splits_match_cpu_and_transformers() {
    for case in CASES {
        let placement = halves(case, "cpu", "cpu#2");
        check_placement(
            case,
            "layers cpu/cpu",
            "auto",
            &placement,
            &["cpu", "cpu#2"],
            CPU_TOL,
        );
    }
    // The host path forced: every boundary waited for and copied by the host.
    check_placement(
        FIXTURE,
        "layers cpu/cpu, host boundaries",
        "auto",
        &format!("{HOST_BOUNDARIES}{}", halves(FIXTURE, "cpu", "cpu#2")),
        &["cpu", "cpu#2"],
        CPU_TOL,
    );
    if !vulkan_available() {
        return;
    }
    for case in CASES {
        let cases = [
            (
                "layers cpu/vulkan",
                "auto",
                halves(case, "cpu", "vulkan"),
                ["cpu", "vulkan"],
            ),
            (
                "layers vulkan/cpu",
                "auto",
                halves(case, "vulkan", "cpu"),
                ["cpu", "vulkan"],
            ),
            (
                "--gpu-layers 1",
                "vulkan --gpu-layers 1",
                String::new(),
                ["vulkan", "cpu"],
            ),
        ];
        for (label, backend, placement, units) in &cases {
            check_placement(case, label, backend, placement, units, VULKAN_TOL);
        }
    }
    check_placement(
        FIXTURE,
        "layers vulkan/cpu, host boundaries",
        "auto",
        &format!("{HOST_BOUNDARIES}{}", halves(FIXTURE, "vulkan", "cpu")),
        &["cpu", "vulkan"],
        VULKAN_TOL,
    );
}

/// `[placement] boundaries = "host"`: the host path, whatever the units could share.
const HOST_BOUNDARIES: &str = "[placement]\nboundaries = \"host\"\n";

/// Device-side boundaries where the units allow them: on a CPU layer split the hidden state
/// lives in host memory both units imported, so nothing is copied (the CPU has no timeline to
/// wait on: the host hands over, in `device` mode too); forcing the host path copies it there
/// and back every step, and every mode gives the same logits, bit for bit. With Vulkan on one side, Vulkan imports host
/// memory where the device has VK_EXT_external_memory_host (lavapipe does).
#[test]
fn device_boundaries_share_what_the_host_path_copies() {
    let tokens = ids(&reference(FIXTURE)["sequences"][0]["tokens"]);
    let mut pairs = vec![("cpu", "cpu#2")];
    if vulkan_available() {
        pairs.push(("vulkan", "cpu"));
    }
    for (first, second) in pairs {
        let layers = halves(FIXTURE, first, second);
        let hidden = plan_with("auto", &layers, CHUNK).model.config.hidden_size as u64;
        let mut logits = Vec::new();
        for mode in ["", "device", "shared", "host"] {
            let host = mode == "host";
            let placement = match mode {
                "" => layers.clone(),
                m => format!("[placement]\nboundaries = \"{m}\"\n{layers}"),
            };
            let (mut loaded, _) = load_with("auto", &placement, CHUNK);
            let s = &mut loaded.session;
            s.prefill(0, &tokens[..CHUNK], false).unwrap();
            let mut got = Vec::new();
            for (i, &t) in tokens[CHUNK..CHUNK + 3].iter().enumerate() {
                got.extend_from_slice(s.step(Step::decode(&[t], &[0], &[0])).unwrap());
                let c = s.boundary_counts();
                let label = format!("{first}/{second}, boundaries {mode:?}, step {i}");
                assert_eq!(c.shared_values + c.copied_values, 2, "{label}: {c:?}");
                if host {
                    assert_eq!((c.shared_values, c.device_waits), (0, 0), "{label}: {c:?}");
                    assert_eq!(c.host_waits, 2, "{label}: {c:?}");
                } else if first == "cpu" {
                    assert_eq!((c.shared_values, c.copied_values), (2, 0), "{label}: {c:?}");
                }
            }
            let moved = s.moved_bytes().0;
            let copied = s.boundary_counts().copied_values as u64;
            // The prefill chunk and the three decode steps, each value copied once.
            assert_eq!(
                moved,
                copied * hidden * 4 * (CHUNK as u64 + 3),
                "{first}/{second}, boundaries {mode:?}"
            );
            logits.push(got);
        }
        assert!(
            logits.iter().all(|l| *l == logits[0]),
            "{first}/{second}: the boundary modes give different logits"
        );
    }
}

/// A layer split crosses once per direction per step: the hidden state at the cut, and back to
/// the head's unit; the report says so, and names what runs where.
#[test]
fn a_layer_split_crosses_at_the_cut_only() {
    let placement = halves(FIXTURE, "cpu", "cpu#2");
    let r = report("auto", &placement, CHUNK);
    assert_eq!(
        r.programs_per_step,
        (3, 3),
        "embedding and layers 0-2, layers 3-5, head"
    );
    let hidden = plan_with("auto", &placement, CHUNK).model.config.hidden_size as u64;
    assert_eq!(
        r.decode_bytes_per_token,
        2 * hidden * 4,
        "the hidden state there and back"
    );
    assert_eq!(
        r.layers.as_deref(),
        Some("cpu: layers 0-2, embedding, head; cpu#2: layers 3-5"),
        "the layer rule, as `engine placement` prints it on its `layers:` line"
    );
}

/// Layer rules and budgets the model cannot take are errors naming the flag or the key and
/// the sizes, before anything is uploaded.
#[test]
fn bad_layer_rules_and_budgets_are_named() {
    let err = |backend: &str, placement: &str| match plan(
        &search(),
        &settings(placement),
        &options(FIXTURE, backend, CHUNK),
        1,
        &mut |_| {},
    ) {
        Ok(_) => panic!("{backend} with {placement:?} planned"),
        Err(e) => e.to_string(),
    };
    let e = err("auto", "[placement.layers]\ncpu = \"0-2\"\n\"cpu#2\" = \"3-9\"\n");
    assert!(e.contains("cpu#2 = \"3-9\": the model has layers 0-5"), "{e}");
    let e = err("auto", "[placement.layers]\ncpu = \"0-3\"\n\"cpu#2\" = \"3-5\"\n");
    assert!(e.contains("layer 3 is in both cpu's and cpu#2's"), "{e}");
    let e = err("auto", "[placement.layers]\ncpu = \"0-1\"\n\"cpu#2\" = \"4-5\"\n");
    assert!(e.contains("layers 2-3 are on no unit"), "{e}");
    let e = err("cpu --gpu-layers 2", "");
    assert!(e.contains("--gpu-layers 2") && e.contains("GPU backend"), "{e}");
    let e = err("cpu+cpu --gpu-layers 2", "");
    assert!(e.contains("--gpu-layers 2") && e.contains("one backend"), "{e}");
    let e = err("auto --gpu-layers 2", "[placement]\nffn = [\"cpu\"]\n");
    assert!(e.contains("--gpu-layers 2") && e.contains("[placement]"), "{e}");
    // A budget too small for the model (the CPU reports the host's memory, capped by the option).
    let e = err("cpu", "[backend.cpu]\nmemory_limit = \"64KiB\"\n");
    assert!(
        e.contains("does not fit cpu") && e.contains("memory_limit = \"64KiB\"") && e.contains("weights"),
        "{e}"
    );
    if vulkan_available() {
        let e = err("vulkan --gpu-layers 7", "");
        assert!(e.contains("--gpu-layers 7: the model has 6 layers"), "{e}");
    }
}

/// Under `--backend auto`, a model larger than its unit's budget is split by layers: as many as
/// fit stay there, the rest go to the CPU, and a note says so. Named explicitly, the same unit
/// is an error that names the `--gpu-layers` that would fit.
#[test]
fn a_budget_splits_by_layers_under_auto_and_is_named_otherwise() {
    if !vulkan_available() {
        return;
    }
    let whole = plan_with("vulkan", "", CHUNK).report();
    let need = whole.units[0].need_bytes();
    // Room for about half the model on Vulkan.
    let limit = need / 2 + whole.units[0].activation_bytes / 2;
    // auto's own order passes over lavapipe (a software GPU): name the order.
    let placement = format!(
        "[backend.vulkan]\nmemory_limit = \"{limit}\"\n[placement]\ndefault = [\"vulkan\", \"cpu\"]\n"
    );
    let e = match plan(
        &search(),
        &settings(&placement),
        &options(FIXTURE, "vulkan", CHUNK),
        1,
        &mut |_| {},
    ) {
        Ok(_) => panic!("vulkan over its budget planned"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("does not fit vulkan") && e.contains("--gpu-layers "),
        "{e}"
    );
    let mut notices = Vec::new();
    let planned = plan(
        &search(),
        &settings(&placement),
        &options(FIXTURE, "auto", CHUNK),
        1,
        &mut |n| notices.push(n),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let r = planned.report();
    let layers = r.layers.clone().unwrap_or_default();
    assert!(layers.starts_with("vulkan: layers 0-"), "{layers}");
    assert!(r.units.iter().all(|u| !u.over_budget()), "{:#?}", r.units);
    assert!(
        notices
            .iter()
            .any(|n| matches!(n, Notice::Note(m) if m.contains("layers fit there"))),
        "{notices:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// b. The bytes copied between units are the report's.

#[test]
fn host_copies_are_what_the_report_predicts() {
    let (chunk, decode_steps) = (5usize, 3u64);
    let split = report("cpu+cpu", "", chunk);
    assert!(split.is_split(), "cpu+cpu is a split");
    assert_eq!(split.prefill_chunk, chunk);
    assert_eq!(
        split.units.iter().map(|u| u.name.as_str()).collect::<Vec<_>>(),
        ["cpu#2", "cpu"]
    );
    // Per layer, the attention block (on cpu#2) reads the normed hidden state and hands back its
    // output projection: two [rows, hidden] f32 values cross per layer and row.
    let planned = plan_with("cpu+cpu", "", chunk);
    let c = &planned.model.config;
    let per_row = (c.num_hidden_layers * 2 * c.hidden_size * 4) as u64;
    assert_eq!(split.decode_bytes_per_token, per_row);
    assert_eq!(split.prefill_bytes_per_token, per_row as f64);
    assert_eq!(
        (split.kv_handoff_layers, split.kv_handoff_bytes_per_token),
        (0, 0)
    );

    // The host path forced (device-side boundaries share these values instead of copying).
    let (mut loaded, _) = load_with("cpu+cpu", HOST_BOUNDARIES, chunk);
    let tokens = ids(&reference(FIXTURE)["sequences"][0]["tokens"]);
    let s = &mut loaded.session;
    s.prefill(0, &tokens[..chunk], false).unwrap();
    let prefill = (split.prefill_bytes_per_token * chunk as f64).round() as u64;
    assert_eq!(
        s.moved_bytes(),
        (prefill, 0),
        "after a prefill step of {chunk} rows"
    );
    for (i, &t) in tokens[chunk..].iter().take(decode_steps as usize).enumerate() {
        s.step(Step::decode(&[t], &[0], &[0])).unwrap();
        assert_eq!(
            s.moved_bytes(),
            (prefill + (i as u64 + 1) * split.decode_bytes_per_token, 0),
            "after {} decode steps",
            i + 1
        );
    }

    // The whole model on one backend copies nothing.
    let whole = report("cpu", "", chunk);
    assert!(!whole.is_split());
    assert_eq!(whole.decode_bytes_per_token, 0);
    assert_eq!(whole.prefill_bytes_per_token, 0.0);
    assert_eq!(whole.programs_per_step, (1, 1));
    let (mut loaded, _) = load_with("cpu", "", chunk);
    loaded.session.prefill(0, &tokens[..chunk], false).unwrap();
    loaded
        .session
        .step(Step::decode(&[tokens[chunk]], &[0], &[0]))
        .unwrap();
    assert_eq!(loaded.session.moved_bytes(), (0, 0));
}

// ---------------------------------------------------------------------------------------------
// c. The KV cache handed between phases is the report's.

#[test]
fn kv_handoff_between_phases_is_what_the_report_predicts() {
    if !vulkan_available() {
        return;
    }
    let r = reference(FIXTURE);
    let tokens = ids(&r["sequences"][0]["tokens"]);
    let want: Vec<Vec<f64>> = serde_json::from_value(r["sequences"][0]["logits"].clone()).unwrap();
    for placement in [PREFILL_VULKAN_DECODE_CPU, PREFILL_CPU_DECODE_VULKAN] {
        let rep = report("auto", placement, CHUNK);
        let planned = plan_with("auto", placement, CHUNK);
        let c = &planned.model.config;
        let row = (c.num_key_value_heads * c.head_dim * 4) as u64;
        // Every layer's attention changes units between the phases; nothing crosses inside one.
        assert_eq!(rep.kv_handoff_layers, c.num_hidden_layers, "{placement}");
        assert_eq!(
            rep.kv_handoff_bytes_per_token,
            2 * row * c.num_hidden_layers as u64,
            "{placement}"
        );
        assert_eq!(
            (rep.decode_bytes_per_token, rep.prefill_bytes_per_token),
            (0, 0.0)
        );
        let capacities: Vec<u64> = planned
            .model
            .layers
            .iter()
            .map(|l| l.cache.capacity as u64)
            .collect();
        drop(planned);

        // A prompt shorter than every cache (the sliding window is 4).
        let p = 3usize;
        assert!(capacities.iter().all(|&cap| cap > p as u64), "{capacities:?}");
        let (mut loaded, _) = load_with("auto", placement, CHUNK);
        let s = &mut loaded.session;
        s.prefill(0, &tokens[..p], false).unwrap();
        assert_eq!(s.moved_bytes(), (0, 0), "{placement}: prefill hands nothing over");
        s.step(Step::decode(&[tokens[p]], &[0], &[0])).unwrap();
        let first = rep.kv_handoff_bytes_per_token * p as u64;
        assert_eq!(s.moved_bytes(), (0, first), "{placement}: the first decode step");
        let got = s.step(Step::decode(&[tokens[p + 1]], &[0], &[0])).unwrap();
        assert_row(
            &format!("{placement}: position {}", p + 1),
            got,
            &want[p + 1],
            VULKAN_TOL,
        );
        assert_eq!(s.moved_bytes(), (0, first), "{placement}: the second decode step");

        // Continuing the sequence with a prefill hands its 5 cached rows back to the prefill
        // unit, and the logits still follow the reference.
        let len = s.len(0) as u64;
        let got = s.prefill(0, &tokens[p + 2..p + 4], false).unwrap();
        assert_row(
            &format!("{placement}: position {}", p + 3),
            &got,
            &want[p + 3],
            VULKAN_TOL,
        );
        let back = first + rep.kv_handoff_bytes_per_token * len;
        assert_eq!(s.moved_bytes(), (0, back), "{placement}: the continuing prefill");

        // A prompt longer than the sliding layers' rings: each layer hands over what its cache
        // holds, at most its capacity.
        s.reset(0);
        let long = 12usize;
        s.prefill(0, &tokens[..long], false).unwrap();
        s.step(Step::decode(&[tokens[long]], &[0], &[0])).unwrap();
        let held: u64 = capacities.iter().map(|&cap| 2 * row * cap.min(long as u64)).sum();
        assert!(
            held < rep.kv_handoff_bytes_per_token * long as u64,
            "{capacities:?}"
        );
        assert_eq!(
            s.moved_bytes(),
            (0, back + held),
            "{placement}: a {long}-token prompt"
        );
    }
}

#[test]
fn f16_kv_caches_are_handed_over_at_two_bytes_a_value() {
    // Prefill attention on the emulated NPU, decode all on the CPU: every layer's f16 cache
    // crosses at its own width (not f32's), and the decoded logits still follow transformers.
    let placement = "[placement.prefill]\nattention = [\"npu-emu\", \"cpu\"]\nffn = [\"cpu\"]\ndefault = [\"cpu\"]\n[placement.decode]\nattention = [\"cpu\"]\nffn = [\"cpu\"]\ndefault = [\"cpu\"]\n";
    let mut opts = options(FIXTURE, "auto", CHUNK);
    opts.kv_cache = KvCacheType::F16;
    let planned = plan_options(&opts, placement);
    let c = planned.model.config.clone();
    let rep = planned.report();
    drop(planned);
    let row = (c.num_key_value_heads * c.head_dim * 2) as u64;
    assert_eq!(rep.kv_handoff_layers, c.num_hidden_layers);
    assert_eq!(
        rep.kv_handoff_bytes_per_token,
        2 * row * c.num_hidden_layers as u64
    );

    let (mut loaded, _) = load_options(&opts, placement);
    assert_eq!(loaded.session.unit_names(), ["npu-emu", "cpu"]);
    let r = reference(FIXTURE);
    let tokens = ids(&r["sequences"][0]["tokens"]);
    let want: Vec<Vec<f64>> = serde_json::from_value(r["sequences"][0]["logits"].clone()).unwrap();
    let s = &mut loaded.session;
    let p = 3usize;
    s.prefill(0, &tokens[..p], false).unwrap();
    for (i, &t) in tokens.iter().enumerate().skip(p).take(6) {
        let got = s.step(Step::decode(&[t], &[0], &[0])).unwrap();
        // The fixtures' f16-cache tolerance (cli/tests/fixtures.rs).
        assert_row(&format!("f16 caches: position {i}"), got, &want[i], 1e-2);
    }
    assert_eq!(
        s.moved_bytes().1,
        rep.kv_handoff_bytes_per_token * p as u64,
        "the prompt's cached rows, handed over once"
    );
}

// ---------------------------------------------------------------------------------------------
// d. No allocation per decode step.

/// Counts the allocations of the engine side only: the session, the scheduler and the plugin
/// loader's calls on this thread. The CPU plugin is a separate cdylib with its own global
/// allocator (and its own threads), so nothing it allocates is counted here;
/// backend-cpu/tests/no_alloc.rs covers its side. Counting is per thread, so the other tests of
/// this binary, running alongside, are not counted either.
#[test]
fn decode_steps_of_a_split_allocate_nothing() {
    let tokens = ids(&reference(FIXTURE)["sequences"][0]["tokens"]);
    let steps = 20;
    let mut counts = Vec::new();
    let layers = halves(FIXTURE, "cpu", "cpu#2");
    let host_layers = format!("{HOST_BOUNDARIES}{layers}");
    for (backend, placement) in [
        ("cpu", ""),
        ("cpu+cpu", ""),
        ("cpu+cpu", HOST_BOUNDARIES),
        ("auto", layers.as_str()),
        ("auto", host_layers.as_str()),
    ] {
        let (mut loaded, _) = load_with(backend, placement, CHUNK);
        let s = &mut loaded.session;
        let logits = s.prefill(0, &tokens[..CHUNK], false).unwrap();
        let mut next = argmax(&logits);
        // Warm-up: the first decode step builds and compiles the decode programs.
        for _ in 0..3 {
            next = argmax(s.step(Step::decode(&[next], &[0], &[0])).unwrap());
        }
        let (last, allocations) = count_allocations(|| {
            let mut next = next;
            for _ in 0..steps {
                next = argmax(s.step(Step::decode(&[next], &[0], &[0])).unwrap());
            }
            next
        });
        assert!((last as usize) < s.vocab(), "{backend}: a token id");
        assert_eq!(s.len(0), CHUNK + 3 + steps, "{backend}: cached tokens");
        if placement.starts_with(HOST_BOUNDARIES) {
            assert!(
                s.moved_bytes().0 > 0,
                "{backend} {placement}: copies between its units"
            );
        } else if backend != "cpu" {
            assert!(
                s.boundary_counts().shared_values > 0 && s.moved_bytes().0 == 0,
                "{backend} {placement}: values shared between its units, not copied"
            );
        }
        counts.push((backend, allocations));
    }
    assert!(
        counts.iter().all(|&(_, n)| n == 0),
        "allocations in {steps} decode steps: {counts:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// e. Pipelined micro-batches.

/// A split batched decode step cut into micro-batches (`[placement] micro_batches`) gives the
/// logits of the same step run whole, sequence by sequence, and allocates nothing once warm.
#[test]
fn micro_batches_give_the_logits_of_whole_steps() {
    let tokens = ids(&reference(FIXTURE)["sequences"][0]["tokens"]);
    let batch = 3usize;
    for layers in ["", halves(FIXTURE, "cpu", "cpu#2").as_str()] {
        micro_batches_match(&tokens, batch, layers);
    }
}

/// [`micro_batches_give_the_logits_of_whole_steps`] on `cpu+cpu`, or on a layer split where
/// `layers` (a `[placement.layers]` table) says.
fn micro_batches_match(tokens: &[u32], batch: usize, layers: &str) {
    let backend = if layers.is_empty() { "cpu+cpu" } else { "auto" };
    let load_batched = |placement: &str| {
        load(
            &search(),
            &settings(&format!("{placement}{layers}")),
            &options(FIXTURE, backend, CHUNK),
            batch,
            &mut |_| {},
            &mut |_: u64, _: u64| {},
        )
        .unwrap_or_else(|e| panic!("loading with {placement:?}: {e}"))
    };
    let mut whole = load_batched("");
    let mut piped = load_batched("[placement]\nmicro_batches = 2\n");
    let slots: Vec<u32> = (0..batch as u32).collect();
    for s in [&mut whole.session, &mut piped.session] {
        for (i, &slot) in slots.iter().enumerate() {
            s.prefill(slot, &tokens[i..i + 2], false).unwrap();
        }
    }
    let vocab = whole.session.vocab();
    let mut next: Vec<u32> = tokens[..batch].to_vec();
    for step in 0..4 {
        let want = whole
            .session
            .step(Step::decode(&next, &slots, &slots))
            .unwrap()
            .to_vec();
        let (got, allocations) = count_allocations(|| {
            piped
                .session
                .step(Step::decode(&next, &slots, &slots))
                .unwrap()
                .to_vec()
        });
        assert_eq!(got.len(), batch * vocab);
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= 1e-5,
            "step {step}: micro-batched logits differ by {worst}"
        );
        if step >= 2 {
            // `to_vec` above is the test's own allocation.
            assert_eq!(allocations, 1, "step {step}: allocations besides the test's copy");
        }
        next = want.chunks_exact(vocab).map(argmax).collect();
    }
    assert_eq!(whole.session.last_step_micro_batches(), 1);
    assert_eq!(piped.session.last_step_micro_batches(), 2);
    // Both micro-batches crossed the same boundaries the whole step crosses.
    assert_eq!(whole.session.moved_bytes().0, piped.session.moved_bytes().0);
}

/// A prompt on a layer split fed in micro-batches (`[placement] prefill_micro_batches`, pieces
/// of unequal rows) gives the logits of the same steps run whole: the last row's, every row's
/// (scoring), and the decode steps after it (the pieces' keys and values in both units' caches).
#[test]
fn prefill_micro_batches_give_the_logits_of_whole_steps() {
    let chunk = 7;
    // Two steps: 7 rows, then 5.
    let tokens = ids(&reference(FIXTURE)["sequences"][0]["tokens"])[..chunk + 5].to_vec();
    let layers = halves(FIXTURE, "cpu", "cpu#2");
    let load_with = |placement: &str| {
        load(
            &search(),
            &settings(&format!("{placement}{layers}")),
            &options(FIXTURE, "auto", chunk),
            1,
            &mut |_| {},
            &mut |_: u64, _: u64| {},
        )
        .unwrap_or_else(|e| panic!("loading with {placement:?}: {e}"))
    };
    let worst = |a: &[f32], b: &[f32]| {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
    };
    // The last row's logits, then three greedy decode steps' logits.
    let run = |s: &mut Session| {
        let mut out = vec![s.prefill(0, &tokens, false).unwrap()];
        let pieces = s.last_step_micro_batches();
        for _ in 0..3 {
            let next = [argmax(out.last().unwrap())];
            out.push(s.step(Step::decode(&next, &[0], &[0])).unwrap().to_vec());
        }
        (out, pieces)
    };
    let (want, pieces) = run(&mut load_with("").session);
    assert_eq!(pieces, 1);
    let want_all = load_with("").session.prefill(0, &tokens, true).unwrap();
    for m in [2usize, 3] {
        let placement = format!("[placement]\nprefill_micro_batches = {m}\n");
        let (got, pieces) = run(&mut load_with(&placement).session);
        assert_eq!(pieces, m, "the prompt's last step ran in {m} pieces");
        for (step, (g, w)) in got.iter().zip(&want).enumerate() {
            let d = worst(g, w);
            assert!(d <= 1e-5, "{m} pieces, step {step}: logits differ by {d}");
        }
        let mut scoring = load_with(&placement);
        let all = scoring.session.prefill(0, &tokens, true).unwrap();
        assert_eq!(scoring.session.last_step_micro_batches(), m);
        let d = worst(&all, &want_all);
        assert!(d <= 1e-5, "{m} pieces, every row's logits differ by {d}");
    }
    // Each piece at least `min_rows` rows: the last step's 5 rows in 2 pieces at 2, whole at 3
    // (the default where layers are spread over devices: 4 pieces of at least 64 rows).
    for (min_rows, want_pieces) in [(2usize, 2usize), (3, 1)] {
        let mut l = load_with("");
        l.session.set_prefill_micro_batches(4, min_rows);
        let (got, pieces) = run(&mut l.session);
        assert_eq!(pieces, want_pieces, "4 pieces of at least {min_rows} rows");
        for (step, (g, w)) in got.iter().zip(&want).enumerate() {
            let d = worst(g, w);
            assert!(
                d <= 1e-5,
                "pieces of {min_rows} rows, step {step}: logits differ by {d}"
            );
        }
    }
    // On one unit the setting does nothing, and a note says so.
    let mut notes = Vec::new();
    let one = load(
        &search(),
        &settings("[placement]\nprefill_micro_batches = 2\n"),
        &options(FIXTURE, "cpu", chunk),
        1,
        &mut |n| notes.push(n.to_string()),
        &mut |_: u64, _: u64| {},
    )
    .unwrap();
    assert!(!one.session.prompt_changes_unit(chunk));
    assert!(
        notes
            .iter()
            .any(|n| n.contains("prefill_micro_batches = 2 does nothing here")),
        "{notes:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// f. `--backend auto` by measurement.

/// Calibration measures every candidate placement, picks the fastest decode, caches the figures
/// under the key, and answers the same key from the cache without measuring.
#[test]
fn calibration_measures_each_candidate_and_caches_the_choice() {
    use tandem_engine::runtime::calibrate::{calibrate, candidates, describe, key, Choice};
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("calibration.json");
    let names = vec!["cpu".to_string()];
    let mut cands = candidates(&names);
    cands.push(Choice::whole("cpu+cpu"));
    let opts = options(FIXTURE, "auto", CHUNK);
    let model = fixture(FIXTURE);
    let k = key(&model, &["cpu=host".to_string()], &cands);
    let mut notes = Vec::new();
    let (first, from_cache) = calibrate(
        &search().discover(),
        &settings(""),
        &opts,
        &cands,
        &k,
        Some(&cache),
        // Progress lines (one per candidate measured) are for a terminal.
        &mut |n| {
            if !n.is_progress() {
                notes.push(n)
            }
        },
    )
    .unwrap();
    assert!(!from_cache);
    assert!(notes.is_empty(), "{notes:?}");
    let placed: Vec<String> = first.figures.iter().map(|m| m.choice.to_string()).collect();
    assert_eq!(placed, ["cpu", "cpu+cpu"]);
    assert!(first
        .figures
        .iter()
        .all(|m| m.decode_tokens_per_s > 0.0 && m.prefill_tokens_per_s > 0.0));
    let best = first
        .figures
        .iter()
        .max_by(|a, b| a.decode_tokens_per_s.total_cmp(&b.decode_tokens_per_s))
        .unwrap();
    assert_eq!(first.choice, best.choice);
    assert!(describe(&first, None).starts_with(&format!("auto chose {} by measurement", first.choice)));
    // The same key again: from the cache, identical figures.
    let (again, from_cache) = calibrate(
        &search().discover(),
        &settings(""),
        &opts,
        &cands,
        &k,
        Some(&cache),
        &mut |_| {},
    )
    .unwrap();
    assert!(from_cache);
    assert_eq!((&again.key, &again.choice), (&first.key, &first.choice));
    assert_eq!(again.figures.len(), first.figures.len());
    for (a, b) in again.figures.iter().zip(&first.figures) {
        // JSON keeps a float to within its last digit.
        assert_eq!(a.choice, b.choice);
        assert!((a.decode_tokens_per_s / b.decode_tokens_per_s - 1.0).abs() < 1e-12);
        assert!((a.prefill_tokens_per_s / b.prefill_tokens_per_s - 1.0).abs() < 1e-12);
    }
    // A placement that cannot run is left out with a note; the others still decide.
    let bad = vec![Choice::whole("cpu"), Choice::whole("npu")];
    let mut notes = Vec::new();
    let (c, _) = calibrate(
        &search().discover(),
        &settings(""),
        &opts,
        &bad,
        "other",
        None,
        // Progress lines (one per candidate measured) are for a terminal.
        &mut |n| {
            if !n.is_progress() {
                notes.push(n)
            }
        },
    )
    .unwrap();
    assert_eq!(c.choice, Choice::whole("cpu"));
    assert_eq!(notes.len(), 1, "{notes:?}");
}

/// A model too large for the GPU whole is calibrated over layer splits: `vulkan --gpu-layers 1`
/// (lavapipe in CI) is measured beside the CPU alone, its count kept through the cache.
#[test]
fn calibration_measures_a_layer_split() {
    use tandem_engine::runtime::calibrate::{calibrate, Choice};
    let discovery = search().discover();
    if let Err(e) = discovery.create("vulkan", &Default::default()) {
        if std::env::var_os("CI").is_some() {
            panic!("CI runs Vulkan on lavapipe: {e}");
        }
        eprintln!("skipping: {e}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("calibration.json");
    let cands = vec![Choice::first_layers("vulkan", 1), Choice::whole("cpu")];
    let opts = options(FIXTURE, "auto", CHUNK);
    let mut notes = Vec::new();
    let (c, from_cache) = calibrate(
        &discovery,
        &settings(""),
        &opts,
        &cands,
        "layers",
        Some(&cache),
        // Progress lines (one per candidate measured) are for a terminal.
        &mut |n| {
            if !n.is_progress() {
                notes.push(n)
            }
        },
    )
    .unwrap();
    assert!(!from_cache);
    assert!(notes.is_empty(), "{notes:?}");
    let measured: Vec<&Choice> = c.figures.iter().map(|m| &m.choice).collect();
    assert_eq!(measured, [&cands[0], &cands[1]]);
    assert!(c.figures.iter().all(|m| m.decode_tokens_per_s > 0.0));
    assert!(cands.contains(&c.choice));
    let (again, from_cache) = calibrate(
        &discovery,
        &settings(""),
        &opts,
        &cands,
        "layers",
        Some(&cache),
        &mut |_| {},
    )
    .unwrap();
    assert!(from_cache);
    assert_eq!(again.figures[0].choice.gpu_layers, Some(1));
    assert_eq!(again.choice, c.choice);
}

// ---------------------------------------------------------------------------------------------
// g. The default model, split.

/// The real default model split across two CPU instances (attention apart, and by layers): the
/// last logits within the CPU tolerance of transformers', and transformers' greedy
/// continuations.
#[test]
fn the_default_model_split_matches_transformers() {
    let Some(path) = tandem_conformance::default_model_or_skip() else {
        return;
    };
    let r: Value = serde_json::from_str(
        &std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/gemma3-270m/reference.json"),
        )
        .unwrap(),
    )
    .unwrap();
    // The attention split, and half the layers on each of two CPU instances.
    let layers = "[placement.layers]\ncpu = \"0-8\"\n\"cpu#2\" = \"9-17\"\n";
    for (backend, placement, units) in [
        ("cpu+cpu", "", ["cpu#2", "cpu"]),
        ("auto", layers, ["cpu", "cpu#2"]),
    ] {
        let opts = ModelOptions {
            model: Some(path.clone()),
            backend: backend.into(),
            context: Some(128),
            chunk: 64,
            kv_cache: Default::default(),
            gpu_layers: None,
            images: 0,
            mmproj: None,
        };
        let mut loaded = load(
            &search(),
            &settings(placement),
            &opts,
            1,
            &mut |_| {},
            &mut |_: u64, _: u64| {},
        )
        .unwrap();
        assert_eq!(loaded.session.unit_names(), units);
        tandem_conformance::assert_last_logits(&mut loaded.session, &r, 1e-3);
        for g in r["greedy"].as_array().unwrap() {
            let n = g["max_new_tokens"].as_u64().unwrap() as usize;
            let got = tandem_conformance::greedy_ids(
                &mut loaded.session,
                &loaded.tokenizer,
                &ids(&g["prompt_ids"]),
                n,
            );
            assert_eq!(
                got,
                ids(&g["generated"]),
                "{backend} {placement}: greedy continuation"
            );
        }
        let c = loaded.session.boundary_counts();
        assert!(c.shared_values + c.copied_values > 0, "values cross units: {c:?}");
    }
}
