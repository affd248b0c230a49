//! A backend plugin that fails on purpose, for tests. Its file name does not start with
//! `tandem_backend_`, so plugin discovery never picks it up unless a test copies it under such a
//! name (`libtandem_backend_faulty.so`).
//!
//! Two uses:
//! - **Panics at the plugin boundary**: option `panic_in` names the call that panics (`create`,
//!   `compile`, `execute`, `alloc`, `estimate_decode`); every other call succeeds trivially, and
//!   `estimate_decode` echoes its query (for the ABI's round trip).
//! - **A unit lost mid-run**: with `delegate` (the path of a real backend plugin, such as the
//!   CPU's `libtandem_backend_cpu.so`) every call runs on that backend, so the faulty unit can
//!   stand in for a real one in a split, until it fails: from the execute after `fail_after`
//!   executes on, or from the first execute after the file `fail_when` exists. `fail_with` says
//!   how: `device_lost` (the default: that execute and every later call answer
//!   `BackendError::DeviceLost`, as a device that is gone does), `panic` (the execute panics; the
//!   plugin boundary turns it into `BackendError::Panicked` and refuses every later call), or
//!   `error` (executes answer `BackendError::Internal`; with `fail_times = K` only the first K
//!   do, and the unit works again after them).
//!
//! Each option may also come from the environment, where a config cannot name this backend:
//! `TANDEM_FAULTY_` and the option's name in capitals (`TANDEM_FAULTY_FAIL_AFTER=40`). An
//! option given to the backend wins. Every other option goes to the delegate.

use tandem_backend_api::plugin::host::PluginLibrary;
use tandem_backend_api::{
    BackendError, BackendInfo, BackendOptions, BackendPlugin, BufferId, ComputeBackend, CostAnswer,
    CostQuery, DeviceKind, Graph, MemoryUse, NodeTime, Op, PlacementEstimate, ProgramId, SharedTimeline,
    StepArgs, Support, TensorDesc, Ticket, TimelineId, Usage,
};

/// The options this plugin reads itself (the rest go to the delegate).
const OWN_OPTIONS: [&str; 6] = [
    "panic_in",
    "delegate",
    "fail_after",
    "fail_when",
    "fail_with",
    "fail_times",
];

/// How a failing execute fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FailWith {
    DeviceLost,
    Panic,
    Error,
}

/// When and how the unit fails.
#[derive(Debug, Clone)]
struct Failure {
    /// Executes that succeed before the first failure.
    after: Option<u64>,
    /// A file whose existence starts the failures.
    when: Option<std::path::PathBuf>,
    with: FailWith,
    /// Executes that fail (`None`: every one from the first).
    times: Option<u64>,
}

/// The faulty backend.
pub struct FaultyBackend {
    panic_in: String,
    /// The real backend every call runs on, where `delegate` names one.
    inner: Option<Box<dyn ComputeBackend>>,
    failure: Option<Failure>,
    /// Executes asked for so far.
    executes: u64,
    /// Executes failed so far.
    failed: u64,
    /// Set once the device is "lost": every later call answers it.
    lost: Option<BackendError>,
}

/// Option `key`, else the environment's `TANDEM_FAULTY_KEY`.
fn option(options: &BackendOptions, key: &str) -> Option<String> {
    options
        .get(key)
        .map(str::to_string)
        .or_else(|| std::env::var(format!("TANDEM_FAULTY_{}", key.to_uppercase())).ok())
        .filter(|v| !v.is_empty())
}

fn number(options: &BackendOptions, key: &str) -> Result<Option<u64>, BackendError> {
    option(options, key)
        .map(|v| {
            v.parse()
                .map_err(|_| BackendError::invalid(format!("faulty option '{key}': '{v}' is not a count")))
        })
        .transpose()
}

impl FaultyBackend {
    fn maybe_panic(&self, call: &str) {
        if self.panic_in == call {
            panic!("deliberate panic in {call}");
        }
    }

