//! Layer placement: whole decoder layers per unit, as `--gpu-layers N` (llama.cpp's `-ngl`
//! habit: layers `0..N` on the GPU, the rest on the CPU) or `[placement.layers]` (ranges per
//! unit) ask. A layer split crosses between units once per direction per step (the hidden state
//! at the cut, and back for the head), where `attention on A, the rest on B` crosses twice per
//! layer.
//!
//! The rule names units before the model is known; [`LayerRule::resolve`] checks it against the
//! model's layer count and gives every [`Region`] its unit.

use super::settings::LayerSettings;
use crate::model::Region;

/// What places whole layers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerRule {
    /// `--gpu-layers N`: layers `0..count` on `unit`, the rest on `rest`. The embedding and the
    /// head go with `unit` (with `rest` when `count` is 0).
    First {
        /// The GPU's instance name.
        unit: String,
        /// Layers on it.
        count: usize,
        /// The unit of the others (`cpu`).
        rest: String,
    },
    /// `[placement.layers]`.
    Ranges(LayerSettings),
    /// `[backend.NAME] devices = [...]` with `--backend NAME`: the layers spread over the
    /// instances `units` (one per device, in order), contiguous, in proportion to each one's
    /// memory budget; the embedding on the first, the head on the last.
    Spread {
        /// The instances (`vulkan`, `vulkan#2`, ...).
        units: Vec<String>,
    },
}

/// The unit (an instance name) of every region of the model.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RegionUnits {
    /// The embedding lookup's.
    pub embedding: String,
    /// Each decoder layer's, in layer order.
    pub layers: Vec<String>,
    /// The output head's.
    pub head: String,
}

impl RegionUnits {
    /// The unit of `region`.
    pub fn of(&self, region: Region) -> &str {
        match region {
            Region::Embedding => &self.embedding,
            Region::Layer(l) => self.layers.get(l).map_or(self.head.as_str(), String::as_str),
            Region::Head => &self.head,
        }
    }

    /// `vulkan: layers 0-12, embedding, head; cpu: layers 13-25`: what runs where, for notes.
    pub fn describe(&self) -> String {
        let mut names: Vec<&str> = Vec::new();
        for n in std::iter::once(&self.embedding)
            .chain(&self.layers)
            .chain([&self.head])
        {
            if !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
        let per_unit: Vec<String> = names
            .iter()
            .map(|&name| {
                let mut what = Vec::new();
                let ranges = ranges_of(self.layers.iter().map(|u| u == name));
                if !ranges.is_empty() {
                    what.push(format!("layers {ranges}"));
                }
                if self.embedding == name {
                    what.push("embedding".to_string());
                }
                if self.head == name {
                    what.push("head".to_string());
                }
                format!("{name}: {}", what.join(", "))
            })
            .collect();
        per_unit.join("; ")
    }
}

/// `0-12,20-25` for the indices where `on` is true.
fn ranges_of(on: impl Iterator<Item = bool>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut start: Option<usize> = None;
    let mut n = 0;
    for (i, b) in on.enumerate() {
        n = i + 1;
        match (b, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push(span(s, i - 1));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push(span(s, n - 1));
    }
    out.join(",")
}

fn span(a: usize, b: usize) -> String {
    if a == b {
        a.to_string()
    } else {
        format!("{a}-{b}")
    }
}

/// A layer rule the model cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayerError {
    /// `--gpu-layers` beyond the model's layers.
    #[error("--gpu-layers {count}: the model has {layers} layers (0 to {layers} may run on the GPU)")]
    TooMany {
        /// What was asked.
        count: usize,
        /// The model's layers.
        layers: usize,
    },
    /// A range past the last layer.
    #[error("the config's [placement.layers]: {unit} = \"{range}\": the model has layers 0-{last}")]
    OutOfRange {
        /// The key.
        unit: String,
        /// The range written.
        range: String,
        /// The model's last layer.
        last: usize,
    },
    /// One layer in two units' ranges.
    #[error("the config's [placement.layers]: layer {layer} is in both {a}'s and {b}'s ranges")]
    Overlap {
        /// The layer.
        layer: usize,
        /// One unit.
        a: String,
        /// The other.
        b: String,
    },
    /// Layers no range names.
    #[error(
        "the config's [placement.layers]: layers {missing} are on no unit (the model has layers 0-{last})"
    )]
    Uncovered {
        /// The layers, as ranges.
        missing: String,
        /// The model's last layer.
        last: usize,
    },
}

impl LayerRule {
    /// Every unit it names, in order of first mention.
    pub fn names(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut add = |n: &String| {
            if !out.contains(n) {
                out.push(n.clone());
            }
        };
        match self {
            LayerRule::First { unit, rest, .. } => {
                add(unit);
                add(rest);
            }
            LayerRule::Ranges(s) => {
                s.units.iter().for_each(|(n, _)| add(n));
                s.embedding.iter().chain(&s.head).for_each(add);
            }
            LayerRule::Spread { units } => units.iter().for_each(add),
        }
        out
    }

