//! A pool of threads that spin between the parallel loops of a step, for the small loops of a
//! decode step (matrix-vector products, split attention), where handing each loop to rayon's
//! sleeping workers costs more than the loop's own work on many threads.
//!
//! [`SpinPool::run`] publishes a job (a task count and a closure), takes tasks on the calling
//! thread as well, and returns once every worker has left the job. Workers spin on the job
//! counter after their last job (yielding their core after a few microseconds, so that other
//! threads on a busy machine are not starved) and sleep after [`SPIN`], so an idle engine costs
//! nothing. A panic in a task is caught on its worker and raised again on the caller.
//!
//! The only unsafe code: the job's closure borrows the caller's stack, and workers reach it
//! through a pointer whose lifetime is erased; `run` does not return (or unwind) before every
//! worker has finished with it.

use std::any::Any;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a worker waits for the next job (spinning, then yielding its core) before it sleeps.
/// Long enough for the gaps between the loops of one step; short, because in a layer split the
/// step goes on on another unit once this pool's part ends, and workers still spinning then
/// slowed it (H200, 1B q4_k, 13 of 26 layers on the GPU, decode: 90.8 tok/s at 200 us against
/// 122.9 at 50 and 122.2 at 20; the CPU alone 66.3, 63.4 and 67.4, within its noise:
/// bench/results/2026-11-28-split-decode).
const SPIN: Duration = Duration::from_micros(50);

/// Checks of the job counter a worker makes before it starts yielding its core between them
/// (a few microseconds: the gap between two loops of a step).
const PURE_SPINS: u32 = 2000;

