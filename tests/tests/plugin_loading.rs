//! The loader against broken plugins: wrong magic, ABI or backend-api version, no descriptor,
//! a library that is not a plugin, a plugin that panics, a directory that does not exist. Each
//! is a clear error naming the file (and both versions where they differ), never a crash.
//!
//! The broken libraries are compiled here with `rustc` from tiny sources that lay out the
//! descriptor by hand.

use std::path::{Path, PathBuf};
use std::process::Command;

use tandem_backend_api::plugin::abi::{ABI_VERSION, API_VERSION};
use tandem_backend_api::plugin::host::{PluginError, PluginLibrary};
use tandem_backend_api::{
    BackendError, BackendOptions, CostQuery, DType, DeviceKind, GraphBuilder, ModelShape, Op, PeerUnit,
    StepArgs, TensorDesc, Usage,
};
use tandem_engine::runtime::plugins::PluginSearch;

/// A descriptor with the given magic, ABI and API versions and a table of null-free dummies
/// (the host must not call them when the header is wrong).
fn descriptor_source(magic: &str, abi: u32, api: (u32, u32, u32), null: bool) -> String {
    let body = if null {
        "std::ptr::null()".to_string()
    } else {
        "&DESC as *const Desc as *const u8".to_string()
    };
    format!(
        r#"
#[repr(C)] pub struct Desc {{ magic: [u8; 8], abi: u32, api: [u32; 3], name: *const u8, name_len: usize, table: [usize; 16] }}
unsafe impl Sync for Desc {{}}
static DESC: Desc = Desc {{ magic: *b"{magic}", abi: {abi}, api: [{}, {}, {}], name: b"broken".as_ptr(), name_len: 6, table: [0; 16] }};
#[no_mangle] pub extern "C" fn tandem_backend_plugin() -> *const u8 {{ {body} }}
"#,
        api.0, api.1, api.2
    )
}

fn compile_cdylib(dir: &Path, name: &str, source: &str) -> PathBuf {
    let src = dir.join(format!("{name}.rs"));
    std::fs::write(&src, source).unwrap();
    let out = dir.join(tandem_backend_api::plugin::host::plugin_file_name(name));
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let status = Command::new(rustc)
        .args([
            "--crate-type",
            "cdylib",
            "--edition",
            "2021",
            "-A",
            "warnings",
            "-o",
        ])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("rustc runs");
    assert!(status.success(), "compiling {name}");
    out
}

#[test]
fn broken_plugins_are_errors_naming_file_and_versions() {
    let dir = tempfile::tempdir().unwrap();
    let api = (API_VERSION.major, API_VERSION.minor, API_VERSION.patch);
    let magic = compile_cdylib(
        dir.path(),
        "badmagic",
        &descriptor_source("NOTTANDM", ABI_VERSION, api, false),
    );
    let abi = compile_cdylib(
        dir.path(),
        "badabi",
        &descriptor_source("TANDEMBK", ABI_VERSION + 7, api, false),
    );
    let newer_api = compile_cdylib(
        dir.path(),
        "badapi",
        &descriptor_source("TANDEMBK", ABI_VERSION, (api.0 + 3, 4, 1), false),
    );
    let null = compile_cdylib(
        dir.path(),
        "nulldesc",
        &descriptor_source("TANDEMBK", ABI_VERSION, api, true),
    );
    let not_plugin = compile_cdylib(
        dir.path(),
        "notaplugin",
        "#[no_mangle] pub extern \"C\" fn something_else() -> i32 { 3 }",
    );
    let garbage = dir
        .path()
        .join(tandem_backend_api::plugin::host::plugin_file_name("garbage"));
    std::fs::write(&garbage, b"this is not a shared library").unwrap();

    let err = PluginLibrary::open(&magic).unwrap_err();
    assert!(matches!(err, PluginError::BadMagic { .. }), "{err}");
    assert!(
        err.to_string().contains(&magic.display().to_string()) && err.to_string().contains("NOTTANDM"),
        "{err}"
    );

    let err = PluginLibrary::open(&abi).unwrap_err().to_string();
    assert!(err.contains(&abi.display().to_string()), "{err}");
    assert!(
        err.contains(&format!("ABI version {}", ABI_VERSION + 7))
            && err.contains(&format!("ABI version {ABI_VERSION}")),
        "{err}"
    );

    let err = PluginLibrary::open(&newer_api).unwrap_err().to_string();
    let plugin_v = format!("{}.4.1", api.0 + 3);
    assert!(
        err.contains(&newer_api.display().to_string())
            && err.contains(&plugin_v)
            && err.contains(&API_VERSION.to_string()),
        "{err}"
    );

    let err = PluginLibrary::open(&null).unwrap_err();
    assert!(matches!(err, PluginError::NullDescriptor { .. }), "{err}");

    let err = PluginLibrary::open(&not_plugin).unwrap_err().to_string();
    assert!(
        err.contains("not a tandem backend plugin") && err.contains(&not_plugin.display().to_string()),
        "{err}"
    );

    let err = PluginLibrary::open(&garbage).unwrap_err();
    assert!(
        matches!(err, PluginError::Load { .. }) && err.to_string().contains("garbage"),
        "{err}"
    );

    // Discovery reports each broken file and goes on.
    let found = PluginSearch::only(&[dir.path().to_path_buf()]).discover();
    assert!(found.plugins.is_empty());
    assert_eq!(found.problems.len(), 6, "{:?}", found.problems);
}

