//! Finding and opening backend plugins.
//!
//! Plugins are searched, in order, next to the running `engine` binary, in `../lib/tandem`
//! beside it (an installed layout), in the directories named by `TANDEM_PLUGIN_PATH`
//! (`:`-separated) and in those the config or `--plugin-dir` names. The current directory is
//! never searched unless named explicitly. The first plugin of each backend name wins; later
//! files with the same name are reported as shadowed.

use std::path::{Path, PathBuf};

use serde::Serialize;
use tandem_backend_api::plugin::host::{plugin_files, PluginError, PluginLibrary};
use tandem_backend_api::{BackendInfo, BackendOptions, ComputeBackend};

/// The environment variable naming extra plugin directories.
pub const PLUGIN_PATH_VAR: &str = "TANDEM_PLUGIN_PATH";

/// Where to look for plugins.
#[derive(Debug, Clone, Default)]
pub struct PluginSearch {
    /// Directories, in search order.
    pub dirs: Vec<PathBuf>,
}

impl PluginSearch {
    /// The default search path (beside the executable, its `../lib/tandem`, then
    /// `TANDEM_PLUGIN_PATH`), followed by `extra` directories (config, command line).
    pub fn standard(extra: &[PathBuf]) -> Self {
        let mut dirs = Vec::new();
        if let Some(exe_dir) = std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
        {
            let installed = exe_dir.join("../lib/tandem");
            dirs.push(exe_dir);
            if installed.is_dir() {
                dirs.push(installed);
            }
        }
        if let Some(var) = std::env::var_os(PLUGIN_PATH_VAR) {
            dirs.extend(std::env::split_paths(&var).filter(|p| !p.as_os_str().is_empty()));
        }
        dirs.extend(extra.iter().cloned());
        PluginSearch { dirs }
    }

    /// Only the given directories.
    pub fn only(dirs: &[PathBuf]) -> Self {
        PluginSearch { dirs: dirs.to_vec() }
    }

    /// Opens every plugin file in the search path.
    pub fn discover(&self) -> Discovery {
        let mut found = Discovery::default();
        for dir in &self.dirs {
            let files = match plugin_files(dir) {
                Ok(f) => f,
                Err(e) => {
                    found.problems.push(e);
                    continue;
                }
            };
            for file in files {
                match PluginLibrary::open(&file) {
                    Ok(lib) if found.plugins.iter().any(|p| p.name() == lib.name()) => {
                        found.shadowed.push(file)
                    }
                    Ok(lib) => found.plugins.push(lib),
                    Err(e) => found.problems.push(e),
                }
            }
        }
        found
    }
}

/// What a search found.
#[derive(Debug, Default)]
pub struct Discovery {
    /// Valid plugins, first of each name.
    pub plugins: Vec<PluginLibrary>,
    /// Files that failed to load, and directories that could not be read.
    pub problems: Vec<PluginError>,
    /// Valid plugins hidden by an earlier one of the same name.
    pub shadowed: Vec<PathBuf>,
}

impl Discovery {
    /// The plugin for `name`.
    pub fn get(&self, name: &str) -> Option<&PluginLibrary> {
        self.plugins.iter().find(|p| p.name() == name)
    }

    /// Creates the backend `name`, with an error listing what was found when it is missing.
    pub fn create(
        &self,
        name: &str,
        options: &BackendOptions,
    ) -> Result<Box<dyn ComputeBackend>, PluginLookupError> {
        let lib = self.get(name).ok_or_else(|| PluginLookupError::NotFound {
            name: name.to_string(),
            found: self.plugins.iter().map(|p| p.name().to_string()).collect(),
        })?;
        lib.create(options).map_err(|e| PluginLookupError::Create {
            name: name.to_string(),
            path: lib.path().to_path_buf(),
            error: e,
        })
    }
}

/// Why a backend could not be had.
#[derive(Debug, thiserror::Error)]
pub enum PluginLookupError {
    /// No plugin of that name was found.
    #[error("no '{name}' backend plugin found (found: {})", if found.is_empty() { "none".to_string() } else { found.join(", ") })]
    NotFound {
        /// The name asked for.
        name: String,
        /// The names that were found.
        found: Vec<String>,
    },
    /// The plugin refused to create a backend.
    #[error("backend '{name}' ({}): {error}", path.display())]
    Create {
        /// The name.
        name: String,
        /// Its library.
        path: PathBuf,
        /// The backend's error.
        error: tandem_backend_api::BackendError,
    },
}

/// One line of `engine backends`.
#[derive(Debug, Clone, Serialize)]
pub struct BackendReport {
    /// The backend's name (or the file name when it did not load).
    pub name: String,
    /// The plugin file.
    pub path: PathBuf,
    /// Whether it can run here.
    pub available: bool,
    /// Device and facts, when available.
    pub info: Option<BackendInfo>,
    /// Why not, when unavailable.
    pub reason: Option<String>,
    /// The backend-api version the plugin was built against.
    pub api_version: Option<String>,
}

/// Probes every plugin found: creates each backend once with its options and reports.
pub fn report(discovery: &Discovery, options: impl Fn(&str) -> BackendOptions) -> Vec<BackendReport> {
    let mut out: Vec<BackendReport> = discovery
        .plugins
        .iter()
        .map(|lib| {
            let (available, info, reason) = match lib.create(&options(lib.name())) {
                Ok(b) => (true, Some(b.info()), None),
                Err(e) => (false, None, Some(e.to_string())),
            };
            BackendReport {
                name: lib.name().to_string(),
                path: lib.path().to_path_buf(),
                available,
                info,
                reason,
                api_version: Some(lib.api_version().to_string()),
            }
        })
        .collect();
    for p in &discovery.problems {
        let path = match p {
            PluginError::Load { path, .. }
            | PluginError::NotAPlugin { path, .. }
            | PluginError::NullDescriptor { path }
            | PluginError::BadMagic { path, .. }
            | PluginError::AbiMismatch { path, .. }
            | PluginError::ApiMismatch { path, .. }
            | PluginError::BadName { path }
            | PluginError::Directory { path, .. } => path.clone(),
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        out.push(BackendReport {
            name,
            path,
            available: false,
            info: None,
            reason: Some(p.to_string()),
            api_version: None,
        });
    }
    out
}
