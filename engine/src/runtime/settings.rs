//! The TOML configuration file (`tandem.toml`): plugin directories, backend options and the
//! placement preference lists.
//!
//! ```toml
//! plugin_dirs = ["/opt/tandem/plugins"]
//!
//! [placement]
//! attention = ["npu", "vulkan", "wgpu", "cpu"]
//! ffn       = ["vulkan", "wgpu", "cpu"]
//! default   = ["vulkan", "wgpu", "cpu"]
//!
//! [placement.prefill]          # per phase, overriding the lists above
//! attention = ["npu", "vulkan"]
//!
//! [placement.layers]           # whole layers per unit (with `--backend auto`)
//! vulkan = "0-17"
//! cpu = "18-25"
//! head = "vulkan"              # optional: the output head's unit (default: the fastest named)
//! embedding = "vulkan"         # optional: the embedding's unit (default: layer 0's)
//!
//! [backend.cpu]
//! threads = 2
//!
//! [backend.vulkan]
//! memory_limit = "8GiB"        # the most device memory tandem may use there
//!
//! [backend.npu]
//! strict = true                # a missing NPU is an error, not a fallback
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tandem_backend_api::BackendOptions;

use super::split::BoundaryMode;

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Extra plugin directories, searched after the standard ones. Relative paths are taken
    /// relative to the config file.
    #[serde(default)]
    pub plugin_dirs: Vec<PathBuf>,
    /// Backend preference lists per part of the model.
    #[serde(default)]
    pub placement: PlacementSettings,
    /// Options per backend name, passed to the plugin at creation.
    #[serde(default)]
    pub backend: BTreeMap<String, BTreeMap<String, toml::Value>>,
    /// Memory limits backends take from another backend on their device (backend name: the
    /// other backend's name and its limit as written): see
    /// [`crate::runtime::device_budget`]. Not read from the file.
    #[serde(skip)]
    shared_limits: BTreeMap<String, (String, String)>,
}

/// `[placement]`: for each part of the model, backends in order of preference, and per-phase
/// tables overriding them.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementSettings {
    /// Attention (QKV projection, q/k norms, rope, attention, output projection).
    #[serde(default, deserialize_with = "non_empty")]
    pub attention: Option<Vec<String>>,
    /// The feed-forward network (gate|up projection, GeGLU, down projection).
    #[serde(default, deserialize_with = "non_empty")]
    pub ffn: Option<Vec<String>>,
    /// Everything else.
    #[serde(default, deserialize_with = "non_empty")]
    pub default: Option<Vec<String>>,
    /// The vision tower (images in): the first of these that is available and runs its ops;
    /// without it, the language model's backend, then the CPU.
    #[serde(default, deserialize_with = "non_empty")]
    pub vision: Option<Vec<String>>,
    /// `[placement.prefill]`: lists for prompt processing.
    pub prefill: Option<PhaseLists>,
    /// Micro-batches a split decode step of several sequences is pipelined in (1 to 4; 1: none).
    #[serde(default, deserialize_with = "micro_batches")]
    pub micro_batches: Option<usize>,
    /// Micro-batches a prompt step is pipelined in where its placement changes unit (layers
    /// across two GPUs; 1 to 4; 1: none).
    #[serde(default, deserialize_with = "micro_batches")]
    pub prefill_micro_batches: Option<usize>,
    /// How values cross between units of a split: `"shared"` (the default: shared memory where
    /// both units allow it, host waits), `"device"` (also device waits where both allow them)
    /// or `"host"` (always wait and copy on the host).
    pub boundaries: Option<BoundaryMode>,
    /// `[placement.decode]`: lists for generating tokens.
    pub decode: Option<PhaseLists>,
    /// `[placement.layers]`: whole decoder layers per unit.
    #[serde(default, deserialize_with = "layer_table")]
    pub layers: Option<LayerSettings>,
}

/// `[placement.layers]`: which unit runs which decoder layers (`vulkan = "0-17"`, `cpu =
/// "18-25"`, several ranges as `"0-3,8-11"`), and optionally the units of the embedding and the
/// output head.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct LayerSettings {
    /// Per unit (an instance name: `vulkan`, `vulkan#2`), its inclusive layer ranges, in key order.
    pub units: Vec<(String, Vec<(usize, usize)>)>,
    /// `embedding = "NAME"`: the embedding lookup's unit; default: layer 0's.
    pub embedding: Option<String>,
    /// `head = "NAME"`: the output head's unit; default: the fastest kind of device named.
    pub head: Option<String>,
}

