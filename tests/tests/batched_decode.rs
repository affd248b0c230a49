//! Several sequences in one step: two prompts prefilled into two KV-cache slots, then decoded
//! together in one step, give transformers' logits for each sequence.

use std::path::PathBuf;

use tandem_backend_api::BackendError;
use tandem_engine::checkpoint::hf::open_hf_dir;
use tandem_engine::model::CacheShape;
use tandem_engine::runtime::session::{Logits, Step};

fn fixture(case: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/models")
        .join(case)
}

#[test]
fn two_sequences_decoded_in_one_step_match_the_reference() {
    for case in ["text-published", "text-newer"] {
        let dir = fixture(case);
        let reference: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
        let seqs = reference["sequences"].as_array().unwrap();
        assert!(seqs.len() >= 2, "{case}: needs two sequences");
        let tokens: Vec<Vec<u32>> = seqs
            .iter()
            .map(|s| serde_json::from_value(s["tokens"].clone()).unwrap())
            .collect();
        let want: Vec<Vec<Vec<f64>>> = seqs
            .iter()
            .map(|s| serde_json::from_value(s["logits"].clone()).unwrap())
            .collect();

        let backend = tandem_conformance::discover()
            .create("cpu", &Default::default())
            .unwrap();
        let (config, ckpt) = open_hf_dir(&dir).unwrap();
        let shape = CacheShape {
            slots: 2,
            context: 64,
            max_step_rows: 4,
            dtype: tandem_backend_api::DType::F32,
        };
        let vocab = config.vocab_size;
        let mut session = tandem_conformance::session_on("cpu", backend, config, &ckpt, shape);

        // Prefill all but the last token of each sequence, sequence 1 with a shorter history
        // so the two rows of the joint step sit at different positions.
        let (a, b) = (&tokens[0], &tokens[1][..tokens[1].len() - 3]);
        session.prefill(0, &a[..a.len() - 1], false).unwrap();
        session.prefill(1, &b[..b.len() - 1], false).unwrap();
        let logits = session
            .step(Step::decode(&[a[a.len() - 1], b[b.len() - 1]], &[0, 1], &[0, 1]))
            .unwrap()
            .to_vec();
        for (row, (want_row, label)) in [
            (&want[0][a.len() - 1], "slot 0"),
            (&want[1][b.len() - 1], "slot 1"),
        ]
        .into_iter()
        .enumerate()
        {
            let got = &logits[row * vocab..(row + 1) * vocab];
            let scale = want_row.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let err = got
                .iter()
                .zip(want_row)
                .map(|(g, w)| (*g as f64 - w).abs())
                .fold(0.0, f64::max);
            assert!(err <= 1e-4 * scale, "{case} {label}: error {err:e}");
        }
        assert_eq!((session.len(0), session.len(1)), (a.len(), b.len()));
    }
}

