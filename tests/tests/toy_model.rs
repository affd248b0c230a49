//! The split scheduler runs any model through `model::StepModel`, not only Gemma 3: a toy model
//! (an embedding, two layers of a fused Q|K|V projection, attention over a KV cache, a residual
//! add, one feed-forward matmul and another add, then the selected rows and the logits) built
//! from `backend-api` ops, placed by `runtime::placement::assign` and run by `SplitScheduler` on
//! the CPU plugin: on one unit, and on two CPU instances split by part, by layer and by phase
//! (prefill on one, decode on the other, so that the KV caches are handed over both ways).
//!
//! Every step's logits equal a direct f64 computation of the same arithmetic (within f32
//! rounding), and every split gives the one-unit logits bit for bit; the KV hand-off moves
//! exactly the cached rows of the slots that change unit. A `Session` over the toy (the runtime's
//! one step entry point, `Session::step`) gives the scheduler's logits and keeps the positions.

use std::collections::{BTreeSet, HashMap};

use tandem_backend_api::{
    BufferId, ComputeBackend, DType, Graph, GraphBuilder, KvCacheRef, Op, StepArgs, TensorDesc, Usage,
    WeightRef,
};
use tandem_conformance::{discover, Rng};
use tandem_engine::model::{CacheShape, Part, Region, StepModel};
use tandem_engine::runtime::layers::LayerRule;
use tandem_engine::runtime::placement::{assign, Candidate, PartLists, PlacementSpec};
use tandem_engine::runtime::session::{self, Session};
use tandem_engine::runtime::split::{Phase, SplitScheduler, Unit};

const VOCAB: usize = 8;
const HIDDEN: usize = 4;
const LAYERS: usize = 2;
const SLOTS: usize = 2;
const CONTEXT: usize = 8;
/// The attention's multiplier of the dot products.
const SCALE: f32 = 0.5;
/// Planned ids of the toy's tensors start here (any ids the units' maps bind will do).
const BASE: u64 = 1 << 40;

/// One tensor the toy needs: its planned id, description, and contents (`None` for a cache).
struct Tensor {
    id: BufferId,
    desc: TensorDesc,
    data: Option<Vec<f32>>,
}

/// The toy model: its tensors, and the refs its graph names.
struct Toy {
    tensors: Vec<Tensor>,
    embed: WeightRef,
    /// Per layer: `[3 * HIDDEN, HIDDEN]` Q|K|V, `[HIDDEN, HIDDEN]` feed-forward, the cache.
    layers: Vec<(WeightRef, WeightRef, KvCacheRef)>,
    out: WeightRef,
}

impl Toy {
    fn new(seed: u64) -> Toy {
        let mut rng = Rng::new(seed);
        let mut tensors = Vec::new();
        let mut weight = |shape: [usize; 2], tensors: &mut Vec<Tensor>| {
            let desc = TensorDesc::new(DType::F32, shape);
            let id = BufferId(BASE + tensors.len() as u64);
            tensors.push(Tensor {
                id,
                desc: desc.clone(),
                data: Some(rng.vec(shape[0] * shape[1], 1.0)),
            });
            WeightRef { buffer: id, desc }
        };
        let embed = weight([VOCAB, HIDDEN], &mut tensors);
        let mut layers = Vec::new();
        for _ in 0..LAYERS {
            let qkv = weight([3 * HIDDEN, HIDDEN], &mut tensors);
            let ffn = weight([HIDDEN, HIDDEN], &mut tensors);
            let mut cache = || {
                let id = BufferId(BASE + tensors.len() as u64);
                tensors.push(Tensor {
                    id,
                    desc: TensorDesc::new(DType::F32, [SLOTS, CONTEXT, HIDDEN]),
                    data: None,
                });
                id
            };
            let (k, v) = (cache(), cache());
            let cache = KvCacheRef {
                k,
                v,
                dtype: DType::F32,
                slots: SLOTS,
                capacity: CONTEXT,
            };
            layers.push((qkv, ffn, cache));
        }
        let out = weight([VOCAB, HIDDEN], &mut tensors);
        Toy {
            tensors,
            embed,
            layers,
            out,
        }
    }

    /// The weight's contents.
    fn data(&self, w: &WeightRef) -> &[f32] {
        let t = self
            .tensors
            .iter()
            .find(|t| t.id == w.buffer)
            .expect("a toy tensor");
        t.data.as_deref().expect("a weight")
    }

    /// Every tensor allocated on `backend` (the weights written): the unit's map.
    fn upload(&self, backend: &mut dyn ComputeBackend) -> HashMap<BufferId, BufferId> {
        let mut map = HashMap::new();
        for t in &self.tensors {
            let usage = if t.data.is_some() {
                Usage::Weight
            } else {
                Usage::KvCache
            };
            let b = backend.alloc(&t.desc, usage).unwrap();
            if let Some(d) = &t.data {
                let bytes: Vec<u8> = d.iter().flat_map(|x| x.to_le_bytes()).collect();
                backend.write(b, 0, &bytes).unwrap();
            }
            map.insert(t.id, b);
        }
        map
    }
}

