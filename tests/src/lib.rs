//! tandem's backend conformance suite: every op at awkward shapes on every backend plugin that
//! loads on this machine, against an independent f64 oracle (`oracle`) and, for backends other
//! than the CPU reference, against the CPU plugin too.
//!
//! Backends are loaded through the plugin loader, exactly as the engine loads them. Which ones
//! run: `TANDEM_CONFORMANCE_BACKENDS=cpu,vulkan` names them (a named backend that is unavailable
//! fails the suite); without it, every plugin found that can create a backend here runs, and
//! the others are listed with their reason. Adding a backend to the suite is building its plugin.

pub mod cases;
pub mod oracle;

use std::path::PathBuf;

use tandem_backend_api::{BackendOptions, ComputeBackend};
use tandem_engine::runtime::plugins::{Discovery, PluginSearch};

/// The environment variable naming the backends to test.
pub const BACKENDS_VAR: &str = "TANDEM_CONFORMANCE_BACKENDS";

/// Where the test binaries find plugins: next to themselves (`target/<profile>/deps`, where
/// `cargo test` leaves the cdylibs), the profile directory (where `cargo build` puts them), and
/// `TANDEM_PLUGIN_PATH`.
pub fn plugin_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(deps) = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from))
    {
        if let Some(profile) = deps.parent() {
            dirs.push(profile.to_path_buf());
        }
        dirs.push(deps);
    }
    if let Some(var) = std::env::var_os(tandem_engine::runtime::plugins::PLUGIN_PATH_VAR) {
        dirs.extend(std::env::split_paths(&var));
    }
    dirs
}

/// The directory holding the workspace's build outputs for this profile (`target/debug`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>/deps layout")
        .to_path_buf()
}

/// Opens every plugin in [`plugin_dirs`].
pub fn discover() -> Discovery {
    PluginSearch::only(&plugin_dirs()).discover()
}

/// A backend under test.
pub struct UnderTest {
    /// Its name.
    pub name: String,
    /// The instance.
    pub backend: Box<dyn ComputeBackend>,
}

/// The options that make the CPU plugin the oracle: its plain reference kernels.
pub fn reference_options() -> BackendOptions {
    let mut o = BackendOptions::default();
    o.set("kernels", "reference");
    o
}

/// The backends to test (see the crate docs), and the reference CPU backend. The CPU plugin with
/// its default options (its fast kernels: 16-bit activations, SIMD integer block dots) is tested
/// as `cpu(fast)`, against the oracle and the reference kernels like any other backend.
///
/// # Panics
/// When the CPU plugin or a backend named in [`BACKENDS_VAR`] cannot be created: the suite
/// cannot run, which is a failure, not a skip.
pub fn backends_under_test() -> (Vec<UnderTest>, Box<dyn ComputeBackend>) {
    let found = discover();
    let reference = found.create("cpu", &reference_options()).unwrap_or_else(|e| {
        panic!("the CPU reference plugin is required ({e}); searched {:?}: build it with `cargo build --workspace`", plugin_dirs())
    });
    let named: Option<Vec<String>> = std::env::var(BACKENDS_VAR).ok().map(|v| {
        v.split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    });
    let mut out = Vec::new();
    match named {
        Some(names) => {
            for name in names {
                let backend = found
                    .create(&name, &options_for(&name))
                    .unwrap_or_else(|e| panic!("{BACKENDS_VAR} names {name}: {e}"));
                out.push(UnderTest {
                    name: display_name(&name),
                    backend,
                });
            }
        }
        None => {
            for lib in &found.plugins {
                match lib.create(&options_for(lib.name())) {
                    Ok(backend) => out.push(UnderTest {
                        name: display_name(lib.name()),
                        backend,
                    }),
                    Err(e) => eprintln!(
                        "conformance: skipping {} ({}): {e}",
                        lib.name(),
                        lib.path().display()
                    ),
                }
            }
        }
    }
    assert!(!out.is_empty(), "no backend to test");
    (out, reference)
}

/// The options a backend under test is created with: the CPU runs `precision = "exact"` (the
/// 8-bit products have their own oracle tests and the KL rule, docs/precision.md); the GPU
/// backends (Vulkan, wgpu) run with the Khronos validation layer on, so that any validation
/// message fails the suite.
///
/// `TANDEM_CONFORMANCE_VALIDATION=0` leaves the layer off, for a machine whose layer is older
/// than an extension the device uses (Debian bookworm's 1.3.239 rejects
/// `VK_KHR_cooperative_matrix`'s feature structure, so the H100's tensor-core path can only be
/// checked without it). CI never sets it.
pub fn options_for(name: &str) -> tandem_backend_api::BackendOptions {
    let mut o = tandem_backend_api::BackendOptions::default();
    if name == "cpu" {
        o.set("precision", "exact");
    }
    let off = std::env::var("TANDEM_CONFORMANCE_VALIDATION").is_ok_and(|v| v == "0");
    if (name == "vulkan" || name == "wgpu") && !off {
        o.set("validation", "true");
    }
    o
}