/// Parses `"0-17"`, `"5"` or `"0-3, 8-11"` into inclusive ranges.
pub fn parse_layer_ranges(text: &str) -> Result<Vec<(usize, usize)>, String> {
    let mut out = Vec::new();
    for piece in text.split(',') {
        let piece = piece.trim();
        let bad = || format!("'{text}': expected layer ranges such as \"0-17\" or \"0-3,8-11\"");
        let (a, b) = match piece.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (piece, piece),
        };
        let (a, b): (usize, usize) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
        if a > b {
            return Err(format!("'{text}': the range {a}-{b} runs backwards"));
        }
        out.push((a, b));
    }
    Ok(out)
}

fn layer_table<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<LayerSettings>, D::Error> {
    let table = BTreeMap::<String, String>::deserialize(d)?;
    let mut out = LayerSettings::default();
    for (key, value) in table {
        match key.as_str() {
            "embedding" => out.embedding = Some(value),
            "head" => out.head = Some(value),
            _ => {
                let ranges = parse_layer_ranges(&value)
                    .map_err(|e| serde::de::Error::custom(format!("placement.layers.{key}: {e}")))?;
                out.units.push((key, ranges));
            }
        }
    }
    if out.units.is_empty() {
        return Err(serde::de::Error::custom(
            "placement.layers names no unit: write e.g. vulkan = \"0-17\" and cpu = \"18-25\"",
        ));
    }
    Ok(Some(out))
}

/// `[placement.prefill]` or `[placement.decode]`: the same keys as `[placement]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseLists {
    /// Attention.
    #[serde(default, deserialize_with = "non_empty")]
    pub attention: Option<Vec<String>>,
    /// The feed-forward network.
    #[serde(default, deserialize_with = "non_empty")]
    pub ffn: Option<Vec<String>>,
    /// Everything else.
    #[serde(default, deserialize_with = "non_empty")]
    pub default: Option<Vec<String>>,
}

impl PlacementSettings {
    /// Whether any list names a part or a phase (beyond `default`): a split placement.
    pub fn splits(&self) -> bool {
        self.attention.is_some()
            || self.ffn.is_some()
            || self.prefill.is_some()
            || self.decode.is_some()
            || self.layers.is_some()
    }
}

/// 1 to 4 micro-batches.
fn micro_batches<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    let n = usize::deserialize(d)?;
    if !(1..=4).contains(&n) {
        return Err(serde::de::Error::custom(format!(
            "{n} micro-batches: expected 1 to 4"
        )));
    }
    Ok(Some(n))
}

/// A preference list must name at least one backend.
fn non_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    let v = Vec::<String>::deserialize(d)?;
    if v.is_empty() {
        return Err(serde::de::Error::custom(
            "an empty list of backends: name at least one",
        ));
    }
    Ok(Some(v))
}

/// A configuration file that could not be used; the message names the file and the field.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The file cannot be read.
    #[error("{path}: cannot read the config: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
    /// The TOML is malformed or has a wrong field.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (names the key and line).
        message: String,
    },
    /// `strict` is not a boolean.
    #[error("{path}: backend.{backend}.strict: expected true or false")]
    StrictType {
        /// The file.
        path: PathBuf,
        /// The backend table.
        backend: String,
    },
    /// A value that does not parse.
    #[error("{path}: {key}: {message}")]
    Value {
        /// The file.
        path: PathBuf,
        /// The key (`backend.vulkan.memory_limit`).
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A `[backend.NAME]` table for no backend tandem has, or a key its backend does not read.
    #[error("{path}: line {line}: {what}")]
    Unknown {
        /// The file.
        path: PathBuf,
        /// The line of the table or key.
        line: usize,
        /// What is unknown and what is known (`backend.cpu.thread: not an option of cpu (...)`).
        what: String,
    },
    /// A backend option has a value that is not a string, number or boolean.
    #[error("{path}: backend.{backend}.{key}: expected a string, number or boolean")]
    OptionType {
        /// The file.
        path: PathBuf,
        /// The backend table.
        backend: String,
        /// The key.
        key: String,
    },
}

