//! Micro-benchmarks of the CPU kernels, reference and fast side by side: matrix-vector products
//! per weight format (the decode path), matrix-matrix products (a prefill chunk of 64 rows) and
//! attention over a KV cache. `cargo bench -p tandem-backend-cpu`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tandem_backend_api::DType;
use tandem_backend_cpu::shape::AttentionShape;
use tandem_backend_cpu::weight::WeightView;
use tandem_backend_cpu::{attention, kernels, matmul};
use tandem_backend_cpu::{ActScratch, KernelSet};

/// Deterministic bytes for a weight: for block formats, small f16 scales so values stay finite.
fn weight_bytes(dtype: DType, n: usize, k: usize) -> Vec<u8> {
    let len = dtype.row_bytes(k).expect("whole blocks") * n;
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut bytes: Vec<u8> = (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect();
    if dtype.is_quantized() || dtype == DType::F16 || dtype == DType::Bf16 || dtype == DType::F32 {
        // Clear exponent bits that could make inf/NaN scales or values: every 2-byte word's
        // top bits are set to a small exponent. The values are meaningless; only speed matters.
        for c in bytes.chunks_exact_mut(2) {
            c[1] &= 0x3B;
        }
    }
    bytes
}

/// `rows` activation rows times a 2048x2048 weight of each format, on the reference kernels
/// and (for the formats it covers) the fast ones.
fn products(c: &mut Criterion, rows: usize, label: &str) {
    let pool = rayon::ThreadPoolBuilder::new().build().expect("thread pool");
    let (n, k) = (2048usize, 2048usize);
    let mut group = c.benchmark_group(label);
    for dtype in [
        DType::F32,
        DType::F16,
        DType::Bf16,
        DType::Q8_0,
        DType::Q5_0,
        DType::Q4K,
        DType::Q6K,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_1,
        DType::Q5K,
    ] {
        let bytes = weight_bytes(dtype, n, k);
        let w = WeightView {
            bytes: &bytes,
            dtype,
            n,
            k,
        };
        let x: Vec<f32> = (0..rows * k).map(|i| ((i % 13) as f32 - 6.0) * 0.01).collect();
        let mut scratch = vec![0f32; n * rows];
        // The backend's activations, kept between products as the backend keeps them.
        let mut act = ActScratch::default();
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        let fast_too = dtype.is_quantized();
        for (name, fast, int8) in [
            ("reference", false, false),
            ("fast", true, false),
            ("fast_int8", true, true),
        ] {
            if fast && !fast_too {
                continue;
            }
            group.bench_with_input(BenchmarkId::new(name, dtype), &dtype, |b, _| {
                b.iter(|| {
                    matmul::product(
                        &pool,
                        None,
                        &x,
                        rows,
                        w,
                        &mut scratch,
                        &mut act,
                        fast.then(KernelSet::detect),
                        true,
                        int8,
                    )
                })
            });
        }
    }
    group.finish();
}

fn matvec(c: &mut Criterion) {
    products(c, 1, "matvec 2048x2048");
}

fn matmat(c: &mut Criterion) {
    products(c, 64, "matmul 64x2048x2048");
}

fn attention(c: &mut Criterion) {
    let pool = rayon::ThreadPoolBuilder::new().build().expect("thread pool");
    let mut group = c.benchmark_group("attention decode");
    for ctx in [512usize, 4096] {
        let s = AttentionShape {
            heads: 8,
            kv_heads: 4,
            head_dim: 256,
            capacity: ctx,
            scale: 1.0 / 16.0,
            window: None,
            softcap: None,
            cache_dtype: DType::F32,
        };
        let kv_cols = s.kv_heads * s.head_dim;
        // f32 values, so the fast kernel can view the bytes in place.
        let values: Vec<f32> = (0..ctx * kv_cols).map(|i| ((i % 17) as f32) * 0.01).collect();
        let cache: &[u8] = bytemuck::cast_slice(&values);
        let q: Vec<f32> = (0..s.heads * s.head_dim).map(|i| (i % 7) as f32 * 0.1).collect();
        let mut out = vec![0f32; s.heads * s.head_dim];
        let pos = [ctx as u32 - 1];
        group.throughput(Throughput::Bytes(2 * cache.len() as u64));
        group.bench_with_input(BenchmarkId::new("reference", ctx), &ctx, |b, _| {
            b.iter(|| kernels::attend(&pool, &s, &q, &pos, &pos, &[0], cache, cache, &mut out))
        });
        assert!(
            attention::attend(&pool, None, &s, &q, &pos, &[0], cache, cache, &mut out),
            "the fast attention takes an f32 cache"
        );
        group.bench_with_input(BenchmarkId::new("fast", ctx), &ctx, |b, _| {
            b.iter(|| attention::attend(&pool, None, &s, &q, &pos, &[0], cache, cache, &mut out))
        });
    }
    group.finish();
}

/// The vision tower's block attention (SigLIP: 16 heads of 72; one image is a block of 4,096
/// rows, here 1,024 to keep the reference affordable): the per-row reference kernel beside the
/// tiles (`attention::block_attention`).
fn block_attention(c: &mut Criterion) {
    let pool = rayon::ThreadPoolBuilder::new().build().expect("thread pool");
    let mut group = c.benchmark_group("block attention 16x72");
    group.sample_size(10);
    let (heads, head_dim, rows) = (16usize, 72usize, 1024usize);
    let cols = heads * head_dim;
    let x: Vec<f32> = (0..rows * cols)
        .map(|i| ((i % 23) as f32 - 11.0) * 0.02)
        .collect();
    let mut out = vec![0f32; rows * cols];
    group.throughput(Throughput::Elements((4 * rows * rows * cols) as u64));
    group.bench_with_input(BenchmarkId::new("reference", rows), &rows, |b, _| {
        b.iter(|| kernels::block_attention(&pool, &x, &x, &x, heads, head_dim, 0.12, rows, &mut out))
    });
    group.bench_with_input(BenchmarkId::new("tiles", rows), &rows, |b, _| {
        b.iter(|| {
            assert!(attention::block_attention(
                &pool, &x, &x, &x, heads, head_dim, 0.12, rows, &mut out
            ));
        })
    });
    group.finish();
}

/// Decode's largest product, Gemma 3's tied-embedding logits (262 144 x 640 in `q8_0`, 178 MB,
/// far past the caches), on 1 thread and on all, beside a plain read of the same bytes: how
/// close the matrix-vector path comes to the memory's speed.
fn head(c: &mut Criterion) {
    let (n, k, dtype) = (262_144usize, 640usize, DType::Q8_0);
    let bytes = weight_bytes(dtype, n, k);
    let w = WeightView {
        bytes: &bytes,
        dtype,
        n,
        k,
    };
    let x: Vec<f32> = (0..k).map(|i| ((i % 13) as f32 - 6.0) * 0.01).collect();
    let mut scratch = vec![0f32; n];
    let mut act = ActScratch::default();
    let mut group = c.benchmark_group("logits matvec 262144x640 q8_0");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    for threads in [1, all] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("thread pool");
        for (name, int8) in [("fast", false), ("fast_int8", true)] {
            group.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, _| {
                b.iter(|| {
                    matmul::product(
                        &pool,
                        None,
                        &x,
                        1,
                        w,
                        &mut scratch,
                        &mut act,
                        Some(KernelSet::detect()),
                        false,
                        int8,
                    )
                })
            });
        }
        group.bench_with_input(BenchmarkId::new("read", threads), &threads, |b, _| {
            b.iter(|| {
                pool.install(|| {
                    use rayon::prelude::*;
                    bytes
                        .par_chunks(1 << 20)
                        .map(|c| {
                            c.chunks_exact(8).fold(0u64, |a, b| {
                                a ^ u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))
                            })
                        })
                        .reduce(|| 0, |a, b| a ^ b)
                })
            })
        });
    }
    group.finish();
}

