//! Helpers for tests that run the `engine` binary.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The engine binary cargo built for this test.
pub fn engine_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_engine"))
}

/// Where cargo leaves the plugin cdylibs: `target/<profile>/deps` under `cargo test`,
/// `target/<profile>` after `cargo build`.
pub fn plugin_source(name: &str) -> PathBuf {
    let file = format!(
        "{}tandem_backend_{name}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let profile = engine_bin().parent().expect("binary directory").to_path_buf();
    [profile.join("deps").join(&file), profile.join(&file)]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("plugin {file} not built: run `cargo build --workspace`"))
}

/// An installation in a temporary directory: the engine binary with the given plugins beside
/// it, so that the search path is exactly that directory.
pub struct Install {
    pub dir: tempfile::TempDir,
}

impl Install {
    pub fn new(plugins: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::copy(engine_bin(), dir.path().join("engine")).expect("copy engine");
        for p in plugins {
            let src = plugin_source(p);
            std::fs::copy(&src, dir.path().join(src.file_name().expect("file name"))).expect("copy plugin");
        }
        Install { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The install's engine as a command, without the test environment's
    /// `TANDEM_PLUGIN_PATH` (so the search path is the install directory).
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(self.dir.path().join("engine"));
        cmd.env_remove("TANDEM_PLUGIN_PATH");
        cmd
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.run_env(args, &[])
    }

    /// [`Install::run`] with `vars` set for the engine alone (not for the test process, whose
    /// other tests run beside it).
    pub fn run_env(&self, args: &[&str], vars: &[(&str, &str)]) -> Output {
        self.command()
            .args(args)
            .envs(vars.iter().copied())
            .output()
            .expect("engine runs")
    }

    /// Writes `text` as `tandem.toml` in the install directory; returns its path for `--config`.
    pub fn config(&self, text: &str) -> String {
        let path = self.dir.path().join("tandem.toml");
        std::fs::write(&path, text).expect("config");
        path.to_string_lossy().into_owned()
    }

    /// stdout with the install directory replaced by `[DIR]`.
    pub fn stdout(&self, out: &Output) -> String {
        String::from_utf8_lossy(&out.stdout).replace(&self.dir.path().display().to_string(), "[DIR]")
    }
}

/// Asserts a clean failure (exit status 1, exactly one `error:` line on stderr, no panic) and
/// returns that line.
pub fn error_line(args: &[&str], out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "engine {args:?}: expected exit status 1, got {:?}; stderr:\n{stderr}",
        out.status
    );
    assert!(
        !stderr.contains("panicked"),
        "engine {args:?} panicked:\n{stderr}"
    );
    let line = stderr.strip_suffix('\n').unwrap_or(&stderr);
    assert!(
        !line.is_empty() && !line.contains('\n'),
        "engine {args:?}: expected one error line, got:\n{stderr}"
    );
    assert!(
        line.starts_with("error: "),
        "engine {args:?}: not an error line: {line}"
    );
    line.to_string()
}

/// Asserts a clean failure (exit status 1, no panic) whose stderr may hold notes before the
/// error (a software-GPU note, say), and returns the `error:` line.
pub fn error_line_after_notes(args: &[&str], out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "engine {args:?}: {stderr}");
    assert!(
        !stderr.contains("panicked"),
        "engine {args:?} panicked:\n{stderr}"
    );
    stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("engine {args:?}: no error line: {stderr}"))
        .to_string()
}

/// `install`'s `engine backends --json` entry for backend `name`.
pub fn backend_listing(install: &Install, name: &str) -> serde_json::Value {
    let out = install.run(&["backends", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("backends JSON");
    listed["backends"]
        .as_array()
        .and_then(|a| a.iter().find(|b| b["name"] == name))
        .cloned()
        .unwrap_or_else(|| panic!("{name} is not listed: {listed}"))
}

/// Whether backend `name` is available in `install`; under CI (`CI` set) it must be (lavapipe
/// runs the GPU backends there), elsewhere its absence skips the test.
pub fn gpu_available(install: &Install, name: &str) -> bool {
    let listing = backend_listing(install, name);
    let available = listing["available"] == true;
    if !available {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the {name} backend (lavapipe): {listing}"
        );
        eprintln!("skipping: the {name} backend is unavailable here: {listing}");
    }
    available
}

/// The fixture model `case` (`tests/fixtures/models/<case>`).
pub fn fixture(case: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/models")
        .join(case)
}

/// The `text-published` fixture's path, as a `--model` argument.
pub fn text_published() -> String {
    fixture("text-published").to_string_lossy().into_owned()
}

/// A JSON list of token ids.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list of ids: {v}"))
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// The real default model, where it is (CI fetches it; elsewhere its absence skips the test).
pub fn default_model() -> Option<PathBuf> {
    match tandem_engine::model::files::default_model() {
        Ok(p) => Some(p),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipping the default-model test: {e}");
            None
        }
        Err(e) => panic!("CI must fetch the default model: {e}"),
    }
}