impl Settings {
    /// Reads and checks a config file.
    pub fn load(path: &Path) -> Result<Self, SettingsError> {
        let text = std::fs::read_to_string(path).map_err(|error| SettingsError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        let mut s: Settings = toml::from_str(&text).map_err(|e| {
            let line = e
                .span()
                .map(|sp| text[..sp.start.min(text.len())].matches('\n').count() + 1);
            // A value's error points at the value: name the key written before it on its line,
            // when the message does not already.
            let key = line
                .and_then(|l| text.lines().nth(l - 1))
                .and_then(|t| t.split_once('='))
                .map(|(k, _)| k.trim().trim_matches('"'))
                .filter(|k| !k.is_empty() && !e.message().contains(*k));
            let message = match (line, key) {
                (Some(l), Some(k)) => format!("line {l}: key `{k}`: {}", e.message().trim()),
                (Some(l), None) => format!("line {l}: {}", e.message().trim()),
                _ => e.message().trim().to_string(),
            };
            SettingsError::Parse {
                path: path.to_path_buf(),
                message: message.replace('\n', " "),
            }
        })?;
        check_backend_tables(path, &text)?;
        let base = path.parent().unwrap_or(Path::new("."));
        for d in &mut s.plugin_dirs {
            if d.is_relative() {
                *d = base.join(&*d);
            }
        }
        for (backend, table) in &s.backend {
            if table.get("strict").is_some_and(|v| !v.is_bool()) {
                return Err(SettingsError::StrictType {
                    path: path.to_path_buf(),
                    backend: backend.clone(),
                });
            }
            if let Some(v) = table.get(tandem_backend_api::MEMORY_LIMIT) {
                let text = option_text(v);
                if let Err(message) = tandem_backend_api::parse_bytes(&text) {
                    return Err(SettingsError::Value {
                        path: path.to_path_buf(),
                        key: format!("backend.{backend}.{}", tandem_backend_api::MEMORY_LIMIT),
                        message,
                    });
                }
            }
            if let Some(v) = table.get(DEVICES) {
                let ok = v.as_array().is_some_and(|a| {
                    !a.is_empty()
                        && a.iter()
                            .all(|d| matches!(d, toml::Value::String(_) | toml::Value::Integer(_)))
                });
                if !ok {
                    return Err(SettingsError::Value {
                        path: path.to_path_buf(),
                        key: format!("backend.{backend}.{DEVICES}"),
                        message: format!(
                            "expected a list of device indices or name substrings (devices = [0, 1]), got {v}"
                        ),
                    });
                }
            }
            for (key, v) in table {
                if key == DEVICES {
                    continue;
                }
                if !matches!(
                    v,
                    toml::Value::String(_)
                        | toml::Value::Integer(_)
                        | toml::Value::Float(_)
                        | toml::Value::Boolean(_)
                ) {
                    return Err(SettingsError::OptionType {
                        path: path.to_path_buf(),
                        backend: backend.clone(),
                        key: key.clone(),
                    });
                }
            }
        }
        Ok(s)
    }

    /// Whether `[backend.NAME] strict = true`: a missing backend is an error, not a fallback.
    pub fn strict(&self, name: &str) -> bool {
        self.backend
            .get(name)
            .and_then(|t| t.get("strict"))
            .and_then(toml::Value::as_bool)
            .unwrap_or(false)
    }

    /// Sets option `key` of backend `name`, over what the file says (`engine bench --profile`).
    pub fn set_backend_option(&mut self, name: &str, key: &str, value: &str) {
        self.backend
            .entry(name.to_string())
            .or_default()
            .insert(key.to_string(), toml::Value::String(value.to_string()));
    }

    /// The options for backend `name`: its `[backend.NAME]` table, with the memory limit it
    /// shares with another backend on its device where it has none of its own. Its `devices`
    /// list is the engine's (one instance per device): the backend gets the first as its
    /// `device` instead.
    pub fn backend_options(&self, name: &str) -> BackendOptions {
        let mut o = BackendOptions::default();
        if let Some(table) = self.backend.get(name) {
            for (k, v) in table {
                if k == DEVICES {
                    continue;
                }
                o.set(k.clone(), option_text(v));
            }
        }
        if let Some((_, value)) = self.shared_limits.get(name) {
            if o.get(tandem_backend_api::MEMORY_LIMIT).is_none() {
                o.set(tandem_backend_api::MEMORY_LIMIT.to_string(), value.clone());
            }
        }
        if let Some(first) = self.devices(name).first() {
            o.set("device", first.clone());
        }
        o
    }

    /// `[backend.NAME] devices = [...]`: the devices (indices or name substrings, as `device`
    /// takes them) whose instances `--backend NAME` spreads the layers over; empty without one.
    pub fn devices(&self, plugin: &str) -> Vec<String> {
        match self.backend.get(plugin).and_then(|t| t.get(DEVICES)) {
            Some(toml::Value::Array(a)) => a.iter().map(option_text).collect(),
            _ => Vec::new(),
        }
    }

    /// Whether any `[backend.NAME]` table sets `memory_limit`.
    pub fn has_memory_limit(&self) -> bool {
        self.backend
            .values()
            .any(|t| t.contains_key(tandem_backend_api::MEMORY_LIMIT))
    }

    /// The options for the instance `instance` of a backend (`vulkan`, `vulkan#2`): its
    /// backend's ([`Settings::backend_options`]), with the entries of the instance's own
    /// `[backend."vulkan#2"]` table over them (a second GPU: `device = "1"` there).
    pub fn instance_options(&self, instance: &str) -> BackendOptions {
        let plugin = instance_plugin(instance);
        let mut o = self.backend_options(plugin);
        // Instance N (`vulkan#N`) of a backend with `devices` takes the N-th.
        let ordinal = instance
            .split_once('#')
            .and_then(|(_, n)| n.parse::<usize>().ok())
            .unwrap_or(1);
        if let Some(device) = self.devices(plugin).get(ordinal.saturating_sub(1)) {
            o.set("device", device.clone());
        }
        if instance != plugin {
            if let Some(table) = self.backend.get(instance) {
                for (k, v) in table {
                    o.set(k.clone(), option_text(v));
                }
            }
        }
        o
    }

    /// Backend `plugin` drives the same device as `from`, whose memory limit is `value`: it takes
    /// that limit where it has none of its own ([`crate::runtime::device_budget`]).
    pub fn share_limit(&mut self, plugin: &str, from: &str, value: &str) {
        self.shared_limits
            .insert(plugin.to_string(), (from.to_string(), value.to_string()));
    }

    /// Where the memory limit of `instance` (`vulkan`, `vulkan#2`) comes from, when it has one:
    /// the instance's own `[backend."vulkan#2"]` table, its backend's `[backend.NAME]
    /// memory_limit`, or another backend's on the same device.
    pub fn memory_limit_source(&self, instance: &str) -> Option<String> {
        let plugin = instance_plugin(instance);
        let limit = |table: &str| {
            self.backend
                .get(table)
                .and_then(|t| t.get(tandem_backend_api::MEMORY_LIMIT))
                .map(option_text)
        };
        let own = match limit(instance) {
            Some(v) if instance != plugin => Some((format!("\"{instance}\""), v)),
            _ => limit(plugin).map(|v| (plugin.to_string(), v)),
        };
        match own {
            Some((table, v)) => Some(format!("[backend.{table}] memory_limit = \"{v}\"")),
            None => self.shared_limits.get(plugin).map(|(from, v)| {
                format!("[backend.{from}] memory_limit = \"{v}\", which binds {plugin} too: both drive the same device")
            }),
        }
    }
}

/// An option's value as the plugin takes it: a string as written, any other value as TOML
/// writes it (`2`, `true`).
fn option_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The backend (plugin) an instance name (`vulkan`, `vulkan#2`) is of, as the config's tables
/// take it.
fn instance_plugin(instance: &str) -> &str {
    instance.split('#').next().unwrap_or(instance)
}

/// `[backend.NAME] devices`: read by the engine, never passed to the plugin.
const DEVICES: &str = "devices";

/// Options every backend table takes (read by the engine).
const COMMON_OPTIONS: [&str; 2] = ["strict", tandem_backend_api::MEMORY_LIMIT];

/// The backends tandem ships and the options each reads from its `[backend.NAME]` table
/// (besides [`COMMON_OPTIONS`]). A plugin that adds an option adds it here, so that a typo in
/// the config is an error instead of a setting silently ignored.
pub const BACKEND_OPTIONS: [(&str, &[&str]); 5] = [
    ("cpu", &["threads", "kernels", "spin", "profile", "precision"]),
    (
        "vulkan",
        &[
            "device",
            DEVICES,
            "validation",
            "coopmat",
            "coopmat2",
            "profile",
            "fuse",
            "int_dot",
            "precision",
            "pipeline_cache",
            "prepare",
            "wait_spin_us",
        ],
    ),
    (
        "wgpu",
        &[
            "adapter",
            "backends",
            "validation",
            "profile",
            "features",
            "fuse",
            "pipeline_cache",
            "precision",
        ],
    ),
    (
        "npu",
        &["root", "artefacts", "executor", "generation", "timeout_ms"],
    ),
    (
        "npu-emu",
        &["root", "artefacts", "executor", "generation", "timeout_ms"],
    ),
];

/// Refuses a `[backend.NAME]` table for a backend tandem does not have and a key its backend
/// does not read, naming the line (the second parse keeps the spans the first drops).
fn check_backend_tables(path: &Path, text: &str) -> Result<(), SettingsError> {
    use toml::Spanned;
    type Table = BTreeMap<Spanned<String>, toml::Value>;
    #[derive(Deserialize)]
    struct Raw {
        #[serde(default)]
        backend: BTreeMap<Spanned<String>, Table>,
    }
    // The first parse has already reported any syntax error.
    let Ok(raw) = toml::from_str::<Raw>(text) else {
        return Ok(());
    };
    let line = |at: usize| text[..at.min(text.len())].matches('\n').count() + 1;
    let known_names: Vec<&str> = BACKEND_OPTIONS.iter().map(|(n, _)| *n).collect();
    for (name, table) in &raw.backend {
        // `vulkan#2`: a second instance of `vulkan` takes its options.
        let kind = name.get_ref().split('#').next().unwrap_or_default();
        let Some((_, options)) = BACKEND_OPTIONS.iter().find(|(n, _)| *n == kind) else {
            return Err(SettingsError::Unknown {
                path: path.to_path_buf(),
                line: line(name.span().start),
                what: format!(
                    "[backend.{}]: no backend of that name ({}){}",
                    name.get_ref(),
                    known_names.join(", "),
                    suggest(kind, &known_names)
                ),
            });
        };
        for key in table.keys() {
            let key_name = key.get_ref().as_str();
            if COMMON_OPTIONS.contains(&key_name) || options.contains(&key_name) {
                continue;
            }
            let all: Vec<&str> = options.iter().chain(COMMON_OPTIONS.iter()).copied().collect();
            return Err(SettingsError::Unknown {
                path: path.to_path_buf(),
                line: line(key.span().start),
                what: format!(
                    "backend.{}.{key_name}: not an option of {kind} ({}){}",
                    name.get_ref(),
                    all.join(", "),
                    suggest(key_name, &all)
                ),
            });
        }
    }
    Ok(())
}

/// `; did you mean X?` for the known word closest to `word`, when one is close.
fn suggest(word: &str, known: &[&str]) -> String {
    known
        .iter()
        .map(|k| (edit_distance(word, k), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4))
        .min()
        .map(|(_, k)| format!("; did you mean `{k}`?"))
        .unwrap_or_default()
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tandem.toml");
        std::fs::write(&p, text).unwrap();
        (dir, p)
    }

