//! The process environment the GPU probes meet, set once before any thread starts.
//!
//! Probing the wgpu backend creates a Vulkan instance with the window-system surface
//! extensions enabled (wgpu enables every one the driver offers). Mesa's implicit
//! `VK_LAYER_MESA_device_select` layer, seeing `VK_KHR_wayland_surface`, connects to the
//! Wayland compositor while it orders the devices, and where there is none to find
//! (`XDG_RUNTIME_DIR` unset, as on a server or in CI) libwayland prints
//! `error: XDG_RUNTIME_DIR is invalid or not set in the environment.` on stderr, once per probe:
//! a line tandem did not decide to say, that reads as if the run failed.
//!
//! tandem orders and chooses devices itself (`[backend.vulkan] device`, wgpu's `adapter`, the
//! ranking in `auto`), so the layer's ordering is not needed: where no Wayland display can be
//! reached anyway, the layer is disabled the way its manifest offers (`NODEVICE_SELECT=1`).
//! A user who asks the layer for something (`MESA_VK_DEVICE_SELECT`, `DRI_PRIME`) or sets
//! `NODEVICE_SELECT` keeps it as set.

use std::path::Path;

/// Variables that say the user wants the device-select layer's behaviour, or has decided.
const USER_CHOICES: [&str; 3] = ["NODEVICE_SELECT", "MESA_VK_DEVICE_SELECT", "DRI_PRIME"];

/// Whether a Wayland client could reach a compositor: `WAYLAND_DISPLAY` an absolute socket
/// path, or `XDG_RUNTIME_DIR` an existing directory (libwayland's own test).
fn wayland_reachable(var: &dyn Fn(&str) -> Option<String>) -> bool {
    let display = var("WAYLAND_DISPLAY").filter(|d| !d.is_empty());
    if display.as_deref().is_some_and(|d| d.starts_with('/')) {
        return true;
    }
    var("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty())
        .is_some_and(|d| Path::new(&d).is_dir())
}

/// The variable to set so that probing prints nothing of its own, where one is needed.
fn quiet_probe_variable(var: &dyn Fn(&str) -> Option<String>) -> Option<(&'static str, &'static str)> {
    if USER_CHOICES.iter().any(|v| var(v).is_some()) || wayland_reachable(var) {
        return None;
    }
    Some(("NODEVICE_SELECT", "1"))
}

/// Prepares the environment for probing GPUs quietly (see the module's documentation). Call
/// it first thing in `main`, before any thread starts: it may set an environment variable.
pub fn prepare_for_gpu_probes() {
    if let Some((name, value)) = quiet_probe_variable(&|v| std::env::var(v).ok()) {
        // Edition 2021: `set_var` is safe; it is sound here because no other thread exists yet
        // to read the environment concurrently (the caller's contract above).
        std::env::set_var(name, value);
    }
}

/// The process's peak resident set size so far (Linux `VmHWM`), in bytes; `None` where the OS
/// does not say.
pub fn process_peak_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> Option<(&'static str, &'static str)> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        quiet_probe_variable(&|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn the_layer_is_disabled_only_where_no_compositor_can_be_reached_and_the_user_did_not_choose() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = dir.path().to_str().unwrap();
        assert_eq!(with(&[]), Some(("NODEVICE_SELECT", "1")));
        assert_eq!(
            with(&[("XDG_RUNTIME_DIR", "/nonexistent/run")]),
            Some(("NODEVICE_SELECT", "1"))
        );
        assert_eq!(with(&[("XDG_RUNTIME_DIR", runtime)]), None);
        assert_eq!(with(&[("WAYLAND_DISPLAY", "/run/wl/wayland-0")]), None);
        assert_eq!(with(&[("DRI_PRIME", "1")]), None);
        assert_eq!(with(&[("MESA_VK_DEVICE_SELECT", "1002:687f")]), None);
        assert_eq!(with(&[("NODEVICE_SELECT", "0")]), None);
    }
}
