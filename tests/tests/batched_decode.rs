//! Several sequences in one step: two prompts prefilled into two KV-cache slots, then decoded
//! together in one step, give transformers' logits for each sequence.

use std::path::PathBuf;

use tandem_engine::checkpoint::hf::open_hf_dir;
use tandem_engine::model::CacheShape;

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
            .step(&[a[a.len() - 1], b[b.len() - 1]], &[0, 1], &[0, 1])
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