    #[test]
    fn reads_placement_options_and_relative_plugin_dirs() {
        let (dir, p) = write(
            "plugin_dirs = [\"plugins\"]\n[placement]\nattention = [\"npu\", \"cpu\"]\n[backend.cpu]\nthreads = 2\n",
        );
        let s = Settings::load(&p).unwrap();
        assert_eq!(s.plugin_dirs, vec![dir.path().join("plugins")]);
        assert_eq!(
            s.placement.attention.as_deref(),
            Some(&["npu".to_string(), "cpu".to_string()][..])
        );
        assert_eq!(s.backend_options("cpu").get("threads"), Some("2"));
        assert_eq!(s.backend_options("vulkan").get("threads"), None);
        let mut s = s;
        s.set_backend_option("vulkan", "profile", "true");
        assert_eq!(s.backend_options("vulkan").get("profile"), Some("true"));
        assert_eq!(s.backend_options("cpu").get("threads"), Some("2"));
    }

    #[test]
    fn unknown_field_names_file_and_key() {
        let (_d, p) = write("[placement]\nattn = [\"cpu\"]\n");
        let e = Settings::load(&p).unwrap_err().to_string();
        assert!(e.contains("tandem.toml") && e.contains("attn"), "{e}");
    }

    #[test]
    fn phase_tables_and_strict() {
        let (_d, p) = write(
            "[placement]\nffn = [\"cpu\"]\n[placement.decode]\nattention = [\"vulkan\", \"cpu\"]\n[backend.npu]\nstrict = true\n",
        );
        let s = Settings::load(&p).unwrap();
        assert!(s.placement.splits());
        let decode = s.placement.decode.as_ref().unwrap();
        assert_eq!(decode.attention.as_ref().unwrap(), &["vulkan", "cpu"]);
        assert_eq!(decode.ffn, None);
        assert!(s.strict("npu") && !s.strict("cpu"));
        assert_eq!(s.placement.micro_batches, None);
        let (_d, p) = write("[placement]\nmicro_batches = 2\n");
        assert_eq!(Settings::load(&p).unwrap().placement.micro_batches, Some(2));
        let (_d, p) = write("[placement]\nmicro_batches = 9\n");
        let e = Settings::load(&p).unwrap_err().to_string();
        assert!(
            e.contains("line 2") && e.contains("`micro_batches`: 9 micro-batches"),
            "{e}"
        );
        let (_d, p) = write("[placement]\nprefill_micro_batches = 4\n");
        let s = Settings::load(&p).unwrap();
        assert_eq!(
            (s.placement.prefill_micro_batches, s.placement.micro_batches),
            (Some(4), None)
        );
        let (_d, p) = write("[placement]\nprefill_micro_batches = 0\n");
        let e = Settings::load(&p).unwrap_err().to_string();
        assert!(
            e.contains("line 2") && e.contains("`prefill_micro_batches`: 0 micro-batches"),
            "{e}"
        );
    }

