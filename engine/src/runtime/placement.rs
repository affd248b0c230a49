//! Which backend runs the model: `--backend NAME`, or `auto`, the first available of the
//! configured `[placement] default` list (built in: vulkan, wgpu, cpu), degrading along it with
//! the reason. The rules of placement live here; the plugins that provide the backends are in
//! [`super::plugins`].

use tandem_backend_api::{ComputeBackend, DeviceKind};

use super::notice::Notice;
use super::plugins::{PluginLookupError, PluginSearch};
use super::settings::Settings;

/// The built-in `auto` order.
pub const AUTO_ORDER: [&str; 3] = ["vulkan", "wgpu", "cpu"];

/// Why no backend could be chosen.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// `A+B` names a split across backends.
    #[error("--backend {0}: hybrid placement across backends is not implemented yet; name one backend")]
    Hybrid(String),
    /// The one backend named could not be had.
    #[error(transparent)]
    Lookup(#[from] PluginLookupError),
    /// `auto` found none of its candidates; each one's reason, `; `-separated.
    #[error("no backend available: {0}")]
    NoneAvailable(String),
}

/// Creates the backend named `name` (`cpu`, `vulkan`, ..., or `auto`) from the plugins `search`
/// finds, with the options `settings` gives it. Plugins that fail to load and the reasons `auto`
/// passed a candidate over go to `notices`.
pub fn choose_backend(
    search: &PluginSearch,
    settings: &Settings,
    name: &str,
    notices: &mut dyn FnMut(Notice),
) -> Result<Box<dyn ComputeBackend>, PlacementError> {
    let discovery = search.discover();
    for p in &discovery.problems {
        notices(Notice::Warning(p.to_string()));
    }
    // The built-in `auto` order passes over software GPUs (lavapipe, llvmpipe, SwiftShader):
    // they run the GPU kernels on the CPU, slower than the CPU backend itself. A configured
    // `[placement] default` list is taken as written.
    let skip_software = name == "auto" && settings.placement.default.is_none();
    let candidates: Vec<&str> = match name {
        "auto" => settings
            .placement
            .default
            .as_ref()
            .map_or_else(|| AUTO_ORDER.to_vec(), |v| v.iter().map(String::as_str).collect()),
        n if n.contains('+') => return Err(PlacementError::Hybrid(n.to_string())),
        n => vec![n],
    };
    let mut reasons = Vec::new();
    let mut software = None;
    for c in &candidates {
        match discovery.create(c, &settings.backend_options(c)) {
            Ok(b) if skip_software && b.info().kind == DeviceKind::SoftwareGpu => {
                reasons.push(format!("{c} runs on {}, a software GPU", b.info().device));
                software.get_or_insert(b);
            }
            Ok(b) => {
                if !reasons.is_empty() {
                    notices(Notice::Note(format!(
                        "using the {c} backend ({})",
                        reasons.join("; ")
                    )));
                }
                return Ok(b);
            }
            Err(e) if name == "auto" => reasons.push(e.to_string()),
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(b) = software {
        notices(Notice::Note(format!(
            "using {} on a software GPU ({})",
            b.info().name,
            reasons.join("; ")
        )));
        return Ok(b);
    }
    Err(PlacementError::NoneAvailable(reasons.join("; ")))
}
