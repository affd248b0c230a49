//! A single backend is a split of one unit: the session's logits through the split scheduler
//! equal, bit for bit, the step graph bound by hand to the backend's buffers, compiled and run
//! directly on it (the unsplit path). And what ties a placement to a step graph of any shape
//! (node positions) holds, and is checked.

use std::collections::HashMap;
use std::path::PathBuf;

use tandem_backend_api::{BufferId, DType, GraphBuilder, StepArgs, TensorDesc, Usage};
use tandem_engine::checkpoint::hf::open_hf_dir;
use tandem_engine::model::{CacheShape, Gemma3Model};
use tandem_engine::runtime::session::Step;
use tandem_engine::runtime::split::{SplitScheduler, Unit};

fn fixture(case: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/models")
        .join(case)
}

fn shape() -> CacheShape {
    CacheShape {
        slots: 1,
        context: 32,
        max_step_rows: 8,
        dtype: DType::F32,
    }
}

fn cpu() -> Box<dyn tandem_backend_api::ComputeBackend> {
    tandem_conformance::discover()
        .create("cpu", &Default::default())
        .unwrap()
}

#[test]
fn one_unit_through_the_split_scheduler_equals_the_unsplit_graph_bit_for_bit() {
    let dir = fixture("text-published");
    let (config, ckpt) = open_hf_dir(&dir).unwrap();
    let vocab = config.vocab_size;
    let prompt: Vec<u32> = vec![2, 17, 5, 9, 11];
    let next = 30u32;

    let mut session = tandem_conformance::session_on("cpu", cpu(), config.clone(), &ckpt, shape());
    let prefill = session.prefill(0, &prompt, true).unwrap();
    let decode = session.step(Step::decode(&[next], &[0], &[0])).unwrap().to_vec();

    // The unsplit path: every planned tensor on one backend, the graph's ids replaced by hand.
    let model = Gemma3Model::plan(config, &ckpt, shape()).unwrap();
    let mut backend = cpu();
    let all: Vec<BufferId> = model.tensors().iter().map(|t| t.id).collect();
    let map = model
        .upload(
            &all,
            &[],
            &ckpt,
            backend.as_mut(),
            &mut 0,
            0,
            &mut |_: u64, _: u64| {},
        )
        .unwrap();
    let mut run = |rows: usize, selected: usize, args: StepArgs<'_>| -> Vec<f32> {
        let logits = backend
            .alloc(&TensorDesc::new(DType::F32, [selected, vocab]), Usage::Activation)
            .unwrap();
        let graph = model.step_graph(rows, selected, BufferId::UNBOUND);
        let mut g = GraphBuilder::new(graph.name.clone(), rows, selected);
        for node in &graph.nodes {
            let mut op = node.op.clone();
            for b in op.buffers_mut() {
                *b = if *b == BufferId::UNBOUND { logits } else { map[b] };
            }
            let outs = g.push(op);
            assert_eq!(outs, node.outputs, "ids are kept in order");
        }
        let program = backend.compile(&g.finish()).unwrap();
        let t = backend.execute(program, &args).unwrap();
        backend.wait(t).unwrap();
        let mut bytes = vec![0u8; selected * vocab * 4];
        backend.read(logits, 0, &mut bytes).unwrap();
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let n = prompt.len();
    let positions: Vec<u32> = (0..n as u32).collect();
    let select: Vec<u32> = (0..n as u32).collect();
    let direct_prefill = run(
        n,
        n,
        StepArgs {
            tokens: &prompt,
            positions: &positions,
            slots: &vec![0; n],
            select: &select,
        },
    );
    let direct_decode = run(
        1,
        1,
        StepArgs {
            tokens: &[next],
            positions: &[n as u32],
            slots: &[0],
            select: &[0],
        },
    );
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&prefill), bits(&direct_prefill), "prefill logits");
    assert_eq!(bits(&decode), bits(&direct_decode), "decode logits");
}

#[test]
fn every_step_shape_has_the_node_positions_the_placement_was_made_on() {
    let (config, ckpt) = open_hf_dir(&fixture("text-newer")).unwrap();
    let model = Gemma3Model::plan(config, &ckpt, shape()).unwrap();
    let (one, parts, regions) = model.step_graph_parts(1, 1, BufferId::UNBOUND);
    for (rows, selected) in [(8, 1), (8, 8), (3, 2)] {
        let (g, p, r) = model.step_graph_parts(rows, selected, BufferId::UNBOUND);
        assert_eq!(p, parts, "parts of {rows}x{selected}");
        assert_eq!(r, regions, "regions of {rows}x{selected}");
        let ops = |g: &tandem_backend_api::Graph| g.nodes.iter().map(|n| n.op.name()).collect::<Vec<_>>();
        assert_eq!(ops(&g), ops(&one), "ops of {rows}x{selected}");
    }

    // A placement of another length is refused, naming both counts.
    let units = || {
        vec![Unit {
            name: "cpu".into(),
            backend: cpu(),
            map: HashMap::new(),
        }]
    };
    let n = one.nodes.len();
    let short = [vec![0; n - 1], vec![0; n]];
    let e = SplitScheduler::new(units(), short, &one, &model)
        .err()
        .expect("refused");
    assert!(
        e.to_string()
            .contains(&format!("places {} nodes of a {n}-node graph", n - 1)),
        "{e}"
    );
    let e = SplitScheduler::new(units(), [vec![0; n], vec![1; n]], &one, &model)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("names unit 1 of 1"), "{e}");

    // A unit that does not hold a tensor its nodes read is an error at the first step, not a
    // graph naming a planned id.
    let mut s = SplitScheduler::new(units(), [vec![0; n], vec![0; n]], &one, &model).unwrap();
    let mut logits = vec![0u8; model.config.vocab_size * 4];
    let args = StepArgs {
        tokens: &[2],
        positions: &[0],
        slots: &[0],
        select: &[0],
    };
    let e = s
        .run(
            &model,
            tandem_engine::runtime::split::Phase::Decode,
            &args,
            &[0],
            0,
            &mut logits,
        )
        .expect_err("refused");
    assert!(
        e.to_string().contains("holds no buffer for planned tensor"),
        "{e}"
    );
}
