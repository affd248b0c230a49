//! The device executor: the attention kernel run on an NPU through `xrt-sys`'s [`NpuDevice`]
//! (the amdxdna driver's uAPI on a real machine; a fake in the tests). Per kernel shape and
//! phase it loads the artefact once (xclbin registered in a hardware context, instruction
//! stream in its buffer); per dispatch it writes the params and q buffers, runs
//! `(params, q, k cache, v cache, out)` and waits with a timeout. KV caches are device buffers
//! for their whole life; the host writes each step's keys and values into them.
//!
//! This path has not run on an NPU (none was available); its tests drive it against a fake
//! device whose "kernel" is the emulator, which checks every byte the host hands over.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tandem_backend_api::BackendError;
use xrt_sys::{BoHandle, BoKind, ContextHandle, NpuDevice, Xclbin, XrtError};

use crate::artefacts::Artefacts;
use crate::contract::{AttnParams, KernelShape, Phase};
use crate::executor::{DispatchTime, Executor, KvId};

/// A loaded kernel: its hardware context and instruction stream.
struct Loaded {
    ctx: ContextHandle,
    instructions: BoHandle,
    words: u32,
}

/// A staging buffer that grows to the largest dispatch seen.
#[derive(Default)]
struct Staging {
    bo: Option<(BoHandle, usize)>,
}

/// Why the device path takes no op in a placement yet.
pub const STATIC_STREAM: &str =
    "the NPU kernels' prebuilt instruction streams run only the canonical dispatch they were \
     generated for (shaders/npu/CONTRACT.md section 6); generating a stream per dispatch is not built yet, \
     so attention stays on the next backend";

/// The device executor over any [`NpuDevice`].
pub struct DeviceExecutor<D: NpuDevice> {
    /// Whether instruction streams are generated per dispatch (not built: see
    /// [`STATIC_STREAM`]); until then `supports` refuses, and `attention` runs what it is given
    /// (the tests drive it with the canonical dispatch).
    dynamic_streams: bool,
    device: D,
    artefacts: Artefacts,
    timeout: Duration,
    kernels: HashMap<(Phase, KernelShape), Loaded>,
    caches: HashMap<u64, (BoHandle, usize)>,
    params: Staging,
    q: Staging,
    out: Staging,
    next: u64,
}

/// A device error as a backend error naming the call.
fn dev(e: XrtError) -> BackendError {
    match e {
        XrtError::Timeout { .. } => BackendError::DeviceLost {
            device: format!("NPU: {e}"),
        },
        other => BackendError::internal(format!("NPU: {other}")),
    }
}

impl<D: NpuDevice> DeviceExecutor<D> {
    /// An executor over `device` with kernels from `artefacts`, waiting at most `timeout` per
    /// run.
    pub fn new(device: D, artefacts: Artefacts, timeout: Duration) -> Self {
        DeviceExecutor {
            dynamic_streams: false,
            device,
            artefacts,
            timeout,
            kernels: HashMap::new(),
            caches: HashMap::new(),
            params: Staging::default(),
            q: Staging::default(),
            out: Staging::default(),
            next: 1,
        }
    }

    /// The device.
    pub fn device_ref(&self) -> &D {
        &self.device
    }

    fn kernel(&mut self, phase: Phase, shape: KernelShape, context: usize) -> Result<&Loaded, BackendError> {
        if !self.kernels.contains_key(&(phase, shape)) {
            let (index, entry) =
                self.artefacts
                    .find(phase, shape, context)
                    .ok_or_else(|| BackendError::Unsupported {
                        op: "attention".into(),
                        reason: format!(
                            "no {} kernel for {shape} seeing {context} positions in {} (it has: {})",
                            phase.name(),
                            self.artefacts.dir.display(),
                            self.artefacts.offered()
                        ),
                    })?;
            let name = entry.kernel.clone();
            let files = self
                .artefacts
                .load(index)
                .map_err(|e| BackendError::internal(e.to_string()))?;
            let xclbin = Xclbin::parse(files.xclbin).map_err(|e| {
                let path = self
                    .artefacts
                    .dir
                    .join(&self.artefacts.manifest.kernels[index].xclbin);
                BackendError::internal(format!("{}: {e}", path.display()))
            })?;
            let ctx = self.device.open_context(&xclbin, &name).map_err(dev)?;
            let bytes: Vec<u8> = files.instructions.iter().flat_map(|w| w.to_le_bytes()).collect();
            let instructions = self
                .device
                .alloc(BoKind::Instructions, bytes.len())
                .map_err(dev)?;
            self.device.write(instructions, 0, &bytes).map_err(dev)?;
            self.kernels.insert(
                (phase, shape),
                Loaded {
                    ctx,
                    instructions,
                    words: files.instructions.len() as u32,
                },
            );
        }
        self.kernels
            .get(&(phase, shape))
            .ok_or_else(|| BackendError::internal("kernel vanished"))
    }