/// A 512-token prefill's feed-forward products at Gemma 3 4B's shapes (hidden 2560, FFN 10240)
/// in `q4_k`, on each 512-bit kernel set the CPU runs, and on `avx512_vnni` with 8-bit
/// activations as well (`precision = "fast"`, `avx512_vnni_int8`): weights and activations far
/// past the caches, so the product's blocking for them shows. Throughput in multiply-adds. The
/// pool takes `RAYON_NUM_THREADS` (all the cores where unset).
fn prefill(c: &mut Criterion) {
    let pool = rayon::ThreadPoolBuilder::new().build().expect("thread pool");
    let rows = 512usize;
    let mut group = c.benchmark_group("prefill 512 rows q4_k");
    group.sample_size(10);
    for (n, k) in [(10_240usize, 2560usize), (2560, 10_240)] {
        let dtype = DType::Q4K;
        let bytes = weight_bytes(dtype, n, k);
        let w = WeightView {
            bytes: &bytes,
            dtype,
            n,
            k,
        };
        let x: Vec<f32> = (0..rows * k).map(|i| ((i % 13) as f32 - 6.0) * 0.01).collect();
        let mut scratch = vec![0f32; n * rows];
        // The backend's activations, kept between products as the backend keeps them.
        let mut act = ActScratch::default();
        group.throughput(Throughput::Elements((rows * n * k) as u64));
        let id = format!("{n}x{k}");
        // Each 512-bit set the CPU runs: AMX tiles beside the VNNI ones where both are.
        for set in [KernelSet::Amx, KernelSet::Avx512Vnni, KernelSet::Avx512]
            .into_iter()
            .filter(|s| s.available())
        {
            // The VNNI set once more with 8-bit activations (`precision = "fast"`).
            let int8s: &[bool] = if set == KernelSet::Avx512Vnni {
                &[false, true]
            } else {
                &[false]
            };
            for &int8 in int8s {
                let name = if int8 {
                    format!("{}_int8", set.name())
                } else {
                    set.name().to_string()
                };
                group.bench_with_input(BenchmarkId::new(name, &id), &id, |b, _| {
                    b.iter(|| {
                        matmul::product(
                            &pool,
                            None,
                            &x,
                            rows,
                            w,
                            &mut scratch,
                            &mut act,
                            Some(set),
                            true,
                            int8,
                        )
                    })
                });
            }
        }
    }
    group.finish();
}

