//! Whole models on the GPU backends, the raw Vulkan one and the portable wgpu one (validation
//! layers on): the tiny transformers fixtures and the real default model (Gemma 3 270M, Q4_K_M:
//! q8_0 embedding, q5_0/q8_0/q4_k/q6_k matrices) give logits within 1e-2 of the largest
//! reference logit and the same greedy continuations as Hugging Face transformers.
//!
//! Without a GPU (or lavapipe), or without the default model, the tests say so and pass, except
//! under CI (`CI` set), where both must be there.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tandem_backend_api::{ComputeBackend, DType};
use tandem_conformance::ids;
use tandem_engine::model::files::open_model;
use tandem_engine::model::CacheShape;
use tandem_engine::runtime::session::Session;
use tandem_engine::tokenizer::Tokenizer;

const FIXTURES: [&str; 5] = [
    "text-published",
    "text-newer",
    "multimodal",
    "multimodal-legacy",
    "softcap",
];

fn gpu(name: &str) -> Option<Box<dyn ComputeBackend>> {
    tandem_conformance::gpu_or_skip(name)
}

fn session(
    path: &Path,
    name: &str,
    backend: Box<dyn ComputeBackend>,
    max_step_rows: usize,
) -> (Session, Tokenizer) {
    let files = open_model(Some(path)).unwrap();
    let shape = CacheShape {
        slots: 1,
        context: 128,
        max_step_rows,
        dtype: DType::F32,
    };
    let session = tandem_conformance::session_on(name, backend, files.config, files.weights.as_ref(), shape);
    (session, files.tokenizer)
}

fn greedy(session: &mut Session, tokenizer: &Tokenizer, g: &Value) {
    // The fixtures name the prompt's ids `prompt`, the real model's reference `prompt_ids`.
    let prompt = if g["prompt_ids"].is_array() {
        ids(&g["prompt_ids"])
    } else {
        ids(&g["prompt"])
    };
    let n = g["max_new_tokens"].as_u64().unwrap() as usize;
    let got = tandem_conformance::greedy_ids(session, tokenizer, &prompt, n);
    assert_eq!(got, ids(&g["generated"]), "greedy continuation of {prompt:?}");
}

#[test]
fn fixtures_match_transformers_on_vulkan() {
    fixtures_match_transformers("vulkan");
}

#[test]
fn fixtures_match_transformers_on_wgpu() {
    fixtures_match_transformers("wgpu");
}

fn fixtures_match_transformers(backend: &str) {
    if gpu(backend).is_none() {
        return;
    }
    for case in FIXTURES {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/models")
            .join(case);
        let r: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
        // Chunks of 5 rows: prefill crosses chunk boundaries and the batched kernels run.
        let (mut s, tokenizer) = session(&dir, backend, gpu(backend).expect(backend), 5);
        for seq in r["sequences"].as_array().unwrap() {
            let tokens = ids(&seq["tokens"]);
            let want: Vec<Vec<f64>> = serde_json::from_value(seq["logits"].clone()).unwrap();
            s.reset(0);
            let got = s.prefill(0, &tokens, true).unwrap();
            let vocab = want[0].len();
            assert_eq!(got.len(), want.len() * vocab, "{case}: logits");
            let scale = want.iter().flatten().fold(0.0f64, |m, v| m.max(v.abs()));
            for (p, w) in want.iter().enumerate() {
                let g = &got[p * vocab..(p + 1) * vocab];
                let err = g
                    .iter()
                    .zip(w)
                    .map(|(a, b)| (*a as f64 - b).abs())
                    .fold(0.0, f64::max);
                assert!(
                    err <= 1e-2 * scale,
                    "{backend} {case}: position {p}: error {err:e} > 1e-2 x {scale}"
                );
            }
        }
        for g in r["greedy"].as_array().unwrap() {
            s.reset(0);
            greedy(&mut s, &tokenizer, g);
        }
    }
}

#[test]
fn the_default_model_matches_transformers_on_vulkan() {
    the_default_model_matches_transformers("vulkan");
}

#[test]
fn the_default_model_matches_transformers_on_wgpu() {
    the_default_model_matches_transformers("wgpu");
}

fn the_default_model_matches_transformers(name: &str) {
    let Some(path) = tandem_conformance::default_model_or_skip() else {
        return;
    };
    let Some(backend) = gpu(name) else { return };
    let r: Value = serde_json::from_str(
        &std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/gemma3-270m/reference.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let (mut s, tokenizer) = session(&path, name, backend, 64);
    tandem_conformance::assert_last_logits(&mut s, &r, 1e-2);
    for g in r["greedy"].as_array().unwrap() {
        s.reset(0);
        greedy(&mut s, &tokenizer, g);
    }
}