impl StepModel for Toy {
    fn step_graph_parts(
        &self,
        rows: usize,
        selected: usize,
        logits: BufferId,
    ) -> (Graph, Vec<Part>, Vec<Region>) {
        let mut g = GraphBuilder::new(format!("toy rows={rows} selected={selected}"), rows, selected);
        let (mut parts, mut regions) = (Vec::new(), Vec::new());
        let mut mark = |g: &GraphBuilder, part: Part, region: Region| {
            parts.resize(g.node_count(), part);
            regions.resize(g.node_count(), region);
        };
        let mut h = g.push1(Op::Embed {
            table: self.embed.clone(),
            scale: 1.0,
            extra: None,
        });
        mark(&g, Part::Other, Region::Embedding);
        for (l, (qkv, ffn, cache)) in self.layers.iter().enumerate() {
            let qkv = g.push(Op::MatMul {
                x: h,
                weight: qkv.clone(),
                splits: vec![HIDDEN; 3],
            });
            let a = g.push1(Op::Attention {
                q: qkv[0],
                k: qkv[1],
                v: qkv[2],
                cache: cache.clone(),
                heads: 1,
                kv_heads: 1,
                head_dim: HIDDEN,
                scale: SCALE,
                window: None,
                softcap: None,
                bidirectional_from: None,
            });
            mark(&g, Part::Attention, Region::Layer(l));
            h = g.push1(Op::Add { a: h, b: a });
            mark(&g, Part::Other, Region::Layer(l));
            let f = g.push1(Op::MatMul {
                x: h,
                weight: ffn.clone(),
                splits: vec![HIDDEN],
            });
            mark(&g, Part::Ffn, Region::Layer(l));
            h = g.push1(Op::Add { a: h, b: f });
            mark(&g, Part::Other, Region::Layer(l));
        }
        let s = g.push1(Op::SelectRows { x: h });
        let x = g.push1(Op::MatMul {
            x: s,
            weight: self.out.clone(),
            splits: vec![VOCAB],
        });
        g.push(Op::Output { x, buffer: logits });
        mark(&g, Part::Other, Region::Head);
        (g.finish(), parts, regions)
    }

    fn vocab_size(&self) -> usize {
        VOCAB
    }

    fn cache_shape(&self) -> CacheShape {
        CacheShape {
            slots: SLOTS,
            context: CONTEXT,
            max_step_rows: CONTEXT,
            dtype: DType::F32,
        }
    }

    fn fresh_rows(&self) -> usize {
        CONTEXT
    }

    /// Its caches hold the whole context (no rings): any prefix stays.
    fn can_rewind(&self, _len: usize, _by: usize) -> bool {
        true
    }
}

/// One step: its phase, rows (token, position, slot), selected rows, and each slot's length
/// before it.
struct Step {
    phase: Phase,
    rows: Vec<(u32, u32, u32)>,
    select: Vec<u32>,
    lengths: [usize; SLOTS],
}

/// Two sequences: slot 0 prefilled in two chunks, slot 1 in one, three decode steps (two of
/// both slots, one of slot 1), then slot 0 prefilled again (a follow-up turn).
fn script() -> Vec<Step> {
    let step = |phase, rows: &[(u32, u32, u32)], select: &[u32], lengths| Step {
        phase,
        rows: rows.to_vec(),
        select: select.to_vec(),
        lengths,
    };
    vec![
        step(Phase::Prefill, &[(1, 0, 0), (2, 1, 0)], &[1], [0, 0]),
        step(Phase::Prefill, &[(3, 2, 0)], &[0], [2, 0]),
        step(Phase::Prefill, &[(4, 0, 1), (5, 1, 1)], &[1], [3, 0]),
        step(Phase::Decode, &[(6, 3, 0), (7, 2, 1)], &[0, 1], [3, 2]),
        step(Phase::Decode, &[(2, 4, 0), (5, 3, 1)], &[0, 1], [4, 3]),
        step(Phase::Decode, &[(1, 4, 1)], &[0], [5, 4]),
        step(Phase::Prefill, &[(3, 5, 0), (4, 6, 0)], &[0, 1], [5, 5]),
    ]
}

/// `x @ W^T` for `W` of `[n, k]` row-major.
fn matvec(w: &[f32], x: &[f64]) -> Vec<f64> {
    w.chunks(x.len())
        .map(|row| row.iter().zip(x).map(|(&a, b)| a as f64 * b).sum())
        .collect()
}