/// A job's closure, its lifetime erased (see the module docs).
type Job = *const (dyn Fn(usize) + Sync + 'static);

struct Shared {
    /// Bumped once per job; workers wait for it to change.
    epoch: AtomicU64,
    /// The current job: written by `run` only while no worker is inside a job (before the
    /// epoch's release), read by workers after they acquire the new epoch.
    job: UnsafeCell<Option<SendJob>>,
    /// The next task index to take.
    next: AtomicUsize,
    /// Tasks in the current job.
    tasks: AtomicUsize,
    /// Workers that have not yet left the current job.
    busy: AtomicUsize,
    /// A task's panic, raised again by `run`.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    stop: AtomicBool,
    /// Workers asleep (or about to be): `run` wakes them only when there are some.
    sleepers: AtomicUsize,
    /// Sleeping workers wait here for the next epoch.
    wake: Condvar,
    lock: Mutex<()>,
}

// SAFETY: every field but `job` is a synchronisation primitive; `job` is written only while no
// worker reads it and published by the epoch's release store (see its docs).
unsafe impl Sync for Shared {}

/// A job pointer handed to the workers.
#[derive(Clone, Copy)]
struct SendJob(Job);

// SAFETY: the pointee is `Sync` (shared calls from several threads are allowed), and `run`
// keeps it alive until every worker has stopped using it.
unsafe impl Send for SendJob {}

/// The pool: `threads - 1` workers besides the calling thread.
pub struct SpinPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl SpinPool {
    /// Starts `threads - 1` workers (none for one thread). Errors where the OS refuses a
    /// thread.
    pub fn new(threads: usize) -> std::io::Result<SpinPool> {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            next: AtomicUsize::new(0),
            tasks: AtomicUsize::new(0),
            busy: AtomicUsize::new(0),
            panic: Mutex::new(None),
            stop: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            wake: Condvar::new(),
            lock: Mutex::new(()),
        });
        let mut workers = Vec::new();
        for i in 1..threads.max(1) {
            let s = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name(format!("tandem-spin-{i}"))
                .spawn(move || worker(&s));
            match handle {
                Ok(h) => workers.push(h),
                Err(e) => {
                    // Stop the ones started before failing.
                    drop(SpinPool { shared, workers });
                    return Err(e);
                }
            }
        }
        Ok(SpinPool { shared, workers })
    }

    /// Threads that take tasks: the workers and the caller.
    pub fn threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(0)..f(tasks)` across the workers and the calling thread; returns when all have
    /// run. A task's panic is raised again here.
    pub fn run<F: Fn(usize) + Sync>(&self, tasks: usize, f: F) {
        if self.workers.is_empty() || tasks <= 1 {
            (0..tasks).for_each(f);
            return;
        }
        let s = &*self.shared;
        let job: &(dyn Fn(usize) + Sync) = &f;
        // SAFETY: only the lifetime changes; the pointer is used by workers only between the
        // epoch bump below and their `busy` decrement, and this function waits for `busy` to
        // reach zero before `f` goes out of scope (it catches nothing that could skip that
        // wait: the caller's own tasks run under `catch_unwind`).
        let job: Job = unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync), Job>(job) };
        // SAFETY: no worker is inside a job (the last `run` waited for `busy` to reach zero),
        // so nothing reads `job` until the epoch below is published.
        unsafe { *s.job.get() = Some(SendJob(job)) };
        s.next.store(0, Ordering::Relaxed);
        s.tasks.store(tasks, Ordering::Relaxed);
        s.busy.store(self.workers.len(), Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = lock(&s.lock);
            s.wake.notify_all();
        }
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| take_tasks(s, &f)));
        let mut spins = 0u32;
        while s.busy.load(Ordering::Acquire) != 0 {
            spins = spins.saturating_add(1);
            if spins > PURE_SPINS {
                // A worker without a core (a busy machine): give it this one.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        // SAFETY: every worker has left the job.
        unsafe { *s.job.get() = None };
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if let Some(p) = lock(&s.panic).take() {
            std::panic::resume_unwind(p);
        }
    }
}

/// Takes the current job's tasks until none are left.
fn take_tasks(s: &Shared, f: &(dyn Fn(usize) + Sync)) {
    let tasks = s.tasks.load(Ordering::Relaxed);
    loop {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        if i >= tasks {
            return;
        }
        f(i);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a task panicked while the pool was handing it out; the data
    // (a pointer, a panic payload) is still whole.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        // Spin for the next job, then sleep.
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.stop.load(Ordering::Acquire) {
                return;
            }
            if s.epoch.load(Ordering::Acquire) != seen {
                break;
            }
            spins = spins.wrapping_add(1);
            if spins > PURE_SPINS {
                // Still waiting: let any other thread that wants this core have it.
                std::thread::yield_now();
            }
            if spins.is_multiple_of(64) && start.elapsed() > SPIN {
                let g = lock(&s.lock);
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                let g = s
                    .wake
                    .wait_while(g, |_| {
                        s.epoch.load(Ordering::SeqCst) == seen && !s.stop.load(Ordering::SeqCst)
                    })
                    .unwrap_or_else(|e| e.into_inner());
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
                drop(g);
                continue;
            }
            std::hint::spin_loop();
        }
        seen = s.epoch.load(Ordering::Acquire);
        // SAFETY: `run` wrote the job before publishing this epoch (acquired above) and does not
        // write it again before this worker's `busy` decrement.
        let job = unsafe { *s.job.get() };
        if let Some(SendJob(job)) = job {
            // SAFETY: `run` published this pointer for the current epoch and waits for this
            // worker's `busy` decrement below before the closure goes out of scope.
            let f: &(dyn Fn(usize) + Sync) = unsafe { &*job };
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| take_tasks(s, f))) {
                lock(&s.panic).get_or_insert(p);
            }
        }
        s.busy.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for SpinPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        {
            let _g = lock(&self.shared.lock);
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Runs `f(i, chunk)` for each chunk `i` of `len` values of `data` (the last may be shorter)
/// on `pool`.
pub fn chunks_mut<T: Send, F>(pool: &SpinPool, data: &mut [T], len: usize, f: F)
where
    F: Fn(usize, &mut [T]) + Sync,
{
    let len = len.max(1);
    let n = data.len();
    let base = SendPtr(data.as_mut_ptr());
    pool.run(n.div_ceil(len), |i| {
        let at = i * len;
        let end = (at + len).min(n);
        let p = base;
        // SAFETY: chunk `i` is `data[at..end]`, within `data`; each index runs once, so no two
        // tasks alias, and `data`'s borrow outlives `run`.
        let chunk = unsafe { std::slice::from_raw_parts_mut(p.0.add(at), end - at) };
        f(i, chunk)
    });
}

/// A pointer into the caller's slice, handed to the tasks of [`chunks_mut`].
struct SendPtr<T>(*mut T);

impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for SendPtr<T> {}

// SAFETY: tasks reach disjoint chunks through it (see `chunks_mut`), and `T: Send`.
unsafe impl<T: Send> Send for SendPtr<T> {}
// SAFETY: as above: shared only to compute disjoint chunks.
unsafe impl<T: Send> Sync for SendPtr<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_and_chunks_are_disjoint() {
        let pool = SpinPool::new(4).unwrap();
        assert_eq!(pool.threads(), 4);
        for round in 0..200 {
            let mut v = vec![0u32; 1000 + round];
            chunks_mut(&pool, &mut v, 7, |i, c| {
                for x in c.iter_mut() {
                    *x += i as u32 + 1;
                }
            });
            for (j, x) in v.iter().enumerate() {
                assert_eq!(*x, (j / 7) as u32 + 1, "round {round} value {j}");
            }
        }
        // One thread: inline.
        let one = SpinPool::new(1).unwrap();
        let count = AtomicUsize::new(0);
        one.run(5, |_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_and_the_pool_still_works() {
        let pool = SpinPool::new(3).unwrap();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(16, |i| {
                if i == 9 {
                    panic!("task 9");
                }
            })
        }));
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        pool.run(16, |_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 16);
    }
}
