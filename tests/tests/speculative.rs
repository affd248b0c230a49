//! Speculative decoding (`runtime::speculative`) in whole models: greedy output equal to plain
//! decoding token for token (every k from 1 to 8, drafts rejected at their first and last
//! position, prompts past the sliding window, the context filled mid-block, drafts by lookup,
//! by another model and by a model on another unit), and sampled output distributed as plain
//! sampling's (a chi-square test over a fixed set of seeds).

use std::path::PathBuf;

use tandem_conformance::{discover, options_for};
use tandem_engine::runtime::load::Loaded;
use tandem_engine::runtime::sampler::SamplerConfig;
use tandem_engine::runtime::sequence::{Event, EventSink, FinishReason, Request};
use tandem_engine::runtime::session::SessionError;
use tandem_engine::runtime::speculative::draft::ModelDrafter;
use tandem_engine::runtime::speculative::ngram::NgramDrafter;
use tandem_engine::runtime::speculative::{self, Draft, Drafter, SpecStats, Speculator, Target};
use tandem_engine::runtime::stepper::generate;

fn fixture(case: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/models")
        .join(case)
}

fn load_model(model: PathBuf, backend: &str, context: usize) -> Loaded {
    tandem_conformance::load_under_test(model, backend, context, 32)
}

/// Whether the Vulkan backend is here (lavapipe in CI, where it must be).
fn vulkan_here() -> bool {
    here("vulkan")
}

/// Whether backend `name` is here (in CI the GPU backends must be, on lavapipe).
fn here(name: &str) -> bool {
    match discover().create(name, &options_for(name)) {
        Ok(_) => true,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipping the {name} cases: {e}");
            false
        }
        Err(e) => panic!("CI must run the {name} backend (lavapipe): {e}"),
    }
}

struct Ids<'a>(&'a mut Vec<u32>, &'a mut Option<FinishReason>);

impl EventSink for Ids<'_> {
    fn send(&mut self, event: Event) -> bool {
        match event {
            Event::Token { id, .. } => self.0.push(id),
            Event::Done { finish_reason, .. } => *self.1 = Some(finish_reason),
            Event::Failed { .. } => {}
        }
        true
    }

    fn is_closed(&self) -> bool {
        false
    }
}

/// The generated ids and the finish reason: plain decoding, or speculative with `spec`.
fn run(
    loaded: &mut Loaded,
    prompt: &[u32],
    max_tokens: usize,
    sampling: SamplerConfig,
    spec: Option<&mut Speculator<'_>>,
) -> (Vec<u32>, FinishReason) {
    let (mut ids, mut finish) = (Vec::new(), None);
    let request = Request {
        prompt: prompt.to_vec(),
        max_tokens,
        sampling,
        stop: Vec::new(),
        sink: Box::new(Ids(&mut ids, &mut finish)),
        arrived: std::time::Instant::now(),
        images: Vec::new(),
    };
    let session = &mut loaded.session;
    let r = match spec {
        None => generate(session, &loaded.tokenizer, request, 0, false, &mut |_| true),
        Some(s) => speculative::generate(session, &loaded.tokenizer, request, 0, false, s, &mut |_| true),
    };
    r.unwrap_or_else(|e| panic!("generating from {prompt:?}: {e}"));
    (ids, finish.expect("a finish reason"))
}

/// Drafts the known greedy continuation `truth` (the ids after `prompt`), with the draft token
/// at block position `wrong_at` changed: the target rejects there.
struct Scripted {
    prompt_len: usize,
    truth: Vec<u32>,
    wrong_at: Option<usize>,
    vocab: u32,
}

impl Drafter for Scripted {
    fn propose(&mut self, history: &[u32], k: usize, out: &mut Draft) -> Result<(), SessionError> {
        out.clear();
        let done = history.len() - self.prompt_len;
        for (i, &t) in self.truth.iter().skip(done).take(k).enumerate() {
            let wrong = self.wrong_at == Some(i) || (self.wrong_at == Some(usize::MAX) && i + 1 == k);
            out.tokens.push(if wrong { (t + 1) % self.vocab } else { t });
        }
        Ok(())
    }

    fn name(&self) -> String {
        "scripted".into()
    }
}

fn prompt(len: usize) -> Vec<u32> {
    std::iter::once(2)
        .chain((0..len as u32 - 1).map(|i| 10 + (i * 37) % 400))
        .collect()
}