    /// The unit of every region of a model of `layers` layers. `rank` orders units by speed
    /// (lower is faster): the default head of `[placement.layers]` goes to the fastest named.
    /// `memory` is a unit's budget in bytes (`None`: unknown), by which
    /// [`LayerRule::Spread`] shares the layers out.
    pub fn resolve(
        &self,
        layers: usize,
        rank: &dyn Fn(&str) -> u8,
        memory: &dyn Fn(&str) -> Option<u64>,
    ) -> Result<RegionUnits, LayerError> {
        match self {
            LayerRule::Spread { units } => {
                let counts = spread(layers, &units.iter().map(|u| memory(u)).collect::<Vec<_>>());
                let per_layer: Vec<String> = units
                    .iter()
                    .zip(&counts)
                    .flat_map(|(u, &n)| std::iter::repeat_n(u.clone(), n))
                    .collect();
                let first = per_layer.first().or(units.first()).cloned().unwrap_or_default();
                let last = per_layer.last().or(units.last()).cloned().unwrap_or_default();
                Ok(RegionUnits {
                    embedding: first,
                    layers: per_layer,
                    head: last,
                })
            }
            LayerRule::First { unit, count, rest } => {
                if *count > layers {
                    return Err(LayerError::TooMany {
                        count: *count,
                        layers,
                    });
                }
                let lead = if *count == 0 { rest } else { unit };
                Ok(RegionUnits {
                    embedding: lead.clone(),
                    layers: (0..layers)
                        .map(|l| if l < *count { unit.clone() } else { rest.clone() })
                        .collect(),
                    head: lead.clone(),
                })
            }
            LayerRule::Ranges(s) => {
                let last = layers.saturating_sub(1);
                let mut per_layer: Vec<Option<&String>> = vec![None; layers];
                for (unit, ranges) in &s.units {
                    for &(a, b) in ranges {
                        if b >= layers {
                            return Err(LayerError::OutOfRange {
                                unit: unit.clone(),
                                range: span(a, b),
                                last,
                            });
                        }
                        for (i, slot) in per_layer[a..=b].iter_mut().enumerate() {
                            if let Some(other) = slot.filter(|o| *o != unit) {
                                return Err(LayerError::Overlap {
                                    layer: a + i,
                                    a: other.clone(),
                                    b: unit.clone(),
                                });
                            }
                            *slot = Some(unit);
                        }
                    }
                }
                let missing = ranges_of(per_layer.iter().map(Option::is_none));
                if !missing.is_empty() {
                    return Err(LayerError::Uncovered { missing, last });
                }
                let layers: Vec<String> = per_layer.into_iter().flatten().cloned().collect();
                let fastest = s
                    .units
                    .iter()
                    .map(|(n, _)| n)
                    .min_by_key(|n| rank(n))
                    .cloned()
                    .unwrap_or_default();
                Ok(RegionUnits {
                    embedding: s
                        .embedding
                        .clone()
                        .or_else(|| layers.first().cloned())
                        .unwrap_or_else(|| fastest.clone()),
                    head: s.head.clone().unwrap_or(fastest),
                    layers,
                })
            }
        }
    }

    /// Where the rule came from, for messages.
    pub fn origin(&self) -> String {
        match self {
            LayerRule::First { unit, count, .. } => format!("--backend {unit} --gpu-layers {count}"),
            LayerRule::Ranges(_) => "the config's [placement.layers]".to_string(),
            LayerRule::Spread { units } => {
                let plugin = units
                    .first()
                    .and_then(|u| u.split('#').next())
                    .unwrap_or_default();
                format!("--backend {plugin} over [backend.{plugin}] devices")
            }
        }
    }
}

