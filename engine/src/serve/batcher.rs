//! Continuous batching: one thread (the batcher) owns the [`Session`] and the sampling, and runs
//! steps until every request is done. Each request is a [`Sequence`], and each step is the
//! request engine's ([`Stepper`]), which `engine run` drives with one sequence
//! ([`crate::runtime::stepper::generate`]); the batcher adds the queue, the slots and prefix reuse.
//!
//! Each turn of its loop:
//! 1. takes waiting requests into free KV cache slots: the free slot holding the longest
//!    prefix of the request's prompt (its previous request's prompt and reply: a system prompt,
//!    a chat history), which the request keeps instead of prefilling it again
//!    (`tandem_prompt_tokens_reused_total`), else the least recently used one, reset. Memory
//!    stays that of the slots: a prefix lives only in the slot that computed it, until another
//!    request takes that slot;
//! 2. drops the requests whose client has gone, freeing their slots;
//! 3. runs one step ([`Stepper::step`]) that carries a row of every sequence with a token to
//!    feed and the next chunks of the oldest prompts still being read, at most the session's
//!    step size of prompt tokens in all (each prompt in the chunks it would be read in alone),
//!    so that a long prompt is interleaved with the others' decoding instead of stalling it,
//!    many short ones are read at once, and the unit sees one batch per turn; samples each
//!    selected row with its sequence's sampler (the prompt's after its last chunk: its first
//!    token), then accepts the picks. Where the logits are computed on a device and every
//!    row's sampler needs no more than a row's best `Session::ranked_k` logits, the step reads
//!    back only those (`Logits::Best`, decided by `Session::logits_for`) and each sampler picks
//!    from them (`Sampler::sample_ranked`: the same pick); otherwise whole rows, sampled on
//!    several threads where there are many (`sampler::sample_rows`).
//!    Where steps are padded ([`super::buckets`]), the step's rows and selected rows are first
//!    rounded up to a bucket with rows of a slot set aside for that, so that the unit meets a
//!    few dozen step shapes, each built once (most of them by [`warm_up`]).
//!
//! A step that fails fails only the sequences it carried (each hears [`Event::Failed`] with the
//! error, which names the unit and what failed); their slots are reset, and the others go on.
//! Where the error says a unit is gone (its device was lost, or its plugin panicked), the
//! batcher asks its [`Replace`] to load the model again without that unit (the load path, the
//! unit excluded: its nodes go to the units that remain) and goes on with the new session; the
//! sequences whose caches lived in the old one fail, the others (still waiting for their first
//! step) and the queue are served by the new one. Without a `Replace`, or where the model
//! cannot be placed on what remains, every later request is refused
//! ([`SubmitError::Unavailable`]) until the server is restarted. [`Handle::health`] and the
//! metrics (`tandem_units_lost_total`, `tandem_model_available`) say so.
//!
//! Batching changes no result as long as the backend computes each row of a step independently
//! of the others (the CPU backend does: activations are quantized per row, and every row's dot
//! products are summed in the same order whatever the number of rows); prompts are fed in the
//! same chunks as when a request runs alone (after a kept prefix, from its end).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::buckets::{self, Padder, StepBuckets};
use super::error::SubmitError;
use super::metrics::{Metrics, Outcome};
use crate::runtime::sampler::Sampler;
use crate::runtime::sequence::{self, Event, EventSink, FinishReason, Latency, Limits, Request, Sequence};
use crate::runtime::session::{Logits, Session, SessionError, Step};
use crate::runtime::speculative::{DraftSetup, Target};
use crate::runtime::split::Phase;
use crate::runtime::stepper::{GenerateError, Padding, Stepper};
use crate::tokenizer::Tokenizer;

