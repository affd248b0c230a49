//! Continuous batching: one thread (the batcher) owns the [`Session`] and the sampling, and runs
//! steps until every request is done. Each request is a [`Sequence`], the same generation loop
//! `engine run` steps alone ([`sequence::generate`]); only the stepping differs.
//!
//! Each turn of its loop:
//! 1. takes waiting requests into free KV cache slots (a slot is reset before reuse);
//! 2. drops the requests whose client has gone, freeing their slots;
//! 3. feeds one chunk (at most the session's step size) of the oldest prompt still being read,
//!    so that a long prompt is interleaved with the decode steps of the others instead of
//!    stalling them; after its last chunk, its first token is sampled;
//! 4. runs one decode step of every other sequence together, one row each, and samples each
//!    row with that sequence's own sampler, then accepts the picks in row order. Where the
//!    logits are computed on a device and every row's sampler needs no more than a row's best
//!    `Session::ranked_k` logits, the step reads back only those (`Session::step_top_k`) and each
//!    sampler picks from them (`Sampler::sample_ranked`: the same pick); otherwise whole rows,
//!    sampled on several threads where there are many (`sampler::sample_rows`).
//!
//! Batching changes no result as long as the backend computes each row of a step independently
//! of the others (the CPU backend does: activations are quantized per row, and every row's dot
//! products are summed in the same order whatever the number of rows); prompts are fed in the
//! same chunks as when a request runs alone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::error::SubmitError;
use super::metrics::{Metrics, Outcome};
use crate::runtime::sampler::{sample_rows, Sampler};
use crate::runtime::sequence::{self, Event, FinishReason, Latency, Limits, Request, Sequence};
use crate::runtime::session::Session;
use crate::runtime::split::Phase;
use crate::tokenizer::Tokenizer;

/// How the batcher queues work.
#[derive(Debug, Clone, Copy)]
pub struct BatcherOptions {
    /// Requests that may wait for a slot (at least 1); beyond it [`Handle::submit`] answers
    /// [`SubmitError::QueueFull`].
    pub queue: usize,
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
}