/// The script's logits computed directly, in f64: per step, the selected rows' logits.
fn reference(toy: &Toy, steps: &[Step]) -> Vec<Vec<f64>> {
    // Per layer, per slot, per position: (key, value).
    let mut cache = vec![vec![vec![(Vec::new(), Vec::new()); CONTEXT]; SLOTS]; LAYERS];
    let embed = toy.data(&toy.embed);
    let mut out = Vec::new();
    for step in steps {
        let mut h: Vec<Vec<f64>> = step
            .rows
            .iter()
            .map(|&(t, _, _)| {
                embed[t as usize * HIDDEN..][..HIDDEN]
                    .iter()
                    .map(|&x| x as f64)
                    .collect()
            })
            .collect();
        for (l, (qkv, ffn, _)) in toy.layers.iter().enumerate() {
            let proj: Vec<Vec<f64>> = h.iter().map(|x| matvec(toy.data(qkv), x)).collect();
            // The step's keys and values are stored first, then every row attends.
            for (p, &(_, pos, slot)) in proj.iter().zip(&step.rows) {
                cache[l][slot as usize][pos as usize] =
                    (p[HIDDEN..2 * HIDDEN].to_vec(), p[2 * HIDDEN..].to_vec());
            }
            for (r, &(_, pos, slot)) in step.rows.iter().enumerate() {
                let q = &proj[r][..HIDDEN];
                let seen = &cache[l][slot as usize][..=pos as usize];
                let scores: Vec<f64> = seen
                    .iter()
                    .map(|(k, _)| SCALE as f64 * q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>())
                    .collect();
                let top = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (d, hd) in h[r].iter_mut().enumerate() {
                    *hd += seen.iter().zip(&e).map(|((_, v), w)| w / sum * v[d]).sum::<f64>();
                }
                let f = matvec(toy.data(ffn), &h[r]);
                h[r].iter_mut().zip(f).for_each(|(a, b)| *a += b);
            }
        }
        out.push(
            step.select
                .iter()
                .flat_map(|&r| matvec(toy.data(&toy.out), &h[r as usize]))
                .collect(),
        );
    }
    out
}

fn cpu() -> Box<dyn ComputeBackend> {
    discover().create("cpu", &Default::default()).unwrap()
}

/// What one placement gave: every step's logits, the units each phase used, and the bytes moved
/// (boundary copies, KV hand-off).
struct Ran {
    logits: Vec<Vec<f32>>,
    units_used: [BTreeSet<usize>; 2],
    moved: (u64, u64),
}