/// How the batcher queues work.
#[derive(Debug, Clone, Copy)]
pub struct BatcherOptions {
    /// Requests that may wait for a slot (at least 1); beyond it [`Handle::submit`] answers
    /// [`SubmitError::QueueFull`].
    pub queue: usize,
    /// Whether a request may keep the prefix it shares with what its slot last held (a system
    /// prompt, a chat history) instead of prefilling it again.
    pub reuse_prefix: bool,
    /// Whether steps are padded to a few shapes ([`buckets`]). Unless off, the session's last
    /// slot is set aside for padding rows: load one slot more than the requests to serve at once.
    pub step_buckets: StepBuckets,
}

/// Loads the model again without the units of `lost` (the instance names of every unit lost so
/// far, the last one just now), after `why` (the failed step's error) showed the last one gone:
/// a new session on the units that remain, or why the model cannot be placed on them. `engine
/// serve` passes the one load path with those units excluded (`runtime::load::load_without`),
/// and says on stderr where the lost unit's parts went.
pub type Replace = Box<dyn FnMut(&[String], &str) -> Result<Session, String> + Send>;

/// Where the model runs, for `/health`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    /// The units the model runs on now (instance names), none when it is placed nowhere.
    pub units: Vec<String>,
    /// The units lost while serving, in order.
    pub lost: Vec<String>,
    /// Why no request can be served, where the model could not be placed again.
    pub unavailable: Option<String>,
}

impl Health {
    /// Whether a unit was lost (the server runs on fewer units than it started with, or none).
    pub fn degraded(&self) -> bool {
        !self.lost.is_empty()
    }
}

/// What the batcher and its handles share.
struct Shared {
    metrics: Metrics,
    /// No new requests; the batcher exits once the running and queued ones are done.
    draining: AtomicBool,
    /// Stop every request now.
    cancel: AtomicBool,
    limits: Limits,
    slots: usize,
    /// Requests taken and not yet ended (waiting or holding a slot). [`Handle::submit`] takes
    /// a request while fewer than `capacity` are: the slots and the queue together, counted
    /// here rather than by the channel's bound, which would refuse requests the batcher is
    /// about to take into free slots (three at once into two slots and a queue of one).
    admitted: AtomicUsize,
    /// `slots + queue`.
    capacity: usize,
    /// Where the model runs ([`Handle::health`]).
    health: Mutex<Health>,
}

impl Shared {
    /// One admitted request has ended (finished, failed or cancelled): counted. Its place among
    /// the admitted was given back by its sink ([`Admitted`]).
    fn leave(&self, outcome: Outcome) {
        self.metrics.finished(outcome);
    }
}

/// An admitted request's sink as the batcher holds it: gives the request's place among the
/// admitted (`Shared::admitted`) back just before its last event (done or failed) goes out,
/// or when it is dropped without one (a cancelled request). A client that has its answer can
/// then send the next request at once: giving it back after the step, as the batcher once
/// did, left a window in which a loaded machine refused that request as over capacity.
struct Admitted {
    sink: Box<dyn EventSink + 'static>,
    shared: Arc<Shared>,
    held: bool,
}