    /// `staging`'s buffer, grown to at least `bytes`.
    fn staging(device: &mut D, staging: &mut Staging, bytes: usize) -> Result<BoHandle, BackendError> {
        match staging.bo {
            Some((bo, size)) if size >= bytes => Ok(bo),
            old => {
                if let Some((bo, _)) = old {
                    device.free(bo).map_err(dev)?;
                }
                let size = bytes.next_power_of_two().max(4096);
                let bo = device.alloc(BoKind::Data, size).map_err(dev)?;
                staging.bo = Some((bo, size));
                Ok(bo)
            }
        }
    }

    fn cache(&self, kv: KvId) -> Result<(BoHandle, usize), BackendError> {
        self.caches
            .get(&kv.0)
            .copied()
            .ok_or_else(|| BackendError::invalid(format!("unknown NPU cache buffer {}", kv.0)))
    }
}

fn u16_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl<D: NpuDevice> Executor for DeviceExecutor<D> {
    fn device(&self) -> String {
        let i = self.device.info();
        format!("AMD NPU {} ({}) at {}", i.generation, i.vbnv, i.node.display())
    }

    fn features(&self) -> Vec<String> {
        let i = self.device.info();
        let mut f = vec![
            format!("pci={}", i.pci),
            format!("firmware={}", i.firmware_version.as_deref().unwrap_or("unknown")),
            format!("driver={}", i.driver_version),
            format!("kernel_abi={}", crate::contract::ABI_VERSION),
        ];
        if let Some(x) = &i.xrt_version {
            f.push(format!("xrt={x}"));
        }
        f.push(format!("artefacts={}", self.artefacts.dir.display()));
        f
    }

    fn supports(&self, shape: KernelShape) -> Result<(), String> {
        if !self.dynamic_streams {
            return Err(STATIC_STREAM.into());
        }
        for phase in [Phase::Decode, Phase::Prefill] {
            if self.artefacts.find(phase, shape, 1).is_none() {
                return Err(format!(
                    "no {} kernel for {shape} in {} (it has: {})",
                    phase.name(),
                    self.artefacts.dir.display(),
                    self.artefacts.offered()
                ));
            }
        }
        Ok(())
    }

    fn alloc_kv(&mut self, elems: usize) -> Result<KvId, BackendError> {
        let bytes = elems
            .checked_mul(2)
            .ok_or_else(|| BackendError::invalid("KV cache too large"))?;
        // `NpuDevice::alloc` hands out zero-filled buffers, as a cache starts.
        let bo = self.device.alloc(BoKind::Data, bytes).map_err(dev)?;
        let id = self.next;
        self.next += 1;
        self.caches.insert(id, (bo, elems));
        Ok(KvId(id))
    }

    fn free_kv(&mut self, kv: KvId) -> Result<(), BackendError> {
        let (bo, _) = self.cache(kv)?;
        self.caches.remove(&kv.0);
        self.device.free(bo).map_err(dev)
    }

    fn write_kv(&mut self, kv: KvId, at: usize, data: &[u16]) -> Result<(), BackendError> {
        let (bo, elems) = self.cache(kv)?;
        crate::executor::span(at, data.len(), elems)?;
        self.device.write(bo, at * 2, &u16_bytes(data)).map_err(dev)
    }

    fn read_kv(&mut self, kv: KvId, at: usize, out: &mut [u16]) -> Result<(), BackendError> {
        let (bo, elems) = self.cache(kv)?;
        crate::executor::span(at, out.len(), elems)?;
        let mut bytes = vec![0u8; out.len() * 2];
        self.device.read(bo, at * 2, &mut bytes).map_err(dev)?;
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            *o = u16::from_le_bytes([c[0], c[1]]);
        }
        Ok(())
    }

    fn attention(
        &mut self,
        shape: KernelShape,
        params: &AttnParams,
        q: &[u16],
        k: KvId,
        v: KvId,
        out: &mut [u16],
    ) -> Result<DispatchTime, BackendError> {
        let start = Instant::now();
        let (kb, _) = self.cache(k)?;
        let (vb, _) = self.cache(v)?;
        let context = (0..params.rows)
            .map(|r| params.positions[r] as usize + 1 - params.lo(r))
            .max()
            .unwrap_or(1);
        let phase = Phase::of_step(&params.row_slots);
        let (ctx, instructions, words) = {
            let k = self.kernel(phase, shape, context)?;
            (k.ctx, k.instructions, k.words)
        };
        let words_bytes: Vec<u8> = params.encode().iter().flat_map(|w| w.to_le_bytes()).collect();
        let pb = Self::staging(&mut self.device, &mut self.params, words_bytes.len())?;
        self.device.write(pb, 0, &words_bytes).map_err(dev)?;
        let qb = Self::staging(&mut self.device, &mut self.q, q.len() * 2)?;
        self.device.write(qb, 0, &u16_bytes(q)).map_err(dev)?;
        let ob = Self::staging(&mut self.device, &mut self.out, out.len() * 2)?;
        let run = self
            .device
            .run(ctx, instructions, words, &[pb, qb, kb, vb, ob])
            .map_err(dev)?;
        self.device.wait(run, self.timeout).map_err(dev)?;
        let mut bytes = vec![0u8; out.len() * 2];
        self.device.read(ob, 0, &mut bytes).map_err(dev)?;
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            *o = u16::from_le_bytes([c[0], c[1]]);
        }
        Ok(DispatchTime {
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    fn bytes_in_use(&self) -> u64 {
        let staged: usize = [&self.params, &self.q, &self.out]
            .iter()
            .filter_map(|s| s.bo.map(|(_, n)| n))
            .sum();
        self.caches.values().map(|(_, e)| 2 * *e as u64).sum::<u64>() + staged as u64
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use xrt_sys::{AxlfBuilder, DeviceInfo, Generation, PciId, RunHandle};

    use super::*;
    use crate::artefacts::tests::write_artefacts;
    use crate::contract::{bf16_round, PARAMS_HEADER_WORDS};
    use crate::emu;

    /// A device whose kernel is the emulator: it decodes the params buffer as the cores do and
    /// runs the contract's arithmetic over the buffers it was handed.
    struct FakeNpu {
        info: DeviceInfo,
        bos: HashMap<u32, (BoKind, Vec<u8>)>,
        contexts: Vec<String>,
        runs: Vec<(u32, Vec<u32>)>,
        hang: bool,
        next: u32,
    }

    impl FakeNpu {
        fn new() -> Self {
            FakeNpu {
                info: DeviceInfo {
                    node: PathBuf::from("/dev/accel/accel0"),
                    pci: PciId {
                        slot: "0000:c6:00.1".into(),
                        vendor: 0x1022,
                        device: 0x17f0,
                        revision: 0x10,
                    },
                    generation: Generation::Npu4,
                    driver: Some("amdxdna".into()),
                    vbnv: "RyzenAI-npu4".into(),
                    device_type: Some(0),
                    firmware_version: Some("1.0.0.166".into()),
                    driver_version: "in-tree (Linux 6.14.0)".into(),
                    kernel_release: Some("6.14.0".into()),
                    xrt_version: None,
                },
                bos: HashMap::new(),
                contexts: Vec::new(),
                runs: Vec::new(),
                hang: false,
                next: 1,
            }
        }

        fn bo(&mut self, bo: BoHandle) -> Result<&mut Vec<u8>, XrtError> {
            self.bos
                .get_mut(&bo.0)
                .map(|(_, b)| b)
                .ok_or_else(|| XrtError::InvalidArgument(format!("unknown bo {}", bo.0)))
        }

        fn u16s(&self, bo: BoHandle, n: usize) -> Vec<u16> {
            self.bos[&bo.0].1[..n * 2]
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect()
        }
    }

    impl NpuDevice for FakeNpu {
        fn info(&self) -> &DeviceInfo {
            &self.info
        }
        fn open_context(&mut self, xclbin: &Xclbin, kernel: &str) -> Result<ContextHandle, XrtError> {
            assert!(!xclbin.bytes().is_empty());
            self.contexts.push(kernel.to_string());
            Ok(ContextHandle(self.contexts.len() as u32))
        }
        fn close_context(&mut self, _: ContextHandle) -> Result<(), XrtError> {
            Ok(())
        }
        fn alloc(&mut self, kind: BoKind, bytes: usize) -> Result<BoHandle, XrtError> {
            self.next += 1;
            self.bos.insert(self.next, (kind, vec![0; bytes]));
            Ok(BoHandle(self.next))
        }
        fn write(&mut self, bo: BoHandle, offset: usize, data: &[u8]) -> Result<(), XrtError> {
            let b = self.bo(bo)?;
            b[offset..offset + data.len()].copy_from_slice(data);
            Ok(())
        }
        fn read(&mut self, bo: BoHandle, offset: usize, out: &mut [u8]) -> Result<(), XrtError> {
            let b = self.bo(bo)?;
            out.copy_from_slice(&b[offset..offset + out.len()]);
            Ok(())
        }
        fn free(&mut self, bo: BoHandle) -> Result<(), XrtError> {
            self.bos
                .remove(&bo.0)
                .map(|_| ())
                .ok_or(XrtError::InvalidArgument("double free".into()))
        }
        fn run(
            &mut self,
            _: ContextHandle,
            instr: BoHandle,
            words: u32,
            args: &[BoHandle],
        ) -> Result<RunHandle, XrtError> {
            assert_eq!(self.bos[&instr.0].0, BoKind::Instructions);
            let stream: Vec<u32> = self.bos[&instr.0].1[..words as usize * 4]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            self.runs.push((words, stream));
            if self.hang {
                return Ok(RunHandle(self.runs.len() as u64));
            }
            let [pb, qb, kb, vb, ob] = args else {
                panic!("{} arguments", args.len())
            };
            let header: Vec<u32> = self.bos[&pb.0].1[..PARAMS_HEADER_WORDS * 4]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let words = PARAMS_HEADER_WORDS + 2 * header[1] as usize;
            let all: Vec<u32> = self.bos[&pb.0].1[..words * 4]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let p = AttnParams::decode(&all).expect("the host wrote valid params");
            let (q, k, v) = (
                self.u16s(*qb, p.q_elems()),
                self.u16s(*kb, p.cache_elems()),
                self.u16s(*vb, p.cache_elems()),
            );
            let mut out = vec![0u16; p.q_elems()];
            emu::attention(&p, &q, &k, &v, &mut out).expect("the kernel runs");
            let bytes: Vec<u8> = out.iter().flat_map(|x| x.to_le_bytes()).collect();
            self.write(*ob, 0, &bytes)?;
            Ok(RunHandle(self.runs.len() as u64))
        }
        fn wait(&mut self, _: RunHandle, timeout: Duration) -> Result<(), XrtError> {
            if self.hang {
                return Err(XrtError::Timeout {
                    call: "DRM_IOCTL_SYNCOBJ_TIMELINE_WAIT",
                    after: timeout,
                });
            }
            Ok(())
        }
    }

    const SHAPE: KernelShape = KernelShape {
        head_dim: 16,
        group: 2,
    };

    fn executor(tag: &str) -> DeviceExecutor<FakeNpu> {
        let xclbin = AxlfBuilder::mlir_aie("MLIR_AIE", 4, b"pdi").build();
        let dir = write_artefacts(tag, "npu4", SHAPE, &xclbin, &[0xdead_beef, 7, 9]);
        let a = Artefacts::open(&dir, "npu4").unwrap();
        DeviceExecutor::new(FakeNpu::new(), a, Duration::from_millis(50))
    }

    /// The canonical decode dispatch of the contract's section 6 with a group of 2.
    fn canonical() -> AttnParams {
        AttnParams {
            rows: 4,
            heads: 2,
            kv_heads: 1,
            head_dim: 16,
            capacity: 512,
            window: None,
            scale: 0.25,
            slots: 4,
            positions: (0..4).map(|r| 128 * (r + 1) - 1).collect(),
            row_slots: (0..4).collect(),
        }
    }

    #[test]
    fn a_dispatch_hands_the_device_what_the_contract_says() {
        let mut ex = executor("dispatch");
        let p = canonical();
        let (k, v) = (
            ex.alloc_kv(p.cache_elems()).unwrap(),
            ex.alloc_kv(p.cache_elems()).unwrap(),
        );
        let fill = |n: usize, s: f32| -> Vec<u16> {
            (0..n)
                .map(|i| bf16_round(((i * 37 % 101) as f32 / 50.0 - 1.0) * s))
                .collect()
        };
        let (kc, vc) = (fill(p.cache_elems(), 1.0), fill(p.cache_elems(), 0.5));
        ex.write_kv(k, 0, &kc).unwrap();
        ex.write_kv(v, 0, &vc).unwrap();
        let q = fill(p.q_elems(), 0.7);
        let mut got = vec![0u16; p.q_elems()];
        ex.attention(SHAPE, &p, &q, k, v, &mut got).unwrap();
        // The same dispatch on the emulator directly.
        let mut want = vec![0u16; p.q_elems()];
        emu::attention(&p, &q, &kc, &vc, &mut want).unwrap();
        assert_eq!(got, want);
        // The decode kernel's instruction stream went in as written, and was loaded once.
        ex.attention(SHAPE, &p, &q, k, v, &mut got).unwrap();
        let dev = ex.device_ref();
        assert_eq!(dev.contexts, vec!["MLIR_AIE".to_string()]);
        assert_eq!(dev.runs.len(), 2);
        assert_eq!(dev.runs[0], (3, vec![0xdead_beef, 7, 9]));
        // Reading a cache back gives what was written.
        let mut back = vec![0u16; 32];
        ex.read_kv(k, 100, &mut back).unwrap();
        assert_eq!(back, kc[100..132]);
        assert!(ex
            .write_kv(k, p.cache_elems() - 1, &[1, 2])
            .unwrap_err()
            .to_string()
            .contains("run past"));
    }

    #[test]
    fn a_hung_run_times_out_and_missing_kernels_are_named() {
        let mut ex = executor("hang");
        ex.device.hang = true;
        let p = canonical();
        let (k, v) = (
            ex.alloc_kv(p.cache_elems()).unwrap(),
            ex.alloc_kv(p.cache_elems()).unwrap(),
        );
        let q = vec![0u16; p.q_elems()];
        let mut out = vec![0u16; p.q_elems()];
        let e = ex
            .attention(SHAPE, &p, &q, k, v, &mut out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("timed out after 50ms") && e.contains("SYNCOBJ"), "{e}");
        let other = KernelShape {
            head_dim: 256,
            group: 4,
        };
        let e = ex
            .attention(other, &p, &q, k, v, &mut out)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no decode kernel for head_dim 256 group 4")
                && e.contains("it has: decode head_dim 16"),
            "{e}"
        );
        // Until streams are generated per dispatch, the placement is told no, with the reason.
        assert!(ex.supports(SHAPE).unwrap_err().contains("canonical dispatch"));
        assert!(
            ex.device().contains("npu4")
                && ex
                    .features()
                    .iter()
                    .any(|f| f == "pci=0000:c6:00.1 1022:17f0 rev 10" || f.starts_with("pci="))
        );
    }
}