/// The name a backend created with default options is reported under: the CPU plugin's
/// defaults are its fast kernels.
/// `settings` with each backend under test given what [`options_for`] gives it, over what the
/// file says (the CPU's exact precision, the GPU backends' validation layer), for the tests that
/// load whole models through a config file.
pub fn under_test(
    mut settings: tandem_engine::runtime::settings::Settings,
) -> tandem_engine::runtime::settings::Settings {
    for name in ["cpu", "vulkan", "wgpu"] {
        for (key, value) in &options_for(name).entries {
            settings.set_backend_option(name, key, value);
        }
    }
    settings
}

/// The real default model's file. Where it is missing: `None`, said on stderr (the test passes
/// without running) unless `CI` is set, where its absence fails the test (CI fetches it).
pub fn default_model_or_skip() -> Option<PathBuf> {
    match tandem_engine::model::files::default_model() {
        Ok(p) => Some(p),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipping the real-model test: {e}");
            None
        }
        Err(e) => panic!("CI must fetch the default model: {e}"),
    }
}

/// The GPU backend `name` with the options under test; where it cannot be created (no loader,
/// no lavapipe), `None`, said on stderr, except under CI, where the test fails (CI runs
/// lavapipe).
pub fn gpu_or_skip(name: &str) -> Option<Box<dyn ComputeBackend>> {
    match discover().create(name, &options_for(name)) {
        Ok(b) => Some(b),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipping: the {name} backend is unavailable here: {e}");
            None
        }
        Err(e) => panic!("CI must run the {name} backend (lavapipe): {e}"),
    }
}

/// `model` on `backend` (one slot, `context` and `chunk` as given) through the engine's one
/// load path, every backend with the options of the backends under test ([`under_test`]).
pub fn load_under_test(model: PathBuf, backend: &str, context: usize, chunk: usize) -> tandem_engine::Loaded {
    let opts = tandem_engine::ModelOptions {
        model: Some(model),
        backend: backend.into(),
        context: Some(context),
        chunk,
        kv_cache: Default::default(),
        gpu_layers: None,
        images: 0,
        mmproj: None,
    };
    load_options_under_test(&opts).unwrap_or_else(|e| panic!("loading with {backend}: {e}"))
}

/// `opts` through the engine's one load path (one slot), every backend with the options of the
/// backends under test ([`under_test`]).
pub fn load_options_under_test(
    opts: &tandem_engine::ModelOptions,
) -> Result<tandem_engine::Loaded, tandem_engine::runtime::load::LoadError> {
    load_with_settings_under_test(opts, tandem_engine::Settings::default())
}

/// [`load_options_under_test`] with `settings` (a `[placement]`, say) under the backends' test
/// options.
pub fn load_with_settings_under_test(
    opts: &tandem_engine::ModelOptions,
    settings: tandem_engine::Settings,
) -> Result<tandem_engine::Loaded, tandem_engine::runtime::load::LoadError> {
    tandem_engine::load(
        &PluginSearch::only(&plugin_dirs()),
        &under_test(settings),
        opts,
        1,
        &mut |_| {},
        &mut |_: u64, _: u64| {},
    )
}

fn display_name(plugin: &str) -> String {
    if plugin == "cpu" {
        "cpu(fast)".to_string()
    } else {
        plugin.to_string()
    }
}

/// A deterministic pseudo-random generator (SplitMix64) for test data.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator with this seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[-scale, scale)`.
    pub fn uniform(&mut self, scale: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        (u * 2.0 - 1.0) * scale
    }

    /// `n` uniform values.
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(scale)).collect()
    }
}

/// The tolerance (relative to the largest expected magnitude) of an NPU's attention, whose
/// kernels compute in bf16 (8 significant bits, unit roundoff `u = 2^-9`): q, k and v are
/// rounded to bf16 (each score then errs by at most `2u * scale * sum |q_i k_i|`, which is
/// `2u sqrt(d)` for the cases' unit-range data and `scale = 1/sqrt(d)`, at most 5.7u at d = 8),
/// every probability and correction factor is rounded to bf16 (u each, relative), and so is the
/// output (u). Their sum for the suite's shapes is under 10u if every error lines up; the
/// emulator's largest error on the suite's cases is 1.3u (2.6e-3, measured); the suite allows
/// `2^-6 = 8u`, which a kernel that rounded one step too many (an f32 accumulator held in
/// bf16, say) would exceed.
pub const NPU_TOLERANCE: f64 = 1.0 / 64.0;