#[test]
fn greedy_blocks_equal_plain_decoding_for_every_depth_and_rejection_position() {
    let mut loaded = load_model(fixture("text-published"), "cpu", 256);
    let vocab = loaded.session.vocab() as u32;
    // 12 prompt tokens: past the fixture's sliding window of 4.
    let p = prompt(12);
    let (truth, _) = run(&mut loaded, &p, 40, SamplerConfig::greedy(), None);
    // (It meets a stop token after 22.)
    assert!(truth.len() > 16, "{truth:?}");
    // The CPU computes runs of up to 7 rows of one sequence as single rows: blocks of at
    // most 6 drafts (k 7 and 8 run as 6 here; the vulkan case below takes 8).
    let rows = loaded
        .session
        .decode_rows()
        .expect("the cpu says its decode rows");
    assert_eq!(rows, 7);
    for asked in 1..=8 {
        let k = asked.min(rows - 1);
        // None: every draft right; 0: the first wrong; MAX: the last of each block wrong.
        for wrong_at in [None, Some(0), Some(usize::MAX)] {
            let mut d = Scripted {
                prompt_len: p.len(),
                truth: truth.clone(),
                wrong_at,
                vocab,
            };
            let mut spec = Speculator::new(&mut d, asked, &Target::of(&loaded.session))
                .unwrap()
                .fixed(k);
            let (got, _) = run(&mut loaded, &p, 40, SamplerConfig::greedy(), Some(&mut spec));
            assert_eq!(got, truth, "k {k}, wrong at {wrong_at:?}");
            let s = &spec.stats;
            assert!(s.drafted > 0, "k {k}: {s:?}");
            match wrong_at {
                None => {
                    // Every draft is kept but those past the stop token of the last block.
                    assert!(s.accepted + k >= s.drafted, "k {k}: {s:?}");
                    // Every block but the last emits k + 1 tokens.
                    assert!(s.target_steps <= (truth.len() - 1) / (k + 1) + 1, "k {k}: {s:?}");
                }
                Some(0) => assert_eq!(s.accepted, 0, "k {k}: {s:?}"),
                _ => assert!(s.accepted < s.drafted, "k {k}: {s:?}"),
            }
            assert_eq!(
                s.emitted,
                truth.len() - 1,
                "k {k}: the first token comes from the prompt step"
            );
        }
    }
}

#[test]
fn the_context_filled_mid_block_ends_where_plain_decoding_ends() {
    // Context 30, prompt 12: room for 18 tokens; blocks of 8 cross the limit.
    let mut loaded = load_model(fixture("text-newer"), "cpu", 30);
    let p = prompt(12);
    let (truth, finish) = run(&mut loaded, &p, 30, SamplerConfig::greedy(), None);
    assert_eq!(finish, FinishReason::Length);
    let vocab = loaded.session.vocab();
    let mut d = Scripted {
        prompt_len: p.len(),
        truth: truth.clone(),
        wrong_at: None,
        vocab: vocab as u32,
    };
    let mut spec = Speculator::new(&mut d, 8, &Target::of(&loaded.session))
        .unwrap()
        .fixed(8);
    let (got, got_finish) = run(&mut loaded, &p, 30, SamplerConfig::greedy(), Some(&mut spec));
    assert_eq!((got, got_finish), (truth, finish));
}

#[test]
fn lookup_and_model_drafts_give_plain_greedy_output_on_every_fixture() {
    for case in ["text-published", "text-newer", "softcap"] {
        let mut loaded = load_model(fixture(case), "cpu", 256);
        // A prompt that repeats itself, so that lookup finds continuations.
        let mut p = prompt(10);
        p.extend_from_slice(&p.clone()[1..]);
        let (truth, _) = run(&mut loaded, &p, 32, SamplerConfig::greedy(), None);
        let mut ngram = NgramDrafter::default();
        let mut spec = Speculator::new(&mut ngram, 6, &Target::of(&loaded.session))
            .unwrap()
            .fixed(6);
        let (got, _) = run(&mut loaded, &p, 32, SamplerConfig::greedy(), Some(&mut spec));
        assert_eq!(got, truth, "{case}, ngram: {:?}", spec.stats);
        // Another fixture as the draft: same vocabulary, other weights, so rejections.
        let other = if case == "text-newer" {
            "text-published"
        } else {
            "text-newer"
        };
        let mut dm = ModelDrafter::new(load_model(fixture(other), "cpu", 256).session);
        for k in [1, 3, 8] {
            let mut spec = Speculator::new(&mut dm, k, &Target::of(&loaded.session))
                .unwrap()
                .fixed(k);
            let (got, _) = run(&mut loaded, &p, 32, SamplerConfig::greedy(), Some(&mut spec));
            assert_eq!(got, truth, "{case}, drafted by {other}, k {k}: {:?}", spec.stats);
        }
    }
}