/// A plugin of the previous ABI (3: before `estimate_decode` joined the table) is refused by
/// name and both versions, before anything in its table is called.
#[test]
fn a_plugin_of_the_previous_abi_is_refused_naming_both_versions() {
    assert_eq!(ABI_VERSION, 4);
    let dir = tempfile::tempdir().unwrap();
    let api = (API_VERSION.major, API_VERSION.minor, API_VERSION.patch);
    let old = compile_cdylib(
        dir.path(),
        "abi3",
        &descriptor_source("TANDEMBK", ABI_VERSION - 1, api, false),
    );
    let err = PluginLibrary::open(&old).unwrap_err();
    assert!(
        matches!(
            err,
            PluginError::AbiMismatch {
                plugin: 3,
                host: 4,
                ..
            }
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&old.display().to_string())
            && msg.contains("plugin ABI version 3, this engine speaks ABI version 4"),
        "{msg}"
    );
}

#[test]
fn a_missing_directory_is_named() {
    let found = PluginSearch::only(&[PathBuf::from("/nonexistent/tandem-plugins")]).discover();
    assert_eq!(found.problems.len(), 1);
    let msg = found.problems[0].to_string();
    assert!(msg.contains("/nonexistent/tandem-plugins"), "{msg}");
}

fn faulty_plugin() -> PathBuf {
    let name = format!(
        "{}tandem_faulty_plugin{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    tandem_conformance::plugin_dirs()
        .into_iter()
        .map(|d| d.join(&name))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} not built: run `cargo build --workspace`"))
}

#[test]
fn panics_in_a_plugin_become_errors_and_poison_the_instance() {
    let lib = PluginLibrary::open(&faulty_plugin()).unwrap();
    assert_eq!(lib.name(), "faulty");

    let mut opts = BackendOptions::default();
    opts.set("panic_in", "create");
    let err = lib.create(&opts).err().expect("create must fail");
    assert!(
        matches!(&err, BackendError::Panicked { call, message } if call == "create" && message.contains("deliberate")),
        "{err}"
    );

    opts.set("panic_in", "execute");
    let mut b = lib.create(&opts).unwrap();
    let buf = b
        .alloc(&TensorDesc::new(DType::F32, [1]), Usage::Activation)
        .unwrap();
    let mut g = GraphBuilder::new("g", 1, 0);
    let x = g.push1(Op::Input {
        buffer: buf,
        cols: 1,
        selected: false,
    });
    g.push(Op::Output { x, buffer: buf });
    let p = b.compile(&g.finish()).unwrap();
    let args = StepArgs {
        tokens: &[0],
        positions: &[0],
        slots: &[0],
        select: &[],
    };
    let err = b.execute(p, &args).unwrap_err();
    assert!(
        matches!(&err, BackendError::Panicked { call, .. } if call == "execute"),
        "{err}"
    );
    // After a panic the instance refuses work instead of running on broken state.
    let err = b
        .compile(&GraphBuilder::new("g2", 1, 0).finish())
        .unwrap_err()
        .to_string();
    assert!(err.contains("unusable after a panic in execute"), "{err}");
    drop(b); // destroy still works

    // A fresh instance from the same library is unaffected.
    let mut fresh = lib.create(&BackendOptions::default()).unwrap();
    assert!(fresh
        .alloc(&TensorDesc::new(DType::F32, [1]), Usage::Weight)
        .is_ok());
}

fn cost_query(peers: Vec<PeerUnit>) -> CostQuery {
    CostQuery {
        model: ModelShape {
            hidden: 1152,
            intermediate: 6912,
            layers: 26,
            heads: 4,
            kv_heads: 1,
            head_dim: 256,
            window: 512,
            vocab: 262_144,
        },
        context: 80,
        peers,
    }
}

#[test]
fn a_cost_query_and_its_answer_cross_the_plugin_boundary() {
    let lib = PluginLibrary::open(&faulty_plugin()).unwrap();
    let b = lib.create(&BackendOptions::default()).unwrap();
    let q = cost_query(vec![PeerUnit {
        name: "vulkan".into(),
        kind: DeviceKind::IntegratedGpu,
        device: "AMD Radeon 890M Graphics (RADV GFX1150)".into(),
    }]);
    let a = b.estimate_decode(&q).expect("an answer for one peer");
    assert_eq!(a.estimates.len(), 2);
    let (alone, beside) = (
        a.estimate("vulkan", false).unwrap(),
        a.estimate("vulkan", true).unwrap(),
    );
    assert_eq!(
        (
            alone.tokens_per_s,
            alone.low,
            alone.high,
            alone.own_s,
            alone.peer_s
        ),
        (80.0, 4.0, 262_144.0, 0.0, 26.0)
    );
    assert_eq!(beside.own_s, 256.0);
    assert_eq!(
        (a.own_uncertainty, a.peer_uncertainty, a.simulated),
        (0.5, 0.25, true)
    );
    assert_eq!(
        a.basis,
        "vulkan IntegratedGpu AMD Radeon 890M Graphics (RADV GFX1150)"
    );
    // No answer crosses as none.
    assert_eq!(b.estimate_decode(&cost_query(vec![])), None);

    // A panic is no answer, and poisons the instance as any other call's does.
    let mut opts = BackendOptions::default();
    opts.set("panic_in", "estimate_decode");
    let mut b = lib.create(&opts).unwrap();
    assert_eq!(b.estimate_decode(&q), None);
    let err = b
        .compile(&GraphBuilder::new("g", 1, 0).finish())
        .unwrap_err()
        .to_string();
    assert!(err.contains("unusable after a panic in estimate_decode"), "{err}");
}