/// The least tolerance a backend is held to: [`NPU_TOLERANCE`] for NPUs (and their
/// emulator), 0 (the case's own) for the others; `TANDEM_CONFORMANCE_MIN_TOL=x` raises it to x
/// for every backend, for runs of kernels that round to f16 on purpose (an experiment's
/// tensor-core attention, say), so such a run reports whether their error is a rounding's or a
/// defect's. The suite's own runs never set it.
pub fn tolerance_floor(info: &tandem_backend_api::BackendInfo) -> f64 {
    let forced = std::env::var("TANDEM_CONFORMANCE_MIN_TOL")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    let own = if info.kind == tandem_backend_api::DeviceKind::Npu {
        NPU_TOLERANCE
    } else {
        0.0
    };
    own.max(forced)
}

/// Asserts `got` matches `want` within `tol` relative to the largest magnitude in `want`
/// (absolute `tol` when that is below 1), naming the case and the first bad index.
pub fn assert_close(case: &str, backend: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(
        got.len(),
        want.len(),
        "{case} on {backend}: {} values, expected {}",
        got.len(),
        want.len()
    );
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (*g as f64 - w).abs();
        assert!(
            g.is_finite() && err <= tol * scale,
            "{case} on {backend}: index {i}: got {g}, expected {w} (error {err:.3e} > {:.3e})",
            tol * scale
        );
    }
}

/// Token ids from a reference file's JSON list.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("a list of token ids")
}

/// Checks a reference file's `last_logits` entries (transformers' top logits after each
/// prompt) against `session`: every listed logit within `tol` × the prompt's largest absolute
/// logit, and the same argmax.
pub fn assert_last_logits(
    session: &mut tandem_engine::runtime::session::Session,
    reference: &serde_json::Value,
    tol: f64,
) {
    for l in reference["last_logits"].as_array().expect("last_logits") {
        let prompt = ids(&l["prompt_ids"]);
        session.reset(0);
        let logits = session.prefill(0, &prompt, false).expect("prefill");
        let max_abs = l["max_abs"].as_f64().expect("max_abs");
        for pair in l["top"].as_array().expect("top") {
            let (id, want) = (
                pair[0].as_u64().expect("id") as usize,
                pair[1].as_f64().expect("logit"),
            );
            let got = logits[id] as f64;
            assert!(
                (got - want).abs() <= tol * max_abs,
                "prompt {prompt:?}: logit {id} is {got}, expected {want}"
            );
        }
        let best = logits
            .iter()
            .enumerate()
            .fold(0, |b, (i, v)| if *v > logits[b] { i } else { b });
        assert_eq!(
            best as u64,
            l["top"][0][0].as_u64().expect("id"),
            "argmax for {prompt:?}"
        );
    }
}

/// `backend` (named `name`) running the whole model of `config` and `weights`, with caches of
/// `shape`: loaded through the engine's one load path, as a placement of one unit.
pub fn session_on(
    name: &str,
    backend: Box<dyn ComputeBackend>,
    config: tandem_engine::checkpoint::config::Gemma3Config,
    weights: &dyn tandem_engine::checkpoint::source::WeightSource,
    shape: tandem_engine::model::CacheShape,
) -> tandem_engine::runtime::session::Session {
    use tandem_engine::runtime::placement::Placement;
    use tandem_engine::runtime::planned::Planned;
    let placement = Placement::single(name.to_string(), backend, format!("test on {name}"));
    Planned::new(placement, config, weights, shape, 0)
        .and_then(|p| {
            p.load(
                weights,
                std::path::Path::new("test"),
                &mut |_| {},
                &mut |_: u64, _: u64| {},
            )
        })
        .unwrap_or_else(|e| panic!("loading on {name}: {e}"))
}

/// Collects the ids a generation sends.
struct Ids<'a>(&'a mut Vec<u32>);

impl tandem_engine::runtime::sequence::EventSink for Ids<'_> {
    fn send(&mut self, event: tandem_engine::runtime::sequence::Event) -> bool {
        if let tandem_engine::runtime::sequence::Event::Token { id, .. } = event {
            self.0.push(id);
        }
        true
    }

    fn is_closed(&self) -> bool {
        false
    }
}

/// The greedy continuation of `prompt` in slot 0 (reset first): at most `n` tokens, ending at
/// one of `tokenizer`'s stop tokens, through the engine's generation loop (what `engine run`
/// and `engine serve` step).
pub fn greedy_ids(
    session: &mut tandem_engine::runtime::session::Session,
    tokenizer: &tandem_engine::tokenizer::Tokenizer,
    prompt: &[u32],
    n: usize,
) -> Vec<u32> {
    use tandem_engine::runtime::sequence::Request;
    use tandem_engine::runtime::stepper::generate;
    let mut got = Vec::new();
    let request = Request {
        prompt: prompt.to_vec(),
        max_tokens: n,
        sampling: tandem_engine::runtime::sampler::SamplerConfig::greedy(),
        stop: Vec::new(),
        sink: Box::new(Ids(&mut got)),
        arrived: std::time::Instant::now(),
        images: Vec::new(),
    };
    generate(session, tokenizer, request, 0, false, &mut |_| true)
        .unwrap_or_else(|e| panic!("greedy continuation of {prompt:?}: {e}"));
    got
}