/// The HTTP layer's side of the batcher: submits requests, reads the metrics. Cheap to clone.
#[derive(Clone)]
pub struct Handle {
    tx: SyncSender<(Request<'static>, Sampler)>,
    shared: Arc<Shared>,
}

/// How long an idle batcher waits for a request before looking at its flags again.
const IDLE_POLL: Duration = Duration::from_millis(20);

/// Starts the batcher thread on `session` (one KV cache slot per parallel sequence).
pub fn start(
    session: Session,
    tokenizer: Arc<Tokenizer>,
    options: BatcherOptions,
) -> std::io::Result<(Handle, JoinHandle<()>)> {
    let (tx, rx) = sync_channel(options.queue.max(1));
    let shared = Arc::new(Shared {
        metrics: Metrics::default(),
        draining: AtomicBool::new(false),
        cancel: AtomicBool::new(false),
        limits: Limits::of(&session),
        slots: session.slots(),
    });
    let thread_shared = shared.clone();
    let thread = std::thread::Builder::new()
        .name("tandem-batcher".into())
        .spawn(move || run(session, &tokenizer, rx, &thread_shared))?;
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

    /// Queues `request`: it starts at the next step with a free slot. Refused when the queue is
    /// full, the server is shutting down, or the request is invalid ([`Request::check`]: the
    /// one check of a request on the serve path).
    pub fn submit(&self, request: Request<'static>) -> Result<(), SubmitError> {
        if self.shared.draining.load(Ordering::SeqCst) {
            return Err(SubmitError::ShuttingDown);
        }
        let sampler = request.check(self.shared.limits, 0)?;
        let metrics = &self.shared.metrics;
        metrics.queued.fetch_add(1, Ordering::SeqCst);
        match self.tx.try_send((request, sampler)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                let queued = metrics.queued.fetch_sub(1, Ordering::SeqCst) - 1;
                metrics.rejected();
                Err(SubmitError::QueueFull { queued })
            }
            Err(TrySendError::Disconnected(_)) => {
                metrics.queued.fetch_sub(1, Ordering::SeqCst);
                Err(SubmitError::ShuttingDown)
            }
        }
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

/// The batcher's loop; returns when it is shut down and idle, or every handle is gone.
fn run(
    mut session: Session,
    tokenizer: &Tokenizer,
    rx: Receiver<(Request<'static>, Sampler)>,
    shared: &Shared,
) {
    let metrics = &shared.metrics;
    let vocab = session.model().config.vocab_size;
    let chunk = session.chunk();
    let mut free: Vec<u32> = (0..session.slots() as u32).rev().collect();
    let mut seqs: Vec<Sequence> = Vec::new();
    // Step scratch, reused.
    let (mut tokens, mut slots, mut select) = (Vec::new(), Vec::new(), Vec::new());
    let mut rows: Vec<usize> = Vec::new();
    let mut picks: Vec<u32> = Vec::new();
    // How many of a row's best logits a batched step reads back instead of the row, for the
    // samplers that need no more (0: whole rows; `Session::ranked_k` says where and how many).
    let ranked_k = session.ranked_k();
    loop {
        let cancel = shared.cancel.load(Ordering::SeqCst);
        // 1. Waiting requests into free slots.
        let mut gone = false;
        while let Some(&slot) = free.last() {
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
                metrics.finished(Outcome::Cancelled);
                continue;
            }
            free.pop();
            session.reset(slot as usize);
            let s = Sequence::new(request, sampler, slot, tokenizer);
            metrics.prompt(s.prompt_len());
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
            metrics.finished(Outcome::Cancelled);
            false
        });
        metrics.running.store(seqs.len(), Ordering::SeqCst);
        if seqs.is_empty() {
            if gone || (shared.draining.load(Ordering::SeqCst) && metrics.queue_depth() == 0) {
                return;
            }
            continue;
        }
        let mut ended: Vec<(usize, Outcome)> = Vec::new();
        // 3. One chunk of the oldest prompt still being read.
        if let Some(i) = seqs.iter().position(Sequence::prefilling) {
            let s = &mut seqs[i];
            let piece = s.next_chunk(chunk);
            let n = piece.len();
            slots.clear();
            slots.resize(n, s.slot);
            let last = [n as u32 - 1];
            match session.step_in(Phase::Prefill, piece, &slots, &last).map(|_| ()) {
                Ok(()) => {
                    s.fed(n);
                    if !s.prefilling() {
                        let at_limit = session.at_context_limit(s.slot as usize);
                        // Sampled in place: the session's logits are scratch until the next step.
                        if let Some(o) = accept(s, session.logits_mut(), at_limit, metrics) {
                            ended.push((i, o));
                        }
                    }
                }
                Err(e) => {
                    s.fail(e.to_string());
                    ended.push((i, Outcome::Error));
                }
            }
        }
        // 4. One decode step of every sequence with a token to feed.
        tokens.clear();
        slots.clear();
        rows.clear();
        for (i, s) in seqs.iter_mut().enumerate() {
            if ended.iter().any(|e| e.0 == i) {
                continue;
            }
            if let Some(t) = s.next.take() {
                tokens.push(t);
                slots.push(s.slot);
                rows.push(i);
            }
        }
        if !rows.is_empty() {
            select.clear();
            select.extend(0..rows.len() as u32);
            // Where every row's sampler can pick from its row's best logits, the step reads
            // back only those (ranked where the logits are computed).
            let ranked = ranked_k > 0 && rows.iter().all(|&i| seqs[i].fits_ranked(ranked_k));
            let stepped = if ranked {
                session.step_top_k(&tokens, &slots, &select, ranked_k).map(|_| ())
            } else {
                session.step(&tokens, &slots, &select).map(|_| ())
            };
            match stepped {
                Ok(()) => {
                    picks.clear();
                    picks.resize(rows.len(), 0);
                    if ranked {
                        for ((&i, pick), best) in rows
                            .iter()
                            .zip(picks.iter_mut())
                            .zip(session.logits_mut().chunks_exact(2 * ranked_k))
                        {
                            *pick = seqs[i].sampler_parts().0.sample_ranked(best);
                        }
                    } else {
                        // Each row sampled in place with its sequence's sampler, the rows
                        // spread over threads.
                        let mut want = rows.iter().peekable();
                        let mut parts: Vec<(&mut Sampler, &[u32], &mut [f32], &mut u32)> = seqs
                            .iter_mut()
                            .enumerate()
                            .filter(|(i, _)| want.next_if_eq(&i).is_some())
                            .map(|(_, s)| s.sampler_parts())
                            .zip(session.logits_mut().chunks_exact_mut(vocab))
                            .zip(picks.iter_mut())
                            .map(|(((sampler, history), row), pick)| (sampler, history, row, pick))
                            .collect();
                        sample_rows(&mut parts);
                    }
                    for (&i, &id) in rows.iter().zip(&picks) {
                        let s = &mut seqs[i];
                        let at_limit = session.at_context_limit(s.slot as usize);
                        if let Some(o) = accept_id(s, id, at_limit, metrics) {
                            ended.push((i, o));
                        }
                    }
                }
                Err(e) => {
                    for &i in &rows {
                        seqs[i].fail(e.to_string());
                        ended.push((i, Outcome::Error));
                    }
                }
            }
        }
        // Finished sequences leave; their slots are reset when reused.
        ended.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
        for (i, outcome) in ended {
            let s = seqs.remove(i);
            free.push(s.slot);
            metrics.finished(outcome);
        }
        metrics.running.store(seqs.len(), Ordering::SeqCst);
    }
}

/// [`Sequence::accept`], counted in the metrics.
fn accept(s: &mut Sequence<'_>, logits: &mut [f32], at_limit: bool, metrics: &Metrics) -> Option<Outcome> {
    counted(s.accept(logits, at_limit), metrics)
}

/// [`Sequence::accept_id`], counted in the metrics.
fn accept_id(s: &mut Sequence<'_>, id: u32, at_limit: bool, metrics: &Metrics) -> Option<Outcome> {
    counted(s.accept_id(id, at_limit), metrics)
}

/// An accepted token and its latency into the metrics; how the request ended, if it did.
fn counted((outcome, latency): (Option<sequence::Outcome>, Latency), metrics: &Metrics) -> Option<Outcome> {
    metrics.generated();
    match latency {
        Latency::First(d) => metrics.ttft.observe(d),
        Latency::Between(d) => metrics.itl.observe(d),
    }
    outcome.map(|o| match o {
        sequence::Outcome::Finished(FinishReason::Stop) => Outcome::Stop,
        sequence::Outcome::Finished(FinishReason::Length) => Outcome::Length,
        sequence::Outcome::Cancelled => Outcome::Cancelled,
    })
}
