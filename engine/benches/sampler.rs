//! The host's share of a batched decode step that samples, over Gemma 3's 262,144-token
//! vocabulary: greedy picks, one row and 32 rows, beside the one-pass compare chain the sampler
//! used before; the default sampling settings, one row, 32 rows one after another, and 32 rows
//! spread over threads (`sample_rows`). `cargo bench -p tandem-engine --bench sampler`.

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use tandem_engine::runtime::sampler::{argmax, sample_rows, Sampler, SamplerConfig};

/// The previous greedy pick: one compare chain over the row.
fn one_pass(logits: &[f32]) -> u32 {
    let (mut best, mut value) = (0usize, f32::NEG_INFINITY);
    for (i, &l) in logits.iter().enumerate() {
        if l > value {
            (best, value) = (i, l);
        }
    }
    best as u32
}

/// `n` pseudo-random logits in [-8, 8) from `seed` (xorshift).
fn random_logits(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 20) as f32 - 8.0
        })
        .collect()
}

fn greedy(c: &mut Criterion) {
    let vocab = 262_144usize;
    let logits = random_logits(32 * vocab, 0x2545_F491_4F6C_DD1D);
    let mut group = c.benchmark_group("greedy pick, vocab 262144");
    for rows in [1usize, 32] {
        group.throughput(Throughput::Elements((rows * vocab) as u64));
        let rows_of = &logits[..rows * vocab];
        group.bench_with_input(BenchmarkId::new("two-pass", rows), &rows, |b, _| {
            b.iter(|| rows_of.chunks_exact(vocab).map(argmax).sum::<u32>())
        });
        group.bench_with_input(BenchmarkId::new("one-pass", rows), &rows, |b, _| {
            b.iter(|| rows_of.chunks_exact(vocab).map(one_pass).sum::<u32>())
        });
    }
    group.finish();
}

/// The default sampling settings (temperature 1, top-k 64, top-p 0.95) over one row and 32 rows:
/// the host's share of a sampled batched step in `engine serve`.
fn sampled(c: &mut Criterion) {
    let vocab = 262_144usize;
    let logits = random_logits(32 * vocab, 0x9E37_79B9_7F4A_7C15);
    let mut group = c.benchmark_group("default sampling, vocab 262144");
    let mut sampler = Sampler::new(SamplerConfig::default()).expect("default settings");
    for rows in [1usize, 32] {
        group.throughput(Throughput::Elements((rows * vocab) as u64));
        // The sampler may write into the row (scratch), so each iteration gets a fresh copy,
        // made outside the timed part.
        group.bench_with_input(
            BenchmarkId::new("top-k 64, top-p 0.95", rows),
            &rows,
            |b, &rows| {
                b.iter_batched_ref(
                    || logits[..rows * vocab].to_vec(),
                    |scratch| {
                        scratch
                            .chunks_exact_mut(vocab)
                            .map(|row| sampler.sample(row, &[]))
                            .sum::<u32>()
                    },
                    BatchSize::LargeInput,
                )
            },
        );
    }
    // 32 rows, each with its own sampler, spread over threads as `engine serve`'s batcher does.
    let mut samplers: Vec<Sampler> = (0..32)
        .map(|_| Sampler::new(SamplerConfig::default()).expect("default settings"))
        .collect();
    group.throughput(Throughput::Elements((32 * vocab) as u64));
    group.bench_function(BenchmarkId::new("top-k 64, top-p 0.95, sample_rows", 32), |b| {
        b.iter_batched_ref(
            || logits.clone(),
            |scratch| {
                let mut picks = [0u32; 32];
                let mut rows: Vec<(&mut Sampler, &[u32], &mut [f32], &mut u32)> = samplers
                    .iter_mut()
                    .zip(scratch.chunks_exact_mut(vocab))
                    .zip(picks.iter_mut())
                    .map(|((s, l), p)| (s, &[][..], l, p))
                    .collect();
                sample_rows(&mut rows);
                picks.iter().sum::<u32>()
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, greedy, sampled);
criterion_main!(benches);