impl Admitted {
    fn release(&mut self) {
        if std::mem::take(&mut self.held) {
            self.shared.admitted.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl EventSink for Admitted {
    fn send(&mut self, event: Event) -> bool {
        if matches!(event, Event::Done { .. } | Event::Failed { .. }) {
            self.release();
        }
        self.sink.send(event)
    }

    fn is_closed(&self) -> bool {
        self.sink.is_closed()
    }

    fn logprobs(&self) -> Option<usize> {
        self.sink.logprobs()
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.release();
    }
}

/// The HTTP layer's side of the batcher: submits requests, reads the metrics. Cheap to clone.
#[derive(Clone)]
pub struct Handle {
    tx: Sender<(Request<'static>, Sampler)>,
    shared: Arc<Shared>,
}

/// Runs, and forgets, the steps the first requests need, so that their kernels and step
/// programs are built before the server listens and the first request is not the slow one:
/// a whole prompt chunk, a short prompt, and decode steps of one row and of every slot (with
/// their best logits ranked where the batcher would ask for that). With a `padder`, instead,
/// steps padded as the batcher pads them: decode steps of every bucket up to all `served`
/// slots, and prompt steps of every bucket of rows a step can have (decode rows and a budget of
/// prompt tokens), which build every kernel a step of the server needs; a step that mixes
/// them meets no new kernel, only a program to build. Leaves every slot empty.
pub fn warm_up(
    session: &mut Session,
    served: usize,
    padder: Option<Padder>,
) -> Result<(), crate::runtime::session::SessionError> {
    let chunk = session.chunk();
    let fill = chunk.min(session.context().saturating_sub(2)).max(1);
    let ranked_k = session.ranked_k();
    let (mut tokens, mut slots, mut select) = (Vec::new(), Vec::new(), Vec::new());
    // A step of `rows`: a prompt's (`fill` rows a slot, the last selected), else one decode
    // row a slot, all selected.
    let mut step = |session: &mut Session, rows: usize, prompt: bool, k: usize| {
        tokens.clear();
        slots.clear();
        select.clear();
        if prompt {
            tokens.extend((0..rows as u32).map(|t| t % 2 + 1));
            slots.extend((0..rows).map(|r| (r / fill) as u32));
            select.push(rows as u32 - 1);
        } else {
            tokens.resize(rows, 1);
            slots.extend(0..rows as u32);
            select.extend(0..rows as u32);
        }
        if let Some(p) = padder {
            session.reset(p.sink as usize);
            p.pad(&mut tokens, &mut slots, &mut select);
        }
        let phase = if prompt { Phase::Prefill } else { Phase::Decode };
        let logits = if k > 0 { Logits::Best(k) } else { Logits::Rows };
        let step = Step {
            phase,
            tokens: &tokens,
            slots: &slots,
            select: &select,
            logits,
        };
        let result = session.step(step).map(|_| ());
        for slot in 0..session.slots() {
            session.reset(slot);
        }
        result
    };
    let (decode, prompts): (Vec<usize>, Vec<usize>) = match padder {
        Some(_) => {
            // Every bucket up to `most` rows, as many rows as the served slots can take.
            let upto = |most: usize, cap: usize| {
                let mut b: Vec<usize> = (1..=most).map(buckets::bucket).collect();
                b.dedup();
                b.into_iter().map(|b| b.min(cap)).collect::<Vec<_>>()
            };
            (
                upto(served, served),
                upto(served + chunk, fill * served).into_iter().skip(1).collect(),
            )
        }
        None => (vec![1, served], vec![fill, fill.min(7)]),
    };
    let result = (|| {
        // The largest first: a backend that creates every kernel variant up to a step's rows
        // at once (the Vulkan backend, in parallel) meets them all in its first compile.
        for &rows in prompts.iter().rev() {
            step(session, rows, true, 0)?;
        }
        for &rows in &decode {
            if rows == 1 || rows == served {
                step(session, rows, false, 0)?;
            }
            if ranked_k > 0 {
                step(session, rows, false, ranked_k)?;
            }
        }
        Ok(())
    })();
    // (Every step above, run or failed, left every slot empty.)
    result
}

/// How long an idle batcher waits for a request before looking at its flags again.
const IDLE_POLL: Duration = Duration::from_millis(20);

/// Starts the batcher thread on `session` (one KV cache slot per parallel sequence, and one
/// for padding rows unless `options.step_buckets` is off), after [`warm_up`].
pub fn start(
    session: Session,
    tokenizer: Arc<Tokenizer>,
    options: BatcherOptions,
) -> std::io::Result<(Handle, JoinHandle<()>)> {
    start_with(session, tokenizer, options, None, None)
}

/// The slots requests take (`0..served`) and the padder, where `buckets` pads the steps of
/// `session`.
fn padding_of(session: &Session, buckets: StepBuckets) -> std::io::Result<(usize, Option<Padder>)> {
    let all = session.slots();
    match buckets {
        StepBuckets::Off => Ok((all, None)),
        buckets => {
            let sink = all.checked_sub(1).filter(|&s| s > 0).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("padded steps need a slot besides the served ones; the session has {all}"),
                )
            })?;
            let on = buckets == StepBuckets::On
                || session.backend().info().kind != tandem_backend_api::DeviceKind::Cpu;
            Ok((sink, on.then(|| Padder::new(session, sink as u32))))
        }
    }
}

/// [`start`], with `replace` to load the model again where a unit is lost while serving (see
/// the module's notes); without it, a lost unit leaves the server refusing requests.
pub fn start_with(
    mut session: Session,
    tokenizer: Arc<Tokenizer>,
    options: BatcherOptions,
    replace: Option<Replace>,
    draft: Option<DraftSetup>,
) -> std::io::Result<(Handle, JoinHandle<()>)> {
    let (served, padder) = padding_of(&session, options.step_buckets)?;
    // A unit that cannot run these steps fails the first request the same way, with its
    // message; the server still starts.
    let _ = warm_up(&mut session, served, padder);
    // Unbounded: `Shared::admitted` bounds what is in it.
    let (tx, rx) = channel();
    let shared = Arc::new(Shared {
        metrics: Metrics::default(),
        draining: AtomicBool::new(false),
        cancel: AtomicBool::new(false),
        limits: Limits::of(&session, &tokenizer),
        slots: served,
        admitted: AtomicUsize::new(0),
        capacity: served + options.queue.max(1),
        health: Mutex::new(Health {
            units: session.unit_names().into_iter().map(str::to_string).collect(),
            ..Health::default()
        }),
    });
    shared.metrics.step_builds(session.step_builds());
    let thread_shared = shared.clone();
    let thread = std::thread::Builder::new()
        .name("tandem-batcher".into())
        .spawn(move || {
            let setup = Setup {
                served,
                padder,
                reuse_prefix: options.reuse_prefix,
                step_buckets: options.step_buckets,
                replace,
                draft,
            };
            run(session, &tokenizer, rx, &thread_shared, setup)
        })?;
    Ok((Handle { tx, shared }, thread))
}

impl Handle {
    /// The counters.
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// The context: prompt and generated tokens of one request together.
    pub fn context(&self) -> usize {
        self.shared.limits.context
    }