    #[test]
    fn boundaries_are_device_or_host() {
        let (_d, p) = write("[placement]\nboundaries = \"host\"\n");
        let s = Settings::load(&p).unwrap();
        assert_eq!(s.placement.boundaries, Some(BoundaryMode::Host));
        // Not a split by itself: it only says how a split's boundaries go.
        assert!(!s.placement.splits());
        let (_d, p) = write("[placement]\nboundaries = \"pigeon\"\n");
        let e = Settings::load(&p).unwrap_err().to_string();
        assert!(
            e.contains("pigeon") && e.contains("device") && e.contains("host"),
            "{e}"
        );
    }

    #[test]
    fn empty_list_unknown_phase_key_and_bad_strict_are_named() {
        let (_d, p) = write("[placement]\n\nattention = []\n");
        let e = Settings::load(&p).unwrap_err().to_string();
        assert!(
            e.contains("tandem.toml")
                && e.contains("line 3")
                && e.contains("key `attention`")
                && e.contains("empty list"),
            "{e}"
        );
        let (_d, p) = write("[placement.prefill]\nattn = [\"cpu\"]\n");
        let e = Settings::load(&p).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("attn"), "{e}");
        let (_d, p) = write("[placement]\nffn = \"cpu\"\n");
        let e = Settings::load(&p).unwrap_err().to_string();
        assert!(
            e.contains("line 2") && e.contains("key `ffn`") && e.contains("sequence"),
            "{e}"
        );
        let (_d, p) = write("[backend.npu]\nstrict = \"yes\"\n");
        let e = Settings::load(&p).unwrap_err().to_string();
        assert!(e.contains("backend.npu.strict"), "{e}");
    }

    #[test]
    fn devices_give_each_instance_its_device_and_bad_ones_are_named() {
        let (_d, p) = write("[backend.vulkan]\ndevices = [0, \"NVIDIA\"]\nvalidation = true\n");
        let s = Settings::load(&p).unwrap();
        assert_eq!(s.devices("vulkan"), vec!["0", "NVIDIA"]);
        // The plugin never sees the list: each instance gets its own `device`.
        let first = s.backend_options("vulkan");
        assert_eq!((first.get("devices"), first.get("device")), (None, Some("0")));
        assert_eq!(s.instance_options("vulkan#2").get("device"), Some("NVIDIA"));
        assert_eq!(s.instance_options("vulkan#2").get("validation"), Some("true"));
        assert!(s.devices("cpu").is_empty());
        for bad in ["devices = \"0,1\"", "devices = []", "devices = [[0]]"] {
            let (_d, p) = write(&format!("[backend.vulkan]\n{bad}\n"));
            let e = Settings::load(&p).unwrap_err().to_string();
            assert!(e.contains("backend.vulkan.devices"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_second_instance_takes_its_own_table_over_its_backend_s() {
        let (_d, p) = write(
            "[backend.vulkan]\ndevice = \"0\"\nmemory_limit = \"8GiB\"\n[backend.\"vulkan#2\"]\ndevice = \"1\"\n",
        );
        let mut s = Settings::load(&p).unwrap();
        let first = s.instance_options("vulkan");
        let second = s.instance_options("vulkan#2");
        assert_eq!(first.get("device"), Some("0"));
        assert_eq!(second.get("device"), Some("1"));
        // What it does not set, it takes from its backend.
        assert_eq!(second.get("memory_limit"), Some("8GiB"));
        assert_eq!(
            s.memory_limit_source("vulkan#2").as_deref(),
            Some("[backend.vulkan] memory_limit = \"8GiB\"")
        );
        s.backend
            .get_mut("vulkan#2")
            .unwrap()
            .insert("memory_limit".into(), toml::Value::String("1GiB".into()));
        assert_eq!(s.instance_options("vulkan#2").get("memory_limit"), Some("1GiB"));
        assert_eq!(
            s.memory_limit_source("vulkan#2").as_deref(),
            Some("[backend.\"vulkan#2\"] memory_limit = \"1GiB\"")
        );
        assert_eq!(s.instance_options("vulkan").get("memory_limit"), Some("8GiB"));
    }

    #[test]
    fn layer_ranges_and_memory_limits_are_read_and_bad_ones_named() {
        let (_d, p) = write(
            "[placement.layers]\nvulkan = \"0-17\"\ncpu = \"18-20, 22-25\"\nhead = \"vulkan\"\n[backend.vulkan]\nmemory_limit = \"8GiB\"\n",
        );
        let s = Settings::load(&p).unwrap();
        assert!(s.placement.splits());
        let l = s.placement.layers.clone().unwrap();
        assert_eq!(
            l.units,
            vec![
                ("cpu".to_string(), vec![(18, 20), (22, 25)]),
                ("vulkan".to_string(), vec![(0, 17)])
            ]
        );
        assert_eq!((l.head.as_deref(), l.embedding), (Some("vulkan"), None));
        assert_eq!(
            s.backend_options("vulkan").bytes("memory_limit").unwrap(),
            Some(8 << 30)
        );
        for (text, want) in [
            ("[placement.layers]\ncpu = \"5-2\"\n", "backwards"),
            ("[placement.layers]\ncpu = \"all\"\n", "placement.layers.cpu"),
            ("[placement.layers]\nhead = \"cpu\"\n", "names no unit"),
            (
                "[backend.vulkan]\nmemory_limit = \"8 parsecs\"\n",
                "backend.vulkan.memory_limit",
            ),
        ] {
            let (_d, p) = write(text);
            let e = Settings::load(&p).unwrap_err().to_string();
            assert!(e.contains("tandem.toml") && e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn unknown_backend_tables_and_keys_name_file_line_and_key() {
        let (_d, p) = write("[backend.cpu]\nthreads = 2\n\n[backend.vulkn]\nvalidation = true\n");
        let e = Settings::load(&p).unwrap_err().to_string();
        assert!(
            e.contains("tandem.toml: line 4: [backend.vulkn]") && e.contains("did you mean `vulkan`"),
            "{e}"
        );
        let (_d, p) = write("[backend.cpu]\nthread = 2\n");
        let e = Settings::load(&p).unwrap_err().to_string();
        assert!(
            e.contains("tandem.toml: line 2: backend.cpu.thread") && e.contains("did you mean `threads`"),
            "{e}"
        );
        // Every option a shipped backend reads, and a second instance's table, pass.
        let (_d, p) = write(
            "[backend.\"vulkan#2\"]\ndevice = \"1\"\nint_dot = false\nstrict = true\n[backend.wgpu]\nbackends = \"gl\"\n",
        );
        Settings::load(&p).unwrap();
    }

    #[test]
    fn nested_option_value_is_rejected() {
        let (_d, p) = write("[backend.cpu]\nthreads = [1, 2]\n");
        let e = Settings::load(&p).unwrap_err().to_string();
        assert!(e.contains("backend.cpu.threads"), "{e}");
    }

    #[test]
    fn missing_file_is_named() {
        let e = Settings::load(Path::new("/nonexistent/tandem.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/tandem.toml"), "{e}");
    }
}