/// The script run on `toy` placed by `spec` over the units `names` (CPU instances).
fn run(toy: &Toy, names: &[&str], spec: &PlacementSpec) -> Ran {
    let candidates: Vec<(String, Candidate)> = names
        .iter()
        .map(|n| (n.to_string(), Candidate::Ready(cpu())))
        .collect();
    let (graph, parts, regions) = toy.step_graph_parts(1, 1, BufferId::UNBOUND);
    let assignment = assign(&graph, &parts, &regions, spec, &candidates).unwrap();
    let placement = [Phase::Prefill, Phase::Decode].map(|p| assignment.units(p));
    let units_used = placement.clone().map(|p| p.into_iter().collect::<BTreeSet<_>>());
    let units = candidates
        .into_iter()
        .map(|(name, c)| {
            let Candidate::Ready(mut backend) = c else {
                panic!("{name} unavailable")
            };
            let map = toy.upload(backend.as_mut());
            Unit { name, backend, map }
        })
        .collect();
    let mut scheduler = SplitScheduler::new(units, placement, &graph, toy).unwrap();
    let mut logits = Vec::new();
    for step in script() {
        let tokens: Vec<u32> = step.rows.iter().map(|r| r.0).collect();
        let positions: Vec<u32> = step.rows.iter().map(|r| r.1).collect();
        let slots: Vec<u32> = step.rows.iter().map(|r| r.2).collect();
        let args = StepArgs {
            tokens: &tokens,
            positions: &positions,
            slots: &slots,
            select: &step.select,
        };
        let mut bytes = vec![0u8; step.select.len() * VOCAB * 4];
        scheduler
            .run(toy, step.phase, &args, &step.lengths, 0, &mut bytes)
            .unwrap_or_else(|e| panic!("{}: {e}", spec.origin));
        logits.push(
            bytes
                .chunks(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        );
    }
    Ran {
        logits,
        units_used,
        moved: scheduler.moved_bytes(),
    }
}

fn lists(name: &str) -> PartLists {
    let one = vec![name.to_string()];
    PartLists {
        attention: one.clone(),
        ffn: one.clone(),
        default: one,
    }
}

#[test]
fn a_toy_model_runs_through_placement_and_the_split_scheduler_on_one_unit_and_two() {
    let toy = Toy::new(52);
    let want = reference(&toy, &script());

    let one = run(&toy, &["cpu"], &PlacementSpec::single("cpu", "one unit".into()));
    assert_eq!(one.units_used, [BTreeSet::from([0]), BTreeSet::from([0])]);
    assert_eq!(one.moved, (0, 0), "one unit moves nothing");
    for (i, (got, want)) in one.logits.iter().zip(&want).enumerate() {
        assert_eq!(got.len(), want.len(), "step {i}: logits");
        let top = want.iter().fold(0f64, |a, b| a.max(b.abs()));
        for (j, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (*g as f64 - w).abs() <= 1e-5 * top.max(1.0),
                "step {i}, logit {j}: {g} where the direct computation gives {w}"
            );
        }
    }

    let two = ["cpu", "cpu#2"];
    let attention_apart = PlacementSpec {
        prefill: PartLists {
            attention: vec!["cpu".into()],
            ffn: vec!["cpu#2".into()],
            default: vec!["cpu#2".into()],
        },
        decode: PartLists {
            attention: vec!["cpu".into()],
            ffn: vec!["cpu#2".into()],
            default: vec!["cpu#2".into()],
        },
        origin: "attention on cpu, the rest on cpu#2".into(),
        layers: None,
    };
    let by_layer = PlacementSpec {
        layers: Some(LayerRule::First {
            unit: "cpu#2".into(),
            count: 1,
            rest: "cpu".into(),
        }),
        ..PlacementSpec::single("cpu", "layer 0 (and the embedding and head) on cpu#2".into())
    };
    let by_phase = PlacementSpec {
        prefill: lists("cpu"),
        decode: lists("cpu#2"),
        origin: "prefill on cpu, decode on cpu#2".into(),
        layers: None,
    };
    for spec in [&attention_apart, &by_layer, &by_phase] {
        let split = run(&toy, &two, spec);
        let both = BTreeSet::from([0, 1]);
        if spec.layers.is_some() || spec.prefill == spec.decode {
            assert_eq!(split.units_used, [both.clone(), both], "{}", spec.origin);
        } else {
            assert_eq!(
                split.units_used,
                [BTreeSet::from([0]), BTreeSet::from([1])],
                "{}",
                spec.origin
            );
            // Each layer's cache crosses to decode's unit at the first decode step (slot 0's 3
            // rows, slot 1's 2) and slot 0's back to prefill's at its second prefill (5 rows):
            // 10 rows x (keys, values) x 16 bytes x 2 layers.
            assert_eq!(
                split.moved.1,
                10 * 2 * 16 * 2,
                "{}: KV bytes handed over",
                spec.origin
            );
        }
        for (i, (s, o)) in split.logits.iter().zip(&one.logits).enumerate() {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(s),
                bits(o),
                "{}: step {i}'s logits against one unit",
                spec.origin
            );
        }
    }
}

/// The script through a `Session` over the toy on one CPU unit: `Session::step` works out each
/// row's position from the slot's length, so the script's positions are not passed.
fn session_run(toy: Toy) -> (Vec<Vec<f32>>, [usize; SLOTS]) {
    let mut backend = cpu();
    let map = toy.upload(backend.as_mut());
    let (graph, _, _) = toy.step_graph_parts(1, 1, BufferId::UNBOUND);
    let units = vec![Unit {
        name: "cpu".into(),
        backend,
        map,
    }];
    let one = [Phase::Prefill, Phase::Decode].map(|_| vec![0; graph.nodes.len()]);
    let scheduler = SplitScheduler::new(units, one, &graph, &toy).unwrap();
    let mut s = Session::new(scheduler, toy);
    let logits = script()
        .iter()
        .map(|step| {
            let tokens: Vec<u32> = step.rows.iter().map(|r| r.0).collect();
            let slots: Vec<u32> = step.rows.iter().map(|r| r.2).collect();
            let mut one = session::Step::decode(&tokens, &slots, &step.select);
            one.phase = step.phase;
            s.step(one).unwrap().to_vec()
        })
        .collect();
    (logits, [s.len(0), s.len(1)])
}

#[test]
fn a_session_over_the_toy_model_steps_it_like_the_scheduler() {
    let want = run(
        &Toy::new(52),
        &["cpu"],
        &PlacementSpec::single("cpu", "one unit".into()),
    );
    let (got, lengths) = session_run(Toy::new(52));
    assert_eq!(lengths, [7, 5], "tokens held per slot after the script");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (i, (g, w)) in got.iter().zip(&want.logits).enumerate() {
        assert_eq!(
            bits(g),
            bits(w),
            "step {i}: the session's logits against the scheduler's"
        );
    }
    assert_eq!(got.len(), script().len());
}
