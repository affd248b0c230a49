//! The limits a benchmark sets its figures against, measured in the same run on the same backend:
//! the copy bandwidth (a host copy where the backend has no memory of its own) and the best
//! large matrix product through the trait.

use std::time::Instant;

use tandem_backend_api::{
    ComputeBackend, DType, DeviceKind, GraphBuilder, Op, StepArgs, TensorDesc, Usage, WeightRef,
};

use super::error::BenchError;

/// How a report names [`host_copy_bandwidth`]'s figure.
pub const HOST_COPY_SOURCE: &str = "host memcpy 256 MiB (read + write)";

/// Host copy bandwidth: the best of several copies of a 256 MiB buffer (past any laptop's or
/// server socket's last-level cache; 1 GiB before, 2 GiB held at the end of every `engine
/// bench` on top of the model), counting bytes read and written.
pub fn host_copy_bandwidth() -> f64 {
    let n = 256usize << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let mut best = f64::MAX;
    for _ in 0..8 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(&dst);
    }
    2.0 * n as f64 / best
}

/// Weight bytes of `[n, k]` in `dtype` with small, varied values (no NaN/inf): f32, f16 or
/// q8_0 blocks (an f16 scale, then 32 signed bytes).
fn peak_weight_bytes(dtype: DType, n: usize, k: usize) -> Vec<u8> {
    let value = |i: usize| ((i % 7) as f32 - 3.0) * 0.01;
    match dtype {
        DType::F16 => (0..n * k)
            .flat_map(|i| half::f16::from_f32(value(i)).to_le_bytes())
            .collect(),
        DType::Q8_0 => (0..n * k / 32)
            .flat_map(|b| {
                let mut block = half::f16::from_f32(0.001).to_le_bytes().to_vec();
                block.extend((0..32).map(|i| (((b + i) % 15) as i8 - 7) as u8));
                block
            })
            .collect(),
        _ => (0..n * k).flat_map(|i| value(i).to_le_bytes()).collect(),
    }
}

/// The backend's best rate on a large matrix product, run through the trait: the best of f32,
/// f16 and q8_0 weights, so that it is the peak of the kernels the backend actually has (a
/// GPU's tensor-core path, a CPU's integer dots). GPUs get a product large enough to fill them.
pub fn peak_flops(backend: &mut dyn ComputeBackend) -> Result<(f64, String), BenchError> {
    let info = backend.info();
    let (m, k, n) = match info.kind {
        DeviceKind::DiscreteGpu | DeviceKind::IntegratedGpu => (2048usize, 4096usize, 4096usize),
        _ => (256, 2048, 2048),
    };
    let x = backend.alloc(&TensorDesc::new(DType::F32, [m, k]), Usage::Activation)?;
    let y = backend.alloc(&TensorDesc::new(DType::F32, [m, n]), Usage::Activation)?;
    let xs: Vec<u8> = (0..m * k)
        .flat_map(|i| (((i % 11) as f32 - 5.0) * 0.1).to_le_bytes())
        .collect();
    backend.write(x, 0, &xs)?;
    let zeros = vec![0u32; m];
    let args = StepArgs {
        tokens: &zeros,
        positions: &zeros,
        slots: &zeros,
        select: &[],
    };
    let mut best: Option<(f64, DType)> = None;
    for dtype in [DType::F32, DType::F16, DType::Q8_0] {
        let wdesc = TensorDesc::new(dtype, [n, k]);
        let op = |w| Op::MatMul {
            x: tandem_backend_api::ValueId(0),
            weight: WeightRef {
                buffer: w,
                desc: wdesc.clone(),
            },
            splits: vec![n],
        };
        if !backend
            .supports(&op(tandem_backend_api::BufferId::UNBOUND))
            .is_yes()
        {
            continue;
        }
        let w = backend.alloc(&wdesc, Usage::Weight)?;
        backend.write(w, 0, &peak_weight_bytes(dtype, n, k))?;
        let mut g = GraphBuilder::new("peak matmul", m, 0);
        let xv = g.push1(Op::Input {
            buffer: x,
            cols: k,
            selected: false,
        });
        let yv = g.push1(Op::MatMul {
            x: xv,
            weight: WeightRef {
                buffer: w,
                desc: wdesc.clone(),
            },
            splits: vec![n],
        });
        g.push(Op::Output { x: yv, buffer: y });
        let p = backend.compile(&g.finish())?;
        let mut fastest = f64::MAX;
        for _ in 0..4 {
            let t = Instant::now();
            let ticket = backend.execute(p, &args)?;
            backend.wait(ticket)?;
            fastest = fastest.min(t.elapsed().as_secs_f64());
        }
        backend.release(p)?;
        backend.free(w)?;
        let rate = 2.0 * (m * k * n) as f64 / fastest;
        if best.is_none_or(|(b, _)| rate > b) {
            best = Some((rate, dtype));
        }
    }
    for b in [x, y] {
        backend.free(b)?;
    }
    let Some((rate, dtype)) = best else {
        return Err(BenchError::NoPeak(info.name.clone()));
    };
    Ok((
        rate,
        format!(
            "{} backend matmul {m}x{k}x{n}, best of f32/f16/q8_0 weights: {dtype}",
            info.name
        ),
    ))
}