/// A batched step that reads back each row's best logits (`Logits::Best`, the logits
/// ranked where they are computed) lets every sampler that fits pick what it picks from the
/// whole rows, on every backend under test that ranks (the CPU; Vulkan on lavapipe in CI).
#[test]
fn a_steps_best_logits_give_the_picks_of_its_whole_rows() {
    use tandem_engine::runtime::sampler::{Sampler, SamplerConfig};
    let dir = fixture("text-published");
    let (backends, reference) = tandem_conformance::backends_under_test();
    // The CPU (the reference) and the GPU backends under test.
    let backends = std::iter::once(tandem_conformance::UnderTest {
        name: "cpu".into(),
        backend: reference,
    })
    .chain(backends.into_iter().filter(|b| b.name == "vulkan"));
    let configs = [
        SamplerConfig::greedy(),
        SamplerConfig::default(),
        SamplerConfig {
            temperature: 0.6,
            top_k: 20,
            top_p: 0.8,
            min_p: 0.02,
            seed: 5,
            ..SamplerConfig::default()
        },
    ];
    let k = 64;
    let mut ran = 0;
    for under in backends {
        let (config, ckpt) = open_hf_dir(&dir).unwrap();
        let vocab = config.vocab_size;
        let shape = CacheShape {
            slots: 3,
            context: 32,
            max_step_rows: 4,
            dtype: tandem_backend_api::DType::F32,
        };
        let mut session = tandem_conformance::session_on(&under.name, under.backend, config, &ckpt, shape);
        if !session.supports_top_k(k) {
            continue;
        }
        let prompts: [&[u32]; 3] = [&[2, 10, 11, 12], &[2, 40], &[2, 7, 8]];
        let step = |session: &mut tandem_engine::runtime::session::Session, ranked: bool| -> Vec<f32> {
            for (s, p) in prompts.iter().enumerate() {
                session.reset(s);
                session.prefill(s as u32, p, false).unwrap();
            }
            let (tokens, slots) = ([5, 6, 7], [0, 1, 2]);
            if ranked {
                session
                    .step(Step::decode(&tokens, &slots, &slots).with(Logits::Best(k)))
                    .unwrap()
                    .to_vec()
            } else {
                session
                    .step(Step::decode(&tokens, &slots, &slots))
                    .unwrap()
                    .to_vec()
            }
        };
        let whole = step(&mut session, false);
        let best = step(&mut session, true);
        assert_eq!(best.len(), 3 * 2 * k, "{}", under.name);
        for (row, list) in whole.chunks_exact(vocab).zip(best.chunks_exact(2 * k)) {
            let (values, ids) = list.split_at(k);
            // The best values are the row's, in rank order.
            for (v, &id) in values.iter().zip(ids) {
                assert_eq!(*v, row[id as usize], "{}: id {id}", under.name);
            }
            assert!(values.windows(2).all(|w| w[0] >= w[1]), "{}", under.name);
            for c in configs {
                let (mut a, mut b) = (Sampler::new(c).unwrap(), Sampler::new(c).unwrap());
                for _ in 0..4 {
                    let want = a.sample(&mut row.to_vec(), &[]);
                    assert_eq!(b.sample_ranked(list), want, "{}: {c:?}", under.name);
                }
            }
        }
        ran += 1;
    }
    assert!(ran > 0, "no backend under test ranks the logits");
}

/// A server's steps come in many shapes (decode rows of any number of slots plus a prompt chunk
/// of any length), each with its own programs: past `MAX_SHAPES` the least recently run are
/// released, and a released shape runs again with the same result.
#[test]
fn step_programs_are_capped_and_rebuilt_when_needed() {
    use tandem_engine::runtime::split::MAX_SHAPES;
    let dir = fixture("text-published");
    let backend = tandem_conformance::discover()
        .create("cpu", &Default::default())
        .unwrap();
    let (config, ckpt) = open_hf_dir(&dir).unwrap();
    let rows = MAX_SHAPES + 8;
    let shape = CacheShape {
        slots: rows,
        context: 8,
        max_step_rows: 4,
        dtype: tandem_backend_api::DType::F32,
    };
    let mut session = tandem_conformance::session_on("cpu", backend, config, &ckpt, shape);
    let step = |session: &mut tandem_engine::runtime::session::Session, n: usize| {
        for slot in 0..n {
            session.reset(slot);
        }
        let slots: Vec<u32> = (0..n as u32).collect();
        let tokens: Vec<u32> = slots.iter().map(|s| 3 + s % 50).collect();
        session
            .step(Step::decode(&tokens, &slots, &[0]))
            .unwrap()
            .to_vec()
    };
    let first = step(&mut session, 1);
    for n in 2..=rows {
        step(&mut session, n);
        assert!(
            session.step_shapes() <= MAX_SHAPES,
            "{} shapes built",
            session.step_shapes()
        );
    }
    assert_eq!(session.step_shapes(), MAX_SHAPES);
    // One row's programs were released (the least recently run): built again, same logits.
    assert_eq!(step(&mut session, 1), first);
}