#[test]
fn a_cpu_draft_runs_ahead_of_a_vulkan_target_and_changes_no_token() {
    if !vulkan_here() {
        return;
    }
    let mut loaded = load_model(fixture("text-published"), "vulkan", 256);
    let p = prompt(12);
    let (truth, _) = run(&mut loaded, &p, 40, SamplerConfig::greedy(), None);
    // The target itself as the draft: every draft is kept, so every block after the first
    // was drafted while the one before it was verified.
    let mut same = ModelDrafter::new(load_model(fixture("text-published"), "cpu", 256).session);
    let mut spec = Speculator::new(&mut same, 4, &Target::of(&loaded.session))
        .unwrap()
        .fixed(4);
    let s = &spec.stats;
    assert!(s.overlap, "a cpu draft for a vulkan target runs ahead: {s:?}");
    let (got, _) = run(&mut loaded, &p, 40, SamplerConfig::greedy(), Some(&mut spec));
    assert_eq!(got, truth, "{:?}", spec.stats);
    let s = &spec.stats;
    // Every draft kept but those past the stop token in the last block.
    assert!(s.accepted + 4 >= s.drafted, "{s:?}");
    assert!(s.ready_blocks + 1 >= s.blocks && s.blocks > 2, "{s:?}");
    // Another model as the draft: rejections, and blocks drafted ahead thrown away.
    let mut other = ModelDrafter::new(load_model(fixture("text-newer"), "cpu", 256).session);
    for k in [2, 8] {
        let mut spec = Speculator::new(&mut other, k, &Target::of(&loaded.session))
            .unwrap()
            .fixed(k);
        let (got, _) = run(&mut loaded, &p, 40, SamplerConfig::greedy(), Some(&mut spec));
        assert_eq!(got, truth, "k {k}: {:?}", spec.stats);
    }
}

#[test]
fn a_draft_of_another_vocabulary_is_refused_naming_both_sizes() {
    struct Wide;
    impl Drafter for Wide {
        fn propose(&mut self, _: &[u32], _: usize, out: &mut Draft) -> Result<(), SessionError> {
            out.clear();
            Ok(())
        }
        fn vocab(&self) -> Option<usize> {
            Some(512)
        }
        fn name(&self) -> String {
            "wide".into()
        }
    }
    let target = Target {
        vocab: 486,
        units: vec!["cpu".into()],
        decode_rows: None,
    };
    let e = Speculator::new(&mut Wide, 4, &target).err().expect("refused");
    let text = e.to_string();
    assert!(text.contains("512") && text.contains("486"), "{text}");
}

/// Pearson's statistic of two samples' counts over the same categories (homogeneity), with
/// its degrees of freedom; categories with fewer than 10 draws in both samples together are
/// pooled into one, so that no expected count is tiny.
fn two_sample_chi_square(a: &[u64], b: &[u64]) -> (f64, usize) {
    let (mut cats, mut pooled) = (Vec::new(), (0u64, 0u64));
    for (&x, &y) in a.iter().zip(b) {
        match x + y {
            0 => {}
            t if t < 10 => pooled = (pooled.0 + x, pooled.1 + y),
            _ => cats.push((x, y)),
        }
    }
    if pooled.0 + pooled.1 > 0 {
        cats.push(pooled);
    }
    let na: u64 = cats.iter().map(|c| c.0).sum();
    let nb: u64 = cats.iter().map(|c| c.1).sum();
    let (na, nb) = (na as f64, nb as f64);
    let chi = cats
        .iter()
        .map(|&(x, y)| {
            let total = (x + y) as f64;
            let (ea, eb) = (total * na / (na + nb), total * nb / (na + nb));
            (x as f64 - ea).powi(2) / ea + (y as f64 - eb).powi(2) / eb
        })
        .sum();
    (chi, cats.len().max(2) - 1)
}

/// The 0.999 quantile of chi-square with `df` degrees of freedom (Wilson and Hilferty's cube
/// approximation: 3% high at df = 1, closer above).
fn chi_square_999(df: usize) -> f64 {
    let d = df as f64;
    let z = 3.0902;
    let c = 2.0 / (9.0 * d);
    d * (1.0 - c + z * c.sqrt()).powi(3)
}

