//! A persistent thread pool for row-parallel matvecs.
//!
//! The key decision: workers are spawned once and sleep on a condition
//! variable between calls, so a decode step's hundreds of matvecs pay a
//! wake-up, never a `thread::spawn`. A call is *scoped*: [`ThreadPool::run`]
//! returns only after every worker has finished with the borrowed closure,
//! which is what makes lending it a non-`'static` reference sound. `rayon`
//! would do the same with a heavier dependency and less control over which
//! thread takes which rows.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;

/// The job as workers see it: a task index → work. The lifetime is erased;
/// see `run` for why that is sound.
type Job = *const (dyn Fn(usize) + Sync);

struct State {
    generation: u64,
    job: Option<JobPtr>,
    n_tasks: usize,
    /// Workers that joined this generation and have not finished.
    busy: usize,
    /// How many workers take part in this generation.
    wanted: usize,
    panicked: bool,
    shutdown: bool,
}

#[derive(Clone, Copy)]
struct JobPtr(Job);
// SAFETY: the pointee is `Sync` and outlives every use (`run` waits for all
// workers before returning), so sending the pointer to workers is sound.
unsafe impl Send for JobPtr {}

struct Inner {
    state: Mutex<State>,
    wake: Condvar,
    done: Condvar,
    next_task: AtomicUsize,
    /// `State::generation`, published without the lock for spinning workers.
    published: AtomicU64,
}

/// A fixed set of worker threads plus the calling thread.
pub struct ThreadPool {
    inner: Arc<Inner>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    /// One call at a time: the state holds one job.
    call: Mutex<()>,
}

impl ThreadPool {
    /// A pool with no workers yet; they are spawned on first need.
    pub fn new() -> ThreadPool {
        ThreadPool {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    generation: 0,
                    job: None,
                    n_tasks: 0,
                    busy: 0,
                    wanted: 0,
                    panicked: false,
                    shutdown: false,
                }),
                wake: Condvar::new(),
                done: Condvar::new(),
                next_task: AtomicUsize::new(0),
                published: AtomicU64::new(0),
            }),
            workers: Mutex::new(Vec::new()),
            call: Mutex::new(()),
        }
    }

    /// The process-wide pool the matvecs use.
    pub fn global() -> &'static ThreadPool {
        static POOL: OnceLock<ThreadPool> = OnceLock::new();
        POOL.get_or_init(ThreadPool::new)
    }

    fn ensure_workers(&self, n: usize) {
        let mut ws = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        while ws.len() < n {
            let inner = Arc::clone(&self.inner);
            let seen = inner.state.lock().unwrap_or_else(|e| e.into_inner()).generation;
            ws.push(std::thread::spawn(move || worker(&inner, seen)));
        }
    }

    /// Runs `f(0..n_tasks)` on `threads` threads (the caller included);
    /// tasks are claimed dynamically so a preempted thread delays only its
    /// current task. Returns after every task has run.
    pub fn run(&self, threads: usize, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        let helpers = threads.max(1).min(n_tasks).saturating_sub(1);
        if helpers == 0 {
            (0..n_tasks).for_each(f);
            return;
        }
        let _one_call = self.call.lock().unwrap_or_else(|e| e.into_inner());
        self.ensure_workers(helpers);
        let inner = &*self.inner;
        inner.next_task.store(0, Ordering::Relaxed);
        {
            let mut st = inner.state.lock().unwrap_or_else(|e| e.into_inner());
            // Erase the borrow's lifetime: sound because this function does not
            // return before `busy` drops to zero and `job` is cleared, i.e.
            // before every worker is done with `f`.
            // SAFETY: same-layout fat pointer cast that only erases a lifetime.
            let job: Job = unsafe { core::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(f) };
            st.job = Some(JobPtr(job));
            st.n_tasks = n_tasks;
            st.wanted = helpers;
            st.busy = 0;
            st.panicked = false;
            st.generation += 1;
            inner.published.store(st.generation, Ordering::Release);
        }
        inner.wake.notify_all();
        claim_tasks(inner, n_tasks, f);
        let mut st = inner.state.lock().unwrap_or_else(|e| e.into_inner());
        // Every task is claimed. A worker that has not joined yet is not
        // needed any more: withdraw the job (it will see `wanted == 0` and
        // wait for the next one) instead of waiting for it to be scheduled —
        // under a noisy neighbour that wait was a time slice per matvec.
        // Wait only for the workers still running claimed tasks. Poll first:
        // they finish microseconds after this thread, and parking here costs
        // a futex round trip per matvec, over a hundred per token.
        st.wanted = 0;
        st.job = None;
        let start = std::time::Instant::now();
        while st.busy > 0 {
            if start.elapsed() < SPIN {
                drop(st);
                for _ in 0..32 {
                    std::hint::spin_loop();
                }
                // Let a preempted worker have this core if it is waiting for one.
                std::thread::yield_now();
                st = inner.state.lock().unwrap_or_else(|e| e.into_inner());
            } else {
                st = inner.done.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        }
        let panicked = st.panicked;
        drop(st);
        assert!(!panicked, "a thread-pool task panicked");
    }
}