/// A unit whose memory holds at most `max` programs: `compile` past them is out of memory,
/// as a GPU's is when its activations do not fit.
struct Limited {
    inner: Box<dyn tandem_backend_api::ComputeBackend>,
    max: usize,
    live: usize,
}

impl tandem_backend_api::ComputeBackend for Limited {
    fn info(&self) -> tandem_backend_api::BackendInfo {
        self.inner.info()
    }
    fn supports(&self, op: &tandem_backend_api::Op) -> tandem_backend_api::Support {
        self.inner.supports(op)
    }
    fn alloc(
        &mut self,
        desc: &tandem_backend_api::TensorDesc,
        usage: tandem_backend_api::Usage,
    ) -> Result<tandem_backend_api::BufferId, BackendError> {
        self.inner.alloc(desc, usage)
    }
    fn write(
        &mut self,
        b: tandem_backend_api::BufferId,
        offset: u64,
        data: &[u8],
    ) -> Result<(), BackendError> {
        self.inner.write(b, offset, data)
    }
    fn read(
        &mut self,
        b: tandem_backend_api::BufferId,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), BackendError> {
        self.inner.read(b, offset, out)
    }
    fn free(&mut self, b: tandem_backend_api::BufferId) -> Result<(), BackendError> {
        self.inner.free(b)
    }
    fn compile(
        &mut self,
        graph: &tandem_backend_api::Graph,
    ) -> Result<tandem_backend_api::ProgramId, BackendError> {
        if self.live >= self.max {
            return Err(BackendError::OutOfMemory {
                requested: 1,
                available: 0,
            });
        }
        let p = self.inner.compile(graph)?;
        self.live += 1;
        Ok(p)
    }
    fn execute(
        &mut self,
        p: tandem_backend_api::ProgramId,
        args: &tandem_backend_api::StepArgs<'_>,
    ) -> Result<tandem_backend_api::Ticket, BackendError> {
        self.inner.execute(p, args)
    }
    fn wait(&mut self, t: tandem_backend_api::Ticket) -> Result<(), BackendError> {
        self.inner.wait(t)
    }
    fn release(&mut self, p: tandem_backend_api::ProgramId) -> Result<(), BackendError> {
        self.live -= 1;
        self.inner.release(p)
    }
}

/// Where a unit has no memory left for a new step shape's programs, the shapes run least
/// recently are released to make room, however many the cap allows: a server keeps serving,
/// and a released shape runs again with the same result.
#[test]
fn a_unit_out_of_memory_for_a_new_shape_releases_the_least_recent() {
    let dir = fixture("text-published");
    let cpu = tandem_conformance::discover()
        .create("cpu", &Default::default())
        .unwrap();
    let (config, ckpt) = open_hf_dir(&dir).unwrap();
    let shape = CacheShape {
        slots: 12,
        context: 8,
        max_step_rows: 4,
        dtype: tandem_backend_api::DType::F32,
    };
    let limited = Box::new(Limited {
        inner: cpu,
        max: 3,
        live: 0,
    });
    let mut session = tandem_conformance::session_on("cpu", limited, config, &ckpt, shape);
    let step = |session: &mut tandem_engine::runtime::session::Session, n: usize| {
        for slot in 0..n {
            session.reset(slot);
        }
        let slots: Vec<u32> = (0..n as u32).collect();
        let tokens: Vec<u32> = slots.iter().map(|s| 3 + s % 50).collect();
        session
            .step(Step::decode(&tokens, &slots, &[0]))
            .map(<[f32]>::to_vec)
    };
    let first = step(&mut session, 1).unwrap();
    for n in 2..=12 {
        step(&mut session, n).unwrap_or_else(|e| panic!("{n} rows: {e}"));
        assert!(
            session.step_shapes() <= 3,
            "{} shapes held",
            session.step_shapes()
        );
    }
    assert_eq!(session.step_shapes(), 3);
    // The one-row shape was released along the way: built again, the same logits.
    assert_eq!(step(&mut session, 1).unwrap(), first);
}