    /// The lost device's error, once it is lost.
    fn alive(&self) -> Result<(), BackendError> {
        match &self.lost {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Counts an execute; fails it where the failure says so.
    fn before_execute(&mut self) -> Result<(), BackendError> {
        self.alive()?;
        self.maybe_panic("execute");
        self.executes += 1;
        let Some(f) = &self.failure else {
            return Ok(());
        };
        let due = f.after.is_some_and(|n| self.executes > n) || f.when.as_ref().is_some_and(|p| p.exists());
        if !due || f.times.is_some_and(|t| self.failed >= t) {
            return Ok(());
        }
        self.failed += 1;
        let n = self.executes;
        match f.with {
            FailWith::DeviceLost => {
                let e = BackendError::DeviceLost {
                    device: format!("faulty (simulated loss at execute {n})"),
                };
                self.lost = Some(e.clone());
                Err(e)
            }
            FailWith::Panic => panic!("deliberate panic in execute {n}"),
            FailWith::Error => Err(BackendError::internal(format!(
                "simulated failure of execute {n}"
            ))),
        }
    }
}

impl BackendPlugin for FaultyBackend {
    const NAME: &'static str = "faulty";

    fn create(options: &BackendOptions) -> Result<Self, BackendError> {
        let panic_in = option(options, "panic_in").unwrap_or_default();
        if panic_in == "create" {
            panic!("deliberate panic in create");
        }
        let inner = match option(options, "delegate") {
            Some(path) => {
                let lib = PluginLibrary::open(std::path::Path::new(&path))
                    .map_err(|e| BackendError::invalid(format!("faulty option 'delegate': {e}")))?;
                let mut rest = options.clone();
                rest.entries.retain(|k, _| !OWN_OPTIONS.contains(&k.as_str()));
                Some(lib.create(&rest)?)
            }
            None => None,
        };
        let with = match option(options, "fail_with").as_deref() {
            None | Some("device_lost") => FailWith::DeviceLost,
            Some("panic") => FailWith::Panic,
            Some("error") => FailWith::Error,
            Some(other) => {
                return Err(BackendError::invalid(format!(
                    "faulty option 'fail_with': '{other}' is not device_lost, panic or error"
                )))
            }
        };
        let after = number(options, "fail_after")?;
        let when = option(options, "fail_when").map(std::path::PathBuf::from);
        let times = number(options, "fail_times")?;
        let failure = if after.is_some() || when.is_some() {
            Some(Failure {
                after,
                when,
                with,
                times,
            })
        } else {
            None
        };
        Ok(FaultyBackend {
            panic_in,
            inner,
            failure,
            executes: 0,
            failed: 0,
            lost: None,
        })
    }
}

impl ComputeBackend for FaultyBackend {
    fn info(&self) -> BackendInfo {
        match &self.inner {
            Some(b) => {
                let i = b.info();
                BackendInfo {
                    name: "faulty".into(),
                    device: format!("faulty over {}", i.device),
                    ..i
                }
            }
            None => BackendInfo {
                name: "faulty".into(),
                device: "nothing".into(),
                kind: DeviceKind::Cpu,
                memory_bytes: None,
                features: vec![],
                physical_device: None,
                decode_rows: None,
            },
        }
    }
    fn supports(&self, op: &Op) -> Support {
        match &self.inner {
            Some(b) => b.supports(op),
            None => Support::Yes,
        }
    }
    fn alloc(&mut self, desc: &TensorDesc, usage: Usage) -> Result<BufferId, BackendError> {
        self.maybe_panic("alloc");
        self.alive()?;
        match &mut self.inner {
            Some(b) => b.alloc(desc, usage),
            None => Ok(BufferId(1)),
        }
    }
    fn write(&mut self, buffer: BufferId, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        self.alive()?;
        match &mut self.inner {
            Some(b) => b.write(buffer, offset, data),
            None => Ok(()),
        }
    }
    fn read(&mut self, buffer: BufferId, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        self.alive()?;
        match &mut self.inner {
            Some(b) => b.read(buffer, offset, out),
            None => Ok(()),
        }
    }
    fn free(&mut self, buffer: BufferId) -> Result<(), BackendError> {
        // Freeing always works: the host releases what a lost unit held.
        match &mut self.inner {
            Some(b) => b.free(buffer),
            None => Ok(()),
        }
    }
    fn compile(&mut self, graph: &Graph) -> Result<ProgramId, BackendError> {
        self.maybe_panic("compile");
        self.alive()?;
        match &mut self.inner {
            Some(b) => b.compile(graph),
            None => Ok(ProgramId(1)),
        }
    }
    fn execute(&mut self, program: ProgramId, args: &StepArgs<'_>) -> Result<Ticket, BackendError> {
        self.before_execute()?;
        match &mut self.inner {
            Some(b) => b.execute(program, args),
            None => Ok(Ticket(1)),
        }
    }
    fn wait(&mut self, ticket: Ticket) -> Result<(), BackendError> {
        self.alive()?;
        match &mut self.inner {
            Some(b) => b.wait(ticket),
            None => Ok(()),
        }
    }
    fn release(&mut self, program: ProgramId) -> Result<(), BackendError> {
        match &mut self.inner {
            Some(b) => b.release(program),
            None => Ok(()),
        }
    }
    fn profile(&mut self, program: ProgramId) -> Result<Vec<NodeTime>, BackendError> {
        self.alive()?;
        match &mut self.inner {
            Some(b) => b.profile(program),
            None => Ok(Vec::new()),
        }
    }
    fn memory(&mut self) -> Result<Option<MemoryUse>, BackendError> {
        match &mut self.inner {
            Some(b) => b.memory(),
            None => Ok(None),
        }
    }
    /// Host memory goes to the delegate, which uses it in place where it can (the CPU does).
    unsafe fn import_host(
        &mut self,
        ptr: *mut u8,
        len: usize,
        desc: &TensorDesc,
    ) -> Result<BufferId, BackendError> {
        self.alive()?;
        match &mut self.inner {
            // SAFETY: this function's contract is the delegate's `import_host`'s, which the
            // caller upholds for this call.
            Some(b) => unsafe { b.import_host(ptr, len, desc) },
            None => Err(BackendError::unsupported(
                "import_host",
                "faulty without a delegate uses no host memory",
            )),
        }
    }
    fn export_timeline(&mut self) -> Result<Option<SharedTimeline>, BackendError> {
        self.alive()?;
        match &mut self.inner {
            Some(b) => b.export_timeline(),
            None => Ok(None),
        }
    }
    fn import_timeline(&mut self, timeline: &SharedTimeline) -> Result<Option<TimelineId>, BackendError> {
        self.alive()?;
        match &mut self.inner {
            Some(b) => b.import_timeline(timeline),
            None => Ok(None),
        }
    }
    fn execute_after(
        &mut self,
        program: ProgramId,
        args: &StepArgs<'_>,
        waits: &[(TimelineId, Ticket)],
    ) -> Result<Ticket, BackendError> {
        self.before_execute()?;
        match &mut self.inner {
            Some(b) => b.execute_after(program, args, waits),
            None if waits.is_empty() => Ok(Ticket(1)),
            None => Err(BackendError::unsupported(
                "execute_after",
                "faulty without a delegate waits on no timeline",
            )),
        }
    }
    /// No peers: no answer. Otherwise each peer alone and beside it, the query's figures in the
    /// estimates (context as tokens per second, layers as the peer's seconds), so that a test
    /// sees every field cross both ways.
    fn estimate_decode(&self, query: &CostQuery) -> Option<CostAnswer> {
        self.maybe_panic("estimate_decode");
        if query.peers.is_empty() {
            return None;
        }
        let estimates = query
            .peers
            .iter()
            .flat_map(|p| {
                [false, true].map(|here| PlacementEstimate {
                    peer: p.name.clone(),
                    attention_here: here,
                    tokens_per_s: query.context as f64,
                    low: query.model.heads as f64,
                    high: query.model.vocab as f64,
                    own_s: if here { query.model.head_dim as f64 } else { 0.0 },
                    peer_s: query.model.layers as f64,
                })
            })
            .collect();
        Some(CostAnswer {
            estimates,
            own_uncertainty: 0.5,
            peer_uncertainty: 0.25,
            simulated: true,
            basis: query
                .peers
                .iter()
                .map(|p| format!("{} {:?} {}", p.name, p.kind, p.device))
                .collect::<Vec<_>>()
                .join("; "),
        })
    }
}

tandem_backend_api::export_backend!(FaultyBackend);

#[cfg(test)]
mod tests {
    use super::*;

    fn failing(with: &str, after: u64, times: Option<u64>) -> FaultyBackend {
        let mut o = BackendOptions::default();
        o.set("fail_with", with).set("fail_after", after.to_string());
        if let Some(t) = times {
            o.set("fail_times", t.to_string());
        }
        FaultyBackend::create(&o).unwrap()
    }

    fn args() -> StepArgs<'static> {
        StepArgs {
            tokens: &[0],
            positions: &[0],
            slots: &[0],
            select: &[0],
        }
    }

    #[test]
    fn a_lost_device_fails_from_the_execute_after_fail_after_and_every_call_after_it() {
        let mut b = failing("device_lost", 2, None);
        assert!(b.execute(ProgramId(1), &args()).is_ok());
        assert!(b.execute(ProgramId(1), &args()).is_ok());
        let e = b.execute(ProgramId(1), &args()).unwrap_err();
        assert!(
            matches!(&e, BackendError::DeviceLost { device } if device.contains("execute 3")),
            "{e}"
        );
        assert_eq!(b.wait(Ticket(1)).unwrap_err(), e);
        assert_eq!(b.read(BufferId(1), 0, &mut []).unwrap_err(), e);
        assert_eq!(b.execute(ProgramId(1), &args()).unwrap_err(), e);
        assert!(
            b.free(BufferId(1)).is_ok(),
            "a lost unit's buffers are still released"
        );
    }

    #[test]
    fn an_error_fails_only_fail_times_executes() {
        let mut b = failing("error", 1, Some(1));
        assert!(b.execute(ProgramId(1), &args()).is_ok());
        let e = b.execute(ProgramId(1), &args()).unwrap_err();
        assert!(matches!(e, BackendError::Internal { .. }), "{e}");
        assert!(b.execute(ProgramId(1), &args()).is_ok());
    }

    #[test]
    fn a_bad_option_is_refused_by_name() {
        let mut o = BackendOptions::default();
        o.set("fail_with", "smoke");
        let e = FaultyBackend::create(&o).err().unwrap().to_string();
        assert!(e.contains("fail_with") && e.contains("smoke"), "{e}");
        o.set("fail_with", "panic").set("fail_after", "x");
        let e = FaultyBackend::create(&o).err().unwrap().to_string();
        assert!(e.contains("fail_after"), "{e}");
    }
}