impl Default for ThreadPool {
    fn default() -> Self {
        ThreadPool::new()
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner()).shutdown = true;
        self.inner.wake.notify_all();
        for w in self.workers.get_mut().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = w.join();
        }
    }
}

fn claim_tasks(inner: &Inner, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
    loop {
        let t = inner.next_task.fetch_add(1, Ordering::Relaxed);
        if t >= n_tasks {
            return;
        }
        f(t);
    }
}

/// How long a worker polls for the next job before parking. Decode issues
/// matvecs back to back, microseconds apart: a parked worker costs a futex
/// wake per matvec (tens of microseconds, ~5-10% of a 4096x4096 matvec),
/// while polling forever is what makes llama.cpp's threads collapse when
/// another process shares a core. A short poll keeps the first benefit
/// without the second.
const SPIN: std::time::Duration = std::time::Duration::from_micros(100);

fn spin_for_job(inner: &Inner, seen: u64) {
    let start = std::time::Instant::now();
    // The clock is read once per 64 polls: reading it every poll made
    // `clock_gettime` 6% of a decode profile.
    'spin: loop {
        for _ in 0..64 {
            if inner.published.load(Ordering::Acquire) != seen {
                break 'spin;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() >= SPIN {
            break;
        }
        // A spinning worker must not hold a core that the caller (preempted
        // by another process) needs to publish the next job.
        std::thread::yield_now();
    }
}

fn worker(inner: &Inner, mut seen: u64) {
    loop {
        // Only a delay before the locked check below: a job published while
        // spinning is found there, one published after is signalled.
        spin_for_job(inner, seen);
        let (job, n_tasks) = {
            let mut st = inner.state.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if st.shutdown {
                    return;
                }
                if st.generation != seen && st.wanted > 0 {
                    break;
                }
                if st.generation != seen {
                    // Not needed this time (fewer threads asked for).
                    seen = st.generation;
                    continue;
                }
                st = inner.wake.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            seen = st.generation;
            st.wanted -= 1;
            st.busy += 1;
            match st.job {
                Some(j) => (j, st.n_tasks),
                None => {
                    st.busy -= 1;
                    continue;
                }
            }
        };
        // SAFETY: `run` keeps the closure alive until `busy` returns to zero,
        // which happens only after this use.
        let f = unsafe { &*job.0 };
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| claim_tasks(inner, n_tasks, f))).is_ok();
        let mut st = inner.state.lock().unwrap_or_else(|e| e.into_inner());
        st.busy -= 1;
        st.panicked |= !ok;
        drop(st);
        inner.done.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Every task runs exactly once per call, whether the workers are still
    /// polling from the previous call (back-to-back calls) or parked (a
    /// pause longer than the poll), and with fewer threads than workers.
    #[test]
    fn every_task_runs_exactly_once_across_hot_and_parked_workers() {
        let pool = ThreadPool::new();
        for round in 0..400 {
            let n_tasks = 1 + round % 37;
            let threads = 1 + round % 4;
            let hits: Vec<AtomicUsize> = (0..n_tasks).map(|_| AtomicUsize::new(0)).collect();
            pool.run(threads, n_tasks, &|t| {
                hits[t].fetch_add(1, Ordering::Relaxed);
            });
            for (t, h) in hits.iter().enumerate() {
                assert_eq!(h.load(Ordering::Relaxed), 1, "round {round}: task {t} ran {} times", h.load(Ordering::Relaxed));
            }
            if round % 50 == 49 {
                std::thread::sleep(SPIN * 3);
            }
        }
    }
}