/// `bf16` and `f16` weights (a Hugging Face checkpoint's, the vision tower's) at 512 rows, the
/// SigLIP MLP's shapes: the prefill tiles (`gemm`) beside the dot products.
fn prefill_float16(c: &mut Criterion) {
    let pool = rayon::ThreadPoolBuilder::new().build().expect("thread pool");
    let rows = 512usize;
    let mut group = c.benchmark_group("prefill 512 rows float16");
    group.sample_size(10);
    let Some(set) = [KernelSet::Avx512, KernelSet::Avx2]
        .into_iter()
        .find(|s| s.available())
    else {
        return;
    };
    for dtype in [DType::F16, DType::Bf16] {
        for (n, k) in [(4304usize, 1152usize), (1152, 4304)] {
            let mut bytes = weight_bytes(dtype, n, k);
            if dtype == DType::Bf16 {
                // An exponent of at least 2^-31 (`weight_bytes` leaves bf16 subnormals, which
                // real weights do not hold and which take the CPU's slow path).
                for c in bytes.chunks_exact_mut(2) {
                    c[1] |= 0x30;
                }
            }
            let w = WeightView {
                bytes: &bytes,
                dtype,
                n,
                k,
            };
            let x: Vec<f32> = (0..rows * k).map(|i| ((i % 13) as f32 - 6.0) * 0.01).collect();
            let mut scratch = vec![0f32; n * rows];
            let mut act = ActScratch::default();
            group.throughput(Throughput::Elements((rows * n * k) as u64));
            for gemm in [true, false] {
                let name = format!("{}_{}", dtype.name(), if gemm { "tiles" } else { "dots" });
                group.bench_with_input(BenchmarkId::new(name, format!("{n}x{k}")), &k, |b, _| {
                    b.iter(|| {
                        matmul::product(
                            &pool,
                            None,
                            &x,
                            rows,
                            w,
                            &mut scratch,
                            &mut act,
                            Some(set),
                            gemm,
                            false,
                        )
                    })
                });
            }
        }
    }
    group.finish();
}

criterion_group!(
    benches,
    matvec,
    matmat,
    attention,
    block_attention,
    head,
    prefill,
    prefill_float16
);
criterion_main!(benches);
