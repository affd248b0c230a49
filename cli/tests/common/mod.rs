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

    pub fn run(&self, args: &[&str]) -> Output {
        Command::new(self.dir.path().join("engine"))
            .args(args)
            .env_remove("TANDEM_PLUGIN_PATH")
            .output()
            .expect("engine runs")
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