    /// Requests generated at once.
    pub fn slots(&self) -> usize {
        self.shared.slots
    }

    /// Where the model runs, which units were lost, and whether requests can be served.
    pub fn health(&self) -> Health {
        self.shared.health.lock().map(|h| h.clone()).unwrap_or_default()
    }

    /// Queues `request`: it starts at the next step with a free slot. Refused when the queue is
    /// full, the server is shutting down, or the request is invalid ([`Request::check`]: the
    /// one check of a request on the serve path).
    pub fn submit(&self, request: Request<'static>) -> Result<(), SubmitError> {
        if self.shared.draining.load(Ordering::SeqCst) {
            return Err(SubmitError::ShuttingDown);
        }
        if let Some(why) = self.health().unavailable {
            self.shared.metrics.rejected();
            return Err(SubmitError::Unavailable(why));
        }
        let sampler = request.check(self.shared.limits, 0)?;
        let metrics = &self.shared.metrics;
        let shared = &self.shared;
        if shared
            .admitted
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < shared.capacity).then_some(n + 1)
            })
            .is_err()
        {
            metrics.rejected();
            return Err(SubmitError::QueueFull {
                queued: metrics.queue_depth(),
            });
        }
        metrics.queued.fetch_add(1, Ordering::SeqCst);
        let mut request = request;
        request.sink = Box::new(Admitted {
            sink: request.sink,
            shared: shared.clone(),
            held: true,
        });
        // A request the batcher will not take is dropped with its sink, which gives its place
        // back.
        if self.tx.send((request, sampler)).is_err() {
            metrics.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::ShuttingDown);
        }
        Ok(())
    }

    /// Stops taking requests; the batcher finishes the running and queued ones, then exits.
    pub fn shut_down(&self) {
        self.shared.draining.store(true, Ordering::SeqCst);
    }

    /// Ends every running and queued request now (each hears [`Event::Failed`]).
    pub fn cancel_all(&self) {
        self.shared.draining.store(true, Ordering::SeqCst);
        self.shared.cancel.store(true, Ordering::SeqCst);
    }
}

