//! Nothing is allocated in the token loop: after warm-up steps, `execute` of a decode-shaped
//! graph (quantized matmuls on the fast kernels, attention over an f32 KV cache) makes no heap
//! allocation of its own on the calling thread or the backend's threads, counted by a global
//! allocator around the calls. The one allocation left is rayon's: each step is handed into the
//! thread pool as one job, and rayon's injector queue allocates a block per 63 jobs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tandem_backend_api::{
    BackendOptions, BackendPlugin, ComputeBackend, DType, GraphBuilder, KvCacheRef, Op, StepArgs, TensorDesc,
    Usage, WeightRef,
};
use tandem_backend_cpu::CpuBackend;

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; it only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as in `alloc` and `dealloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// `n` rows of `k` values as `q8_0` or `q5_0` blocks with scale 0.01 and varied values.
fn weight(be: &mut CpuBackend, dtype: DType, n: usize, k: usize) -> WeightRef {
    let desc = TensorDesc::new(dtype, [n, k]);
    let len = dtype.row_bytes(k).unwrap() * n;
    let block = if dtype == DType::Q8_0 { 34 } else { 22 };
    let mut bytes: Vec<u8> = (0..len).map(|i| (i * 37 % 251) as u8).collect();
    for b in bytes.chunks_exact_mut(block) {
        b[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
    }
    let buffer = be.alloc(&desc, Usage::Weight).unwrap();
    be.write(buffer, 0, &bytes).unwrap();
    WeightRef { buffer, desc }
}

#[test]
fn decode_steps_allocate_nothing() {
    let mut options = BackendOptions::default();
    options.set("threads", "2");
    let mut be = CpuBackend::create(&options).unwrap();
    let (hidden, heads, head_dim, capacity) = (64usize, 2usize, 32usize, 256usize);
    let x_buf = be
        .alloc(&TensorDesc::new(DType::F32, [hidden]), Usage::Activation)
        .unwrap();
    let x_bytes: Vec<u8> = (0..hidden)
        .flat_map(|i| (i as f32 * 0.1 - 3.0).to_le_bytes())
        .collect();
    be.write(x_buf, 0, &x_bytes).unwrap();
    let out_buf = be
        .alloc(&TensorDesc::new(DType::F32, [hidden]), Usage::Activation)
        .unwrap();
    let cache_desc = TensorDesc::new(DType::F32, [1, capacity, head_dim]);
    let cache = KvCacheRef {
        k: be.alloc(&cache_desc, Usage::KvCache).unwrap(),
        v: be.alloc(&cache_desc, Usage::KvCache).unwrap(),
        dtype: DType::F32,
        slots: 1,
        capacity,
    };
    let qkv = weight(&mut be, DType::Q8_0, heads * head_dim + 2 * head_dim, hidden);
    let o = weight(&mut be, DType::Q5_0, hidden, heads * head_dim);

    let mut g = GraphBuilder::new("decode", 1, 0);
    let x = g.push1(Op::Input {
        buffer: x_buf,
        cols: hidden,
        selected: false,
    });
    let parts = g.push(Op::MatMul {
        x,
        weight: qkv,
        splits: vec![heads * head_dim, head_dim, head_dim],
    });
    let a = g.push1(Op::Attention {
        q: parts[0],
        k: parts[1],
        v: parts[2],
        cache,
        heads,
        kv_heads: 1,
        head_dim,
        scale: 0.2,
        window: None,
        softcap: None,
        bidirectional_from: None,
    });
    let y = g.push1(Op::MatMul {
        x: a,
        weight: o,
        splits: vec![hidden],
    });
    g.push(Op::Output {
        x: y,
        buffer: out_buf,
    });
    let program = be.compile(&g.finish()).unwrap();

    const WARM_UP: usize = 24;
    let steps = 160usize;
    let mut counts = Vec::with_capacity(steps);
    for pos in 0..steps as u32 {
        let positions = [pos];
        let args = StepArgs {
            tokens: &[0],
            positions: &positions,
            slots: &[0],
            select: &[],
        };
        // Count after a warm-up. Per-thread scratch is grown on every pool thread at compile:
        // a step runs on whichever pool thread takes it, and one grown lazily (the attention's
        // lists of rows, the 8-bit activations) allocated on that thread's first step, which
        // work stealing put off to step 42 or 66 now and then (more often on a loaded
        // machine).
        ALLOCATIONS.store(0, Ordering::Relaxed);
        COUNTING.store(pos >= WARM_UP as u32, Ordering::Relaxed);
        let ticket = be.execute(program, &args).unwrap();
        be.wait(ticket).unwrap();
        COUNTING.store(false, Ordering::Relaxed);
        counts.push(ALLOCATIONS.load(Ordering::Relaxed));
    }
    let mut out = vec![0u8; hidden * 4];
    be.read(out_buf, 0, &mut out).unwrap();
    assert!(out.iter().any(|&b| b != 0), "the graph computed nothing");
    let counted = &counts[WARM_UP..];
    let total: usize = counted.iter().sum();
    assert!(
        total <= counted.len().div_ceil(63),
        "{total} allocations in {} steps, more than rayon's injector blocks (one per 63 steps); per step: {counts:?}",
        counted.len()
    );
}