/// `layers` layers shared out over units of budgets `memory` (unknown: the mean of the known
/// ones, or equal shares), in proportion, by largest remainder: the counts sum to `layers`.
fn spread(layers: usize, memory: &[Option<u64>]) -> Vec<usize> {
    if memory.is_empty() {
        return Vec::new();
    }
    let known: Vec<u64> = memory.iter().flatten().copied().collect();
    let fill = if known.is_empty() {
        1
    } else {
        (known.iter().map(|&m| u128::from(m)).sum::<u128>() / known.len() as u128).max(1) as u64
    };
    let w: Vec<u128> = memory
        .iter()
        .map(|m| u128::from(m.unwrap_or(fill).max(1)))
        .collect();
    let total: u128 = w.iter().sum();
    let exact: Vec<u128> = w.iter().map(|&x| x * layers as u128).collect();
    let mut counts: Vec<usize> = exact.iter().map(|&e| (e / total) as usize).collect();
    let mut order: Vec<usize> = (0..w.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(exact[i] % total));
    let short = layers - counts.iter().sum::<usize>();
    for &i in order.iter().take(short) {
        counts[i] += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(n: &str) -> u8 {
        if n.starts_with("vulkan") {
            0
        } else {
            4
        }
    }

    #[test]
    fn gpu_layers_put_the_first_layers_the_embedding_and_the_head_on_the_gpu() {
        let r = LayerRule::First {
            unit: "vulkan".into(),
            count: 2,
            rest: "cpu".into(),
        };
        let u = r.resolve(4, &rank, &|_| None).unwrap();
        assert_eq!(u.layers, ["vulkan", "vulkan", "cpu", "cpu"]);
        assert_eq!(
            (u.of(Region::Embedding), u.of(Region::Head)),
            ("vulkan", "vulkan")
        );
        assert_eq!(
            u.describe(),
            "vulkan: layers 0-1, embedding, head; cpu: layers 2-3"
        );
        let none = LayerRule::First {
            unit: "vulkan".into(),
            count: 0,
            rest: "cpu".into(),
        };
        assert_eq!(
            none.resolve(4, &rank, &|_| None).unwrap().describe(),
            "cpu: layers 0-3, embedding, head"
        );
        let e = LayerRule::First {
            unit: "vulkan".into(),
            count: 5,
            rest: "cpu".into(),
        }
        .resolve(4, &rank, &|_| None)
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "--gpu-layers 5: the model has 4 layers (0 to 4 may run on the GPU)"
        );
    }

    fn ranges(units: &[(&str, &[(usize, usize)])], head: Option<&str>) -> LayerRule {
        LayerRule::Ranges(LayerSettings {
            units: units.iter().map(|(n, r)| (n.to_string(), r.to_vec())).collect(),
            embedding: None,
            head: head.map(str::to_string),
        })
    }

    #[test]
    fn ranges_place_each_layer_once_and_the_head_on_the_fastest_unless_named() {
        let r = ranges(&[("cpu", &[(0, 1), (4, 4)]), ("vulkan", &[(2, 3)])], None);
        let u = r.resolve(5, &rank, &|_| None).unwrap();
        assert_eq!(u.layers, ["cpu", "cpu", "vulkan", "vulkan", "cpu"]);
        assert_eq!((u.embedding.as_str(), u.head.as_str()), ("cpu", "vulkan"));
        assert_eq!(
            u.describe(),
            "cpu: layers 0-1,4, embedding; vulkan: layers 2-3, head"
        );
        let named = ranges(&[("cpu", &[(0, 4)]), ("vulkan", &[])], Some("cpu"));
        assert_eq!(named.resolve(5, &rank, &|_| None).unwrap().head, "cpu");
        assert_eq!(r.names(), ["cpu", "vulkan"]);
    }

    #[test]
    fn bad_ranges_are_named() {
        let e = ranges(&[("cpu", &[(0, 9)])], None)
            .resolve(5, &rank, &|_| None)
            .unwrap_err();
        assert!(
            e.to_string().contains("cpu = \"0-9\": the model has layers 0-4"),
            "{e}"
        );
        let e = ranges(&[("cpu", &[(0, 2)]), ("vulkan", &[(2, 4)])], None)
            .resolve(5, &rank, &|_| None)
            .unwrap_err();
        assert!(
            e.to_string().contains("layer 2 is in both cpu's and vulkan's"),
            "{e}"
        );
        let e = ranges(&[("cpu", &[(0, 1), (4, 4)])], None)
            .resolve(5, &rank, &|_| None)
            .unwrap_err();
        assert!(e.to_string().contains("layers 2-3 are on no unit"), "{e}");
    }

    #[test]
    fn spread_shares_layers_by_memory() {
        assert_eq!(spread(62, &[Some(80), Some(80)]), vec![31, 31]);
        assert_eq!(spread(26, &[Some(3), Some(1)]), vec![20, 6]);
        assert_eq!(spread(5, &[None, None]), vec![3, 2]);
        assert_eq!(spread(7, &[Some(10), None, Some(10)]), vec![3, 2, 2]);
        let r = LayerRule::Spread {
            units: vec!["vulkan".into(), "vulkan#2".into()],
        };
        let mem = |u: &str| Some(if u == "vulkan" { 1 << 30 } else { 3 << 30 });
        let u = r.resolve(8, &|_| 0, &mem).unwrap();
        assert_eq!(
            u.describe(),
            "vulkan: layers 0-1, embedding; vulkan#2: layers 2-7, head"
        );
        assert_eq!(r.names(), vec!["vulkan", "vulkan#2"]);
    }
}
