//! A memory budget belongs to the device, not to one API: `[backend.NAME] memory_limit` binds
//! every backend that drives the same physical device (the Vulkan and wgpu backends on one GPU,
//! matched by [`tandem_backend_api::BackendInfo::physical_device`]). Without this, a limit
//! written for `vulkan` left `wgpu` free to fill the same GPU: under `--backend auto` on an H100
//! with `[backend.vulkan] memory_limit = "1536MiB"`, auto chose `wgpu` with the whole 2.98 GiB
//! 4B model on it.
//!
//! [`share_limits`] learns which plugins drive which device (from the adapter facts: cached, or
//! by creating each backend once) only where a limit is configured at all, and gives each
//! backend without a limit of its own the smallest limit configured for its device
//! ([`Settings::share_limit`]): the backend is then created with it, so the engine's budget
//! check and the backend's own allocations both hold it. Within one placement, units on one
//! device share one budget ([`crate::runtime::placement_report`] adds their needs).

use std::collections::BTreeMap;

use tandem_backend_api::{parse_bytes, MEMORY_LIMIT};

use super::adapters::{Adapters, Facts};
use super::notice::Notice;
use super::plugins::Discovery;
use super::settings::Settings;

/// A limit one backend takes from another on the same device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedLimit {
    /// The backend that takes it.
    pub plugin: String,
    /// The backend whose `[backend.NAME] memory_limit` it is.
    pub from: String,
    /// The limit as written (`"1536MiB"`).
    pub value: String,
}

/// The limits each plugin found takes from another plugin on its physical device, given what
/// each plugin's facts say its device is (`devices`: plugin name and device, `None` where
/// unknown or unavailable) and which plugins have a limit of their own (`limits`: plugin name,
/// the limit as written and in bytes). The smallest limit on a device wins; a plugin with its
/// own limit keeps it.
pub fn shared(devices: &[(String, Option<String>)], limits: &[(String, String, u64)]) -> Vec<SharedLimit> {
    // The smallest configured limit per device, with whose it is.
    let mut per_device: BTreeMap<&str, (&str, &str, u64)> = BTreeMap::new();
    for (plugin, value, bytes) in limits {
        let Some((_, Some(device))) = devices.iter().find(|(p, _)| p == plugin) else {
            continue;
        };
        let e = per_device
            .entry(device.as_str())
            .or_insert((plugin.as_str(), value.as_str(), *bytes));
        if *bytes < e.2 {
            *e = (plugin.as_str(), value.as_str(), *bytes);
        }
    }
    devices
        .iter()
        .filter(|(p, _)| !limits.iter().any(|(l, _, _)| l == p))
        .filter_map(|(plugin, device)| {
            let (from, value, _) = per_device.get(device.as_deref()?)?;
            Some(SharedLimit {
                plugin: plugin.clone(),
                from: from.to_string(),
                value: value.to_string(),
            })
        })
        .collect()
}

/// `settings` with every backend on a device that another backend's `[backend.NAME]
/// memory_limit` names taking that limit too (see the module's documentation). Nothing is
/// probed, and `settings` comes back as it was, where no backend has a limit. A limit that
/// does not parse is left to the backend that has it to refuse.
pub fn share_limits(discovery: &Discovery, settings: &Settings, notices: &mut dyn FnMut(Notice)) -> Settings {
    let mut out = settings.clone();
    let limits: Vec<(String, String, u64)> = discovery
        .plugins
        .iter()
        .filter_map(|p| {
            let value = settings.backend_options(p.name()).get(MEMORY_LIMIT)?.to_string();
            let bytes = parse_bytes(&value).ok()?;
            Some((p.name().to_string(), value, bytes))
        })
        .collect();
    if limits.is_empty() {
        return out;
    }
    let mut adapters = Adapters::for_plugins(discovery, settings);
    let devices: Vec<(String, Option<String>)> = discovery
        .plugins
        .iter()
        .map(|p| {
            let device = match adapters.facts(p.name(), notices) {
                Facts::Available(info) => info.physical_device,
                Facts::Unavailable(_) => None,
            };
            (p.name().to_string(), device)
        })
        .collect();
    adapters.save();
    for s in shared(&devices, &limits) {
        out.share_limit(&s.plugin, &s.from, &s.value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(p: &str, d: Option<&str>) -> (String, Option<String>) {
        (p.to_string(), d.map(str::to_string))
    }

    #[test]
    fn a_limit_binds_every_backend_on_its_device_and_the_smallest_wins() {
        let devices = [
            dev("vulkan", Some("gpu0")),
            dev("wgpu", Some("gpu0")),
            dev("cpu", None),
            dev("other", Some("gpu1")),
        ];
        let limits = [("vulkan".to_string(), "1536MiB".to_string(), 1536 << 20)];
        assert_eq!(
            shared(&devices, &limits),
            vec![SharedLimit {
                plugin: "wgpu".into(),
                from: "vulkan".into(),
                value: "1536MiB".into()
            }]
        );
        // Both limited: each keeps its own; a third backend on the device takes the smaller.
        let devices = [
            dev("vulkan", Some("gpu0")),
            dev("wgpu", Some("gpu0")),
            dev("third", Some("gpu0")),
        ];
        let limits = [
            ("vulkan".to_string(), "2GiB".to_string(), 2 << 30),
            ("wgpu".to_string(), "1GiB".to_string(), 1 << 30),
        ];
        let s = shared(&devices, &limits);
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].plugin.as_str(), s[0].from.as_str()), ("third", "wgpu"));
        // A limit on a backend whose device is unknown binds nothing else.
        let devices = [dev("vulkan", None), dev("wgpu", None)];
        let limits = [("vulkan".to_string(), "1GiB".to_string(), 1 << 30)];
        assert!(shared(&devices, &limits).is_empty());
    }
}