#[test]
fn sampled_speculative_tokens_are_distributed_as_plain_sampling() {
    let mut loaded = load_model(fixture("text-published"), "cpu", 64);
    let vocab = loaded.session.vocab();
    let mut dm = ModelDrafter::new(load_model(fixture("text-newer"), "cpu", 64).session);
    let p = prompt(6);
    // The top 6 tokens at temperature 1.5: a few categories with real mass.
    let cfg = |seed| SamplerConfig {
        temperature: 1.5,
        top_k: 6,
        top_p: 1.0,
        min_p: 0.0,
        repetition_penalty: 1.0,
        seed,
    };
    // The second and third tokens: the first two judged positions of the first block.
    let (mut plain, mut spec_counts) = (vec![0u64; vocab * 2], vec![0u64; vocab * 2]);
    let mut stats = SpecStats::default();
    for seed in 0..2000u64 {
        let (ids, _) = run(&mut loaded, &p, 3, cfg(seed), None);
        plain[ids[1] as usize] += 1;
        plain[vocab + ids[2] as usize] += 1;
        let mut spec = Speculator::new(&mut dm, 2, &Target::of(&loaded.session))
            .unwrap()
            .fixed(2);
        let (ids, _) = run(&mut loaded, &p, 3, cfg(1_000_000 + seed), Some(&mut spec));
        spec_counts[ids[1] as usize] += 1;
        spec_counts[vocab + ids[2] as usize] += 1;
        stats.drafted += spec.stats.drafted;
        stats.accepted += spec.stats.accepted;
    }
    // Some drafts kept and some rejected: both branches of the rule were taken.
    assert!(stats.accepted > 0 && stats.accepted < stats.drafted, "{stats:?}");
    for (pos, range) in [(2, 0..vocab), (3, vocab..2 * vocab)] {
        let (chi, df) = two_sample_chi_square(&plain[range.clone()], &spec_counts[range]);
        // A significance level of 0.001, over a fixed set of seeds: deterministic.
        let limit = chi_square_999(df);
        assert!(
            chi < limit,
            "token {pos}: chi-square {chi} with {df} degrees of freedom (limit {limit})"
        );
    }
}

#[test]
fn the_default_model_speculates_to_its_plain_greedy_output() {
    let Some(path) = tandem_conformance::default_model_or_skip() else {
        return;
    };
    let mut loaded = load_model(path.clone(), "cpu", 256);
    // A passage and the start of its copy: lookup drafts find it.
    let text = "The cat sat on the mat. The dog lay by the door. The bird sang in the tree.\n\
                Again: The cat sat on the mat. The dog";
    let p = loaded.tokenizer.encode(text, true).unwrap();
    let (truth, _) = run(&mut loaded, &p, 40, SamplerConfig::greedy(), None);
    let mut ngram = NgramDrafter::default();
    let mut spec = Speculator::new(&mut ngram, 6, &Target::of(&loaded.session)).unwrap();
    let (got, _) = run(&mut loaded, &p, 40, SamplerConfig::greedy(), Some(&mut spec));
    assert_eq!(got, truth, "ngram: {:?}", spec.stats);
    assert!(spec.stats.accepted > 0, "the copy is found: {:?}", spec.stats);
    // The model as its own draft (in a session of its own): every draft is its pick.
    let mut own = ModelDrafter::new(load_model(path, "cpu", 256).session);
    let mut spec = Speculator::new(&mut own, 4, &Target::of(&loaded.session))
        .unwrap()
        .fixed(4);
    let (got, _) = run(&mut loaded, &p, 40, SamplerConfig::greedy(), Some(&mut spec));
    assert_eq!(got, truth, "self-draft: {:?}", spec.stats);
    assert!(spec.stats.accepted + 4 >= spec.stats.drafted, "{:?}", spec.stats);
}

#[test]
fn greedy_speculation_equals_plain_decoding_on_wgpu_and_with_attention_on_the_npu_emulator() {
    for backend in ["wgpu", "npu-emu+cpu"] {
        if backend == "wgpu" && !here("wgpu") {
            continue;
        }
        let mut loaded = load_model(fixture("text-published"), backend, 256);
        let p = prompt(12);
        let (truth, _) = run(&mut loaded, &p, 32, SamplerConfig::greedy(), None);
        let target = Target::of(&loaded.session);
        let mut ngram = NgramDrafter::default();
        let mut spec = Speculator::new(&mut ngram, 8, &target).unwrap();
        let (got, _) = run(&mut loaded, &p, 32, SamplerConfig::greedy(), Some(&mut spec));
        assert_eq!(got, truth, "{backend}, ngram: {:?}", spec.stats);
        let mut other = ModelDrafter::new(load_model(fixture("text-newer"), "cpu", 256).session);
        for k in [2, 8] {
            let mut spec = Speculator::new(&mut other, k, &target).unwrap().fixed(k);
            let (got, _) = run(&mut loaded, &p, 32, SamplerConfig::greedy(), Some(&mut spec));
            assert_eq!(got, truth, "{backend}, cpu draft, k {k}: {:?}", spec.stats);
            assert!(spec.stats.blocks > 0, "{backend}: {:?}", spec.stats);
        }
    }
}