/// How the batcher's loop uses its session.
struct Setup {
    /// Slots requests take: `0..served`.
    served: usize,
    /// Pads every step, where steps are padded.
    padder: Option<Padder>,
    reuse_prefix: bool,
    /// How a session loaded again is padded.
    step_buckets: StepBuckets,
    /// Loads the model again without a lost unit.
    replace: Option<Replace>,
    /// Speculative decoding's drafter, for a sequence running alone.
    draft: Option<DraftSetup>,
}

/// The batcher's loop; returns when it is shut down and idle, or every handle is gone.
fn run(
    session: Session,
    tokenizer: &Tokenizer,
    rx: Receiver<(Request<'static>, Sampler)>,
    shared: &Shared,
    setup: Setup,
) {
    let Setup {
        served,
        mut padder,
        reuse_prefix,
        step_buckets,
        mut replace,
        mut draft,
    } = setup;
    // Speculation, where a drafter was given and it suits the model (refused, it is said once
    // and the server serves without it).
    let mut spec = match draft.as_mut() {
        Some(d) => match d.speculator(&Target::of(&session)) {
            Ok(spec) => Some(spec),
            Err(e) => {
                eprintln!("warning: serving without speculative decoding: {e}");
                None
            }
        },
        None => None,
    };
    // The slot of the sequence the speculator was last started for.
    let mut spec_slot: Option<u32> = None;
    let metrics = &shared.metrics;
    // `None` once a unit was lost and the model could not be placed on what remains.
    let mut session = Some(session);
    // Free slots, least recently used first: a request without a shared prefix takes the
    // first, so the prefixes used last stay longest.
    let mut free: Vec<u32> = (0..served as u32).collect();
    // The ids whose K/V each slot holds, in order (what a new request's prompt is matched
    // against); emptied where a failed step leaves a slot's cache unknown. Empty for a
    // running sequence's slot until its first step (or its kept prefix): nothing of it is in a
    // cache yet.
    let all = session.as_ref().map_or(served, Session::slots);
    let mut held: Vec<Vec<u32>> = vec![Vec::new(); all];
    let mut seqs: Vec<Sequence> = Vec::new();
    let mut stepper = Stepper::default();
    loop {
        let cancel = shared.cancel.load(Ordering::SeqCst);
        let Some(live) = session.as_mut() else {
            // Nowhere to run: every request still queued fails with the reason.
            match rx.recv_timeout(IDLE_POLL) {
                Ok((request, _)) => {
                    metrics.queued.fetch_sub(1, Ordering::SeqCst);
                    let mut sink = request.sink;
                    let why = shared.health.lock().ok().and_then(|h| h.unavailable.clone());
                    sink.send(Event::Failed {
                        message: why.unwrap_or_else(|| "the model is not loaded".into()),
                    });
                    shared.leave(Outcome::Error);
                }
                Err(RecvTimeoutError::Timeout) => {
                    if shared.draining.load(Ordering::SeqCst) && metrics.queue_depth() == 0 {
                        return;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
            continue;
        };
        // 1. Waiting requests into free slots.
        let mut gone = false;
        while !free.is_empty() {
            let got = if seqs.is_empty() {
                rx.recv_timeout(IDLE_POLL).map_err(|e| match e {
                    RecvTimeoutError::Timeout => TryRecvError::Empty,
                    RecvTimeoutError::Disconnected => TryRecvError::Disconnected,
                })
            } else {
                rx.try_recv()
            };
            let (mut request, sampler) = match got {
                Ok(r) => r,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    gone = true;
                    break;
                }
            };
            metrics.queued.fetch_sub(1, Ordering::SeqCst);
            if cancel || request.sink.is_closed() {
                request.sink.send(Event::Failed {
                    message: "the server is shutting down".into(),
                });
                shared.leave(Outcome::Cancelled);
                continue;
            }
            let (at, kept) = if reuse_prefix {
                pick_slot(&free, &held, &request.prompt, live.chunk(), live.vocab())
            } else {
                (0, 0)
            };
            let slot = free.remove(at);
            let held_here = &mut held[slot as usize];
            // The kept prefix, where the slot's caches still hold it (a sliding-window ring
            // may have overwritten what lies past it), else a fresh slot.
            let kept = if kept > 0
                && live.len(slot as usize) == held_here.len()
                && live.truncate(slot as usize, kept)
            {
                kept
            } else {
                live.reset(slot as usize);
                0
            };
            held_here.truncate(kept);
            // The prompt's images into the image table, before any of its steps.
            let written = request
                .images
                .iter()
                .try_for_each(|im| live.write_image_rows(im.first, &im.values));
            if let Err(e) = written {
                request.sink.send(Event::Failed {
                    message: format!("writing the prompt's images: {e}"),
                });
                free.push(slot);
                shared.leave(Outcome::Error);
                continue;
            }
            let mut s = Sequence::new(request, sampler, slot, tokenizer);
            spec_slot = None;
            s.skip_cached(kept);
            metrics.prompt(s.prompt_len());
            metrics.reused(kept);
            seqs.push(s);
        }
        // 2. Clients that have gone (or everything, when cancelled).
        seqs.retain_mut(|s| {
            if !(cancel || s.is_closed()) {
                return true;
            }
            if cancel {
                s.fail("the server is shutting down".into());
            }
            free.push(s.slot);
            shared.leave(Outcome::Cancelled);
            false
        });
        metrics.running.store(seqs.len(), Ordering::SeqCst);
        if seqs.is_empty() {
            if gone || (shared.draining.load(Ordering::SeqCst) && metrics.queue_depth() == 0) {
                return;
            }
            continue;
        }
        // 3. One step of every sequence with something to feed (`Stepper`: decode rows, then
        //    prompt chunks within the step's budget, padded to a bucket where steps are).
        //    A sequence running alone, with nothing queued, decodes in speculative blocks
        //    where a drafter was given (and it asks for no log-probabilities, which the
        //    acceptance rule does not give): the steps are its own then, and batching gains
        //    nothing. Not with images: the draft model has none of the image rows.
        let vocab = live.vocab();
        let alone = seqs.len() == 1
            && !seqs[0].prefilling()
            && seqs[0].next.is_some()
            && seqs[0].sampler().logprobs().is_none()
            && metrics.queue_depth() == 0
            && spec.is_some()
            && seqs[0].history().iter().all(|&t| (t as usize) < vocab);
        let mut lost = None;
        let mut ended: Vec<(usize, Outcome)> = if let (true, Some(spec)) = (alone, spec.as_mut()) {
            let s = &mut seqs[0];
            let slot = s.slot;
            if spec_slot != Some(slot) {
                spec.start(s.sampler().config());
                spec_slot = Some(slot);
            }
            let before = s.history().len();
            let blocked = spec.block(live, s, &mut |l| counted(l, metrics));
            metrics.step_builds(live.step_builds());
            match blocked {
                Ok(b) => {
                    // The pending token and the kept drafts are in the cache now.
                    let fed = &s.history()[before - 1..before - 1 + b.fed];
                    held[slot as usize].extend_from_slice(fed);
                    b.ended.map(|o| (0, outcome(o))).into_iter().collect()
                }
                Err(e) => {
                    // The sequence heard the error (`Speculator::block` tells it); what its
                    // slot's cache holds is unknown, so it starts empty.
                    held[slot as usize].clear();
                    live.reset(slot as usize);
                    if let GenerateError::Session(SessionError::Schedule(e)) = &e {
                        lost = e.lost_unit().map(|u| (u.to_string(), e.to_string()));
                    }
                    vec![(0, Outcome::Error)]
                }
            }
        } else {
            let padding = padder.as_ref().map(|p| p as &dyn Padding);
            let stepped = stepper.step(live, &mut seqs, padding, &mut |l| counted(l, metrics));
            metrics.step_builds(live.step_builds());
            match stepped {
                Ok(None) => continue,
                Ok(Some(stepped)) => {
                    let (tokens, slots) = stepped.fed;
                    for (t, s) in tokens.iter().zip(slots) {
                        held[*s as usize].push(*t);
                    }
                    stepped.ended.iter().map(|&(i, o)| (i, outcome(o))).collect()
                }
                Err(failed) => {
                    // Each sequence of the step heard the error; what their slots' caches hold
                    // is unknown, so they start empty.
                    for &i in &failed.sequences {
                        let slot = seqs[i].slot as usize;
                        held[slot].clear();
                        live.reset(slot);
                    }
                    if let SessionError::Schedule(e) = &failed.error {
                        lost = e.lost_unit().map(|u| (u.to_string(), failed.error.to_string()));
                    }
                    failed.sequences.iter().map(|&i| (i, Outcome::Error)).collect()
                }
            }
        };
        // Finished sequences leave; their slots are reset when reused.
        ended.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
        for (i, outcome) in ended {
            let s = seqs.remove(i);
            free.push(s.slot);
            shared.leave(outcome);
        }
        if let Some((unit, why)) = lost {
            metrics.unit_lost();
            // What lived in the old session's caches is gone with it: the sequences that had
            // been fed (or kept a prefix) fail; those not yet stepped start on the new one.
            seqs.retain_mut(|s| {
                if held[s.slot as usize].is_empty() {
                    return true;
                }
                s.fail(format!(
                    "unit {unit} was lost while this request was running ({why}); its KV cache went with it"
                ));
                free.push(s.slot);
                shared.leave(Outcome::Error);
                false
            });
            for h in &mut held {
                h.clear();
            }
            let placed = place_again(
                &mut session,
                &mut replace,
                &unit,
                &why,
                step_buckets,
                served,
                shared,
            );
            padder = placed.unwrap_or(None);
            if session.is_none() {
                for mut s in seqs.drain(..) {
                    let why = shared.health.lock().ok().and_then(|h| h.unavailable.clone());
                    s.fail(why.unwrap_or_default());
                    free.push(s.slot);
                    shared.leave(Outcome::Error);
                }
            }
        }
        metrics.running.store(seqs.len(), Ordering::SeqCst);
    }
}

/// After `unit` was lost (`why`): drops the session (its units and memory go with it) and loads
/// the model again without that unit through `replace`, warmed up as at the start; records the
/// outcome in the health and the metrics. Returns the new session's padder (`None` where the
/// model could not be placed again, which leaves `session` empty).
fn place_again(
    session: &mut Option<Session>,
    replace: &mut Option<Replace>,
    unit: &str,
    why: &str,
    step_buckets: StepBuckets,
    served: usize,
    shared: &Shared,
) -> Option<Option<Padder>> {
    let mut lost = match shared.health.lock() {
        Ok(h) => h.lost.clone(),
        Err(_) => Vec::new(),
    };
    lost.push(unit.to_string());
    // The old session first: its memory is what the new one may need.
    *session = None;
    let placed = match replace.as_mut() {
        None => Err("this server cannot load the model again".to_string()),
        Some(r) => r(&lost, why).and_then(|mut s| {
            let (slots, padder) = padding_of(&s, step_buckets).map_err(|e| e.to_string())?;
            if slots != served {
                return Err(format!(
                    "the model loaded again has {slots} slots for requests, not {served}"
                ));
            }
            let _ = warm_up(&mut s, served, padder);
            Ok((s, padder))
        }),
    };
    let (units, unavailable, padder) = match placed {
        Ok((s, padder)) => {
            let units = s.unit_names().into_iter().map(str::to_string).collect();
            shared.metrics.step_builds(s.step_builds());
            *session = Some(s);
            (units, None, Some(padder))
        }
        Err(e) => (
            Vec::new(),
            Some(format!(
                "unit {unit} was lost ({why}) and the model cannot be placed on the units that remain: {e}"
            )),
            None,
        ),
    };
    shared.metrics.set_available(unavailable.is_none());
    if let Ok(mut h) = shared.health.lock() {
        *h = Health {
            units,
            lost,
            unavailable,
        };
    }
    padder
}

/// The free slot a request with `prompt` should take (an index into `free`, least recently used
/// first) and how many of its first tokens that slot already holds (`held`): the longest
/// shared prefix, at most all but the prompt's last token, in whole chunks of `chunk` tokens;
/// with none, the least recently used slot. Whole chunks: the rest of the prompt is then read
/// in the very steps a fresh read would take (a chunk's rows go through a backend's prompt
/// kernels, a shorter remainder through its row kernels), so reusing a prefix changes no
/// result.
fn pick_slot(free: &[u32], held: &[Vec<u32>], prompt: &[u32], chunk: usize, vocab: usize) -> (usize, usize) {
    let chunk = chunk.max(1);
    let limit = prompt.len().saturating_sub(1) / chunk * chunk;
    let mut best = (0, 0);
    for (at, &slot) in free.iter().enumerate() {
        // An image's rows (ids from `vocab` on) name places of the image table that another
        // request's image may have taken since: a prefix ends before them.
        let shared = held[slot as usize]
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b && (**a as usize) < vocab)
            .count()
            .min(limit)
            / chunk
            * chunk;
        if shared > best.1 {
            best = (at, shared);
        }
    }
    best
}

/// An accepted token's latency into the metrics.
fn counted(latency: Latency, metrics: &Metrics) {
    metrics.generated();
    match latency {
        Latency::First(d) => metrics.ttft.observe(d),
        Latency::Between(d) => metrics.itl.observe(d),
    }
}

/// How a sequence ended, as the metrics count it.
fn outcome(o: sequence::Outcome) -> Outcome {
    match o {
        sequence::Outcome::Finished(FinishReason::Stop) => Outcome::Stop,
        sequence::Outcome::Finished(FinishReason::Length) => Outcome::Length,
        sequence::Outcome::Cancelled => Outcome::Cancelled,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records how many requests were admitted each time an event reached the client.
    struct Client {
        shared: Arc<Shared>,
        seen: Arc<Mutex<Vec<usize>>>,
    }

    impl EventSink for Client {
        fn send(&mut self, _: Event) -> bool {
            let n = self.shared.admitted.load(Ordering::SeqCst);
            self.seen.lock().map(|mut s| s.push(n)).is_ok()
        }

        fn is_closed(&self) -> bool {
            false
        }
    }

    fn shared(admitted: usize) -> Arc<Shared> {
        Arc::new(Shared {
            metrics: Metrics::default(),
            draining: AtomicBool::new(false),
            cancel: AtomicBool::new(false),
            limits: Limits {
                vocab: 8,
                context: 8,
                text: false,
                image_rows: 0,
            },
            slots: 1,
            admitted: AtomicUsize::new(admitted),
            capacity: 2,
            health: Mutex::default(),
        })
    }

    #[test]
    fn a_request_gives_its_place_back_before_its_last_event_reaches_the_client() {
        let s = shared(2);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let client = Client {
            shared: s.clone(),
            seen: seen.clone(),
        };
        let mut sink = Admitted {
            sink: Box::new(client),
            shared: s.clone(),
            held: true,
        };
        sink.send(Event::Token {
            id: 1,
            text: String::new(),
            logprobs: None,
        });
        sink.send(Event::Done {
            text: String::new(),
            finish_reason: FinishReason::Stop,
            prompt_tokens: 1,
            completion_tokens: 1,
        });
        drop(sink);
        // Still held during the token; given back before the client heard it was done; once.
        assert_eq!(*seen.lock().unwrap(), [2, 1]);
        assert_eq!(s.admitted.load(Ordering::SeqCst), 1);
        // A request dropped without a last event (cancelled) gives its place back too.
        let sink = Admitted {
            sink: Box::new(Client {
                shared: s.clone(),
                seen,
            }),
            shared: s.clone(),
            held: true,
        };
        drop(sink);
        assert_eq!(s.admitted.load(Ordering::SeqCst), 0);
    }
}
