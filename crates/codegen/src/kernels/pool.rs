//! A persistent thread pool for the GEMM drivers.
//!
//! Worker `t` (1-based; the calling thread is part 0) is a long-lived OS thread. The drivers
//! give part `t` the same column slice of a weight on every call ("weight-stationary"), so the
//! slice a worker touched last time is still in its private L2 the next time.
//!
//! Workers spin for a short while after each job (GEMMs in an encoder come back to back), then
//! yield between checks, then park; the dispatcher waiting for its workers spins briefly, then
//! yields, so that on a machine busier than its cores our threads hand each other the core. Set `ENCORE_PIN=1` to pin worker `t` to CPU `t` (the caller is left unpinned).

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

type Job = *const (dyn Fn(usize) + Sync);

struct Slot {
    seq: AtomicU64,
    done: AtomicU64,
    sleeping: AtomicBool,
    panicked: AtomicBool,
    job: UnsafeCell<Option<Job>>,
}

// SAFETY: `job` is written only by the dispatcher while it holds the pool lock and before it
// publishes `seq` (Release); the worker reads it only after observing the new `seq` (Acquire)
// and the dispatcher does not touch it again until the worker publishes `done`.
unsafe impl Sync for Slot {}
// SAFETY: see above; the raw job pointer is only dereferenced under that protocol.
unsafe impl Send for Slot {}

struct Worker {
    slot: Arc<Slot>,
    thread: Thread,
}

/// The process-wide pool. Use [`parallel_for`].
struct Pool {
    workers: Mutex<Vec<Worker>>,
}

/// How long an idle worker waits for the next job before parking: GEMMs come back to back.
const SPIN: Duration = Duration::from_micros(200);
/// The first part of [`SPIN`], spent in a busy loop; the rest yields the core between checks.
const SPIN_HOT: Duration = Duration::from_micros(20);
/// Busy-wait iterations of the dispatcher for its workers before it yields the core between
/// checks: on a machine busier than its cores, a worker that was descheduled can run on the
/// dispatcher's core instead of waiting for the dispatcher's time slice to end.
const DISPATCH_SPINS: u32 = 1 << 10;

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        workers: Mutex::new(Vec::new()),
    })
}

/// The most threads worth using: the machine's available parallelism.
pub fn max_threads() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}

fn pin_to_cpu(cpu: usize) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: cpu_set_t is plain data; CPU_SET writes inside it; sched_setaffinity(0, ...)
        // only affects the calling thread and reads the set we pass by pointer.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu % libc::CPU_SETSIZE as usize, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cpu;
}

fn worker_main(index: usize, slot: Arc<Slot>) {
    if std::env::var("ENCORE_PIN").is_ok_and(|v| v == "1") {
        pin_to_cpu(index);
    }
    let mut seen = 0u64;
    loop {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let s = slot.seq.load(Ordering::Acquire);
            if s != seen {
                seen = s;
                break;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(256) {
                std::hint::spin_loop();
                continue;
            }
            let waited = start.elapsed();
            if waited < SPIN_HOT {
                continue;
            }
            if waited < SPIN {
                // Still waiting for the next job, but a thread that shares this core (the
                // dispatcher on a busy machine) may need it now.
                std::thread::yield_now();
                continue;
            }
            slot.sleeping.store(true, Ordering::SeqCst);
            if slot.seq.load(Ordering::SeqCst) == seen {
                std::thread::park();
            }
            slot.sleeping.store(false, Ordering::SeqCst);
        }
        // SAFETY: we observed the new seq with Acquire, so the dispatcher's write of `job`
        // happened before; the dispatcher keeps the closure alive until we publish `done`.
        let job = unsafe { (*slot.job.get()).expect("job published with seq") };
        // SAFETY: as above: the pointee outlives this call (the dispatcher waits for `done`).
        let f = unsafe { &*job };
        if catch_unwind(AssertUnwindSafe(|| f(index))).is_err() {
            slot.panicked.store(true, Ordering::Release);
        }
        slot.done.store(seen, Ordering::Release);
    }
}

fn spawn_worker(index: usize) -> Worker {
    let slot = Arc::new(Slot {
        seq: AtomicU64::new(0),
        done: AtomicU64::new(0),
        sleeping: AtomicBool::new(false),
        panicked: AtomicBool::new(false),
        job: UnsafeCell::new(None),
    });
    let s2 = slot.clone();
    let handle = std::thread::Builder::new()
        .name(format!("encore-gemm-{index}"))
        .spawn(move || worker_main(index, s2))
        .expect("spawning a GEMM worker thread");
    Worker {
        slot,
        thread: handle.thread().clone(),
    }
}

/// Runs `f(0)`, `f(1)`, …, `f(parts - 1)`, part 0 on the calling thread and part `t` on
/// persistent worker `t`, and returns when all are done. A panic in any part is re-raised here.
///
/// If the pool is busy (another thread is dispatching, or this is a nested call from inside a
/// part), all parts run one after another on the calling thread; the result is the same.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// let sum = AtomicUsize::new(0);
/// codegen::kernels::pool::parallel_for(2, &|t| { sum.fetch_add(t + 1, Ordering::Relaxed); });
/// assert_eq!(sum.load(Ordering::Relaxed), 3);
/// ```
pub fn parallel_for(parts: usize, f: &(dyn Fn(usize) + Sync)) {
    if parts <= 1 {
        if parts == 1 {
            f(0);
        }
        return;
    }
    if RECORDING.with(|r| r.get().is_none()) {
        return dispatch(parts, f);
    }
    let start = Instant::now();
    let ends: smallvec::SmallVec<[AtomicU64; 8]> = (0..parts).map(|_| AtomicU64::new(0)).collect();
    dispatch(parts, &|t| {
        f(t);
        ends[t].store(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
    });
    let end = Instant::now();
    let ends = ends.iter().map(|e| e.load(Ordering::Relaxed));
    let spread = ends.clone().max().unwrap_or(0) - ends.min().unwrap_or(0);
    RECORDING.with(|r| {
        if let Some((mut stats, last_end)) = r.get() {
            stats += RegionStats {
                regions: 1,
                inside: end - start,
                between: last_end.map_or(Duration::ZERO, |e| start.saturating_duration_since(e)),
                spread: Duration::from_nanos(spread),
            };
            r.set(Some((stats, Some(end))));
        }
    });
}

/// What the parallel regions a thread dispatches cost beyond their parts' work, as
/// [`record_regions`] counts them: a region is a [`parallel_for`] of two parts or more (and the
/// helpers built on it), from its dispatch to its last part's end.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct RegionStats {
    /// Regions dispatched.
    pub regions: u64,
    /// Time inside them.
    pub inside: Duration,
    /// Time the dispatching thread ran alone between one region's end and the next one's
    /// dispatch (set-up, single-threaded ops): the other threads idle meanwhile.
    pub between: Duration,
    /// Summed over regions, how far apart their parts ended: the first part done waits for
    /// the last (uneven shares, or a core busy with something else).
    pub spread: Duration,
}

impl std::ops::AddAssign for RegionStats {
    fn add_assign(&mut self, o: RegionStats) {
        self.regions += o.regions;
        self.inside += o.inside;
        self.between += o.between;
        self.spread += o.spread;
    }
}

thread_local! {
    /// The recording [`record_regions`] keeps on this thread: the counts so far and the end
    /// of the last region.
    static RECORDING: std::cell::Cell<Option<(RegionStats, Option<Instant>)>> =
        const { std::cell::Cell::new(None) };
}

/// Runs `f`, counting the parallel regions this thread dispatches meanwhile (see
/// [`RegionStats`]); what `bench --profile` reports of the hand-offs between threads. A
/// recording inside another replaces it for its duration (the outer one misses those regions).
///
/// ```
/// use codegen::kernels::pool::{parallel_for, record_regions};
/// let ((), stats) = record_regions(|| {
///     parallel_for(2, &|_| {});
///     parallel_for(2, &|_| {});
/// });
/// assert_eq!(stats.regions, 2);
/// ```
pub fn record_regions<R>(f: impl FnOnce() -> R) -> (R, RegionStats) {
    let outer = RECORDING.replace(Some((RegionStats::default(), None)));
    let result = f();
    let stats = RECORDING.replace(outer).map(|(s, _)| s).unwrap_or_default();
    (result, stats)
}

/// What [`record_regions`] has counted so far on this thread, or `None` outside a recording:
/// the difference of two readings is what happened between them.
///
/// ```
/// use codegen::kernels::pool::{parallel_for, record_regions, recorded_so_far};
/// assert!(recorded_so_far().is_none());
/// record_regions(|| {
///     let before = recorded_so_far().unwrap();
///     parallel_for(2, &|_| {});
///     let after = recorded_so_far().unwrap();
///     assert!(after.inside >= before.inside);
/// });
/// ```
pub fn recorded_so_far() -> Option<RegionStats> {
    RECORDING.with(|r| r.get().map(|(stats, _)| stats))
}

/// [`parallel_for`] of two parts or more.
fn dispatch(parts: usize, f: &(dyn Fn(usize) + Sync)) {
    let Ok(mut workers) = pool().workers.try_lock() else {
        (0..parts).for_each(f);
        return;
    };
    while workers.len() < parts - 1 {
        let w = spawn_worker(workers.len() + 1);
        workers.push(w);
    }
    // SAFETY: erasing the lifetime is sound because we wait below (even if part 0 panics) until
    // every worker has published `done` for this job, so no worker uses `f` after we return.
    let job: Job = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f) };
    let mut seqs: smallvec::SmallVec<[u64; 8]> = smallvec::SmallVec::new();
    for w in &workers[..parts - 1] {
        // SAFETY: the worker is idle (its done == seq from the previous round, which we waited
        // for), and we hold the pool lock, so nobody else reads or writes `job` now.
        unsafe { *w.slot.job.get() = Some(job) };
        let s = w.slot.seq.fetch_add(1, Ordering::SeqCst) + 1;
        if w.slot.sleeping.load(Ordering::SeqCst) {
            w.thread.unpark();
        }
        seqs.push(s);
    }
    let r0 = catch_unwind(AssertUnwindSafe(|| f(0)));
    let mut panicked = false;
    for (w, s) in workers[..parts - 1].iter().zip(seqs) {
        let mut spins = 0u32;
        while w.slot.done.load(Ordering::Acquire) != s {
            spins = spins.wrapping_add(1);
            if spins < DISPATCH_SPINS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        panicked |= w.slot.panicked.swap(false, Ordering::AcqRel);
    }
    drop(workers);
    if let Err(p) = r0 {
        resume_unwind(p);
    }
    if panicked {
        panic!("a GEMM worker thread panicked");
    }
}

/// Runs `f` on chunks of `0..total` (a few per part) that `parts` threads claim in turn, so a
/// thread whose core is busy elsewhere holds up only the chunk it is on, not a fixed share.
/// Every index is in exactly one chunk; which thread runs a chunk varies, so `f` must not
/// depend on it.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// let sum = AtomicUsize::new(0);
/// codegen::kernels::pool::parallel_chunks(10, 2, |r| { sum.fetch_add(r.sum::<usize>(), Ordering::Relaxed); });
/// assert_eq!(sum.load(Ordering::Relaxed), 45);
/// ```
pub fn parallel_chunks(total: usize, parts: usize, f: impl Fn(std::ops::Range<usize>) + Sync) {
    let chunks = (parts * 4).min(total).max(1);
    let next = AtomicUsize::new(0);
    parallel_for(parts, &|_| loop {
        let c = next.fetch_add(1, Ordering::Relaxed);
        if c >= chunks {
            break;
        }
        f(split_range(total, chunks, c));
    });
}

/// Runs `f` on chunks of `0..total` with `parts` threads, each part starting with its own
/// contiguous share (part `t` the `t`-th of `parts` near-equal shares, as [`split_range`] cuts
/// them), claimed chunk by chunk from the front; a part done with its share takes chunks from
/// the back of the others', so a busy core holds up only the chunk it is on. For work whose
/// data the previous parallel step left in the cache of the part with the same index: int8
/// attention's heads, which the QKV GEMM's part `t` wrote. Every index is in exactly one chunk.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// let sum = AtomicUsize::new(0);
/// codegen::kernels::pool::parallel_owned_chunks(10, 2, |r| { sum.fetch_add(r.sum::<usize>(), Ordering::Relaxed); });
/// assert_eq!(sum.load(Ordering::Relaxed), 45);
/// ```
pub fn parallel_owned_chunks(
    total: usize,
    parts: usize,
    f: impl Fn(std::ops::Range<usize>) + Sync,
) {
    // Chunks per share: enough that the other part can take over the tail of a share.
    const CHUNKS: usize = 4;
    let parts = parts.min(total).max(1);
    if parts == 1 {
        if total > 0 {
            f(0..total);
        }
        return;
    }
    let shares: smallvec::SmallVec<[(std::ops::Range<usize>, usize, Claims); 8]> = (0..parts)
        .map(|t| {
            let share = split_range(total, parts, t);
            let chunks = CHUNKS.min(share.len()).max(1);
            (share, chunks, Claims::new(chunks))
        })
        .collect();
    let run = |p: usize, c: usize| {
        let (share, chunks, _) = &shares[p];
        let r = split_range(share.len(), *chunks, c);
        f(share.start + r.start..share.start + r.end);
    };
    parallel_for(parts, &|t| {
        while let Some(c) = shares[t].2.claim_front() {
            run(t, c);
        }
        for p in (1..parts).map(|o| (t + o) % parts) {
            while let Some(c) = shares[p].2.claim_back() {
                run(p, c);
            }
        }
    });
}

/// Units `0..n` that their owner claims from the front and other threads from the back, each
/// exactly once.
pub(crate) struct Claims {
    /// `front << 32 | back`: units `front..back` are still unclaimed.
    queue: std::sync::atomic::AtomicU64,
}

impl Claims {
    pub(crate) fn new(n: usize) -> Claims {
        assert!((n as u64) < 1 << 32, "too many work units");
        Claims {
            queue: std::sync::atomic::AtomicU64::new(n as u64),
        }
    }

    fn claim(&self, from_front: bool) -> Option<usize> {
        use std::sync::atomic::Ordering;
        let mut cur = self.queue.load(Ordering::Relaxed);
        loop {
            let (f, b) = (cur >> 32, cur & 0xffff_ffff);
            if f >= b {
                return None;
            }
            let (next, u) = if from_front {
                ((f + 1) << 32 | b, f)
            } else {
                (f << 32 | (b - 1), b - 1)
            };
            match self
                .queue
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Some(u as usize),
                Err(c) => cur = c,
            }
        }
    }

    /// The owner's next unit.
    pub(crate) fn claim_front(&self) -> Option<usize> {
        self.claim(true)
    }

    /// A thief's next unit (from the back).
    pub(crate) fn claim_back(&self) -> Option<usize> {
        self.claim(false)
    }
}

/// Default for [`set_min_parallel_macs`]: problems below this many multiply-adds run on one
/// thread, since waking a worker costs more than it saves (about 10 µs of work on one core).
pub const MIN_PARALLEL_MACS: usize = 1 << 20;

static MIN_MACS: AtomicUsize = AtomicUsize::new(MIN_PARALLEL_MACS);

/// Sets the size below which GEMMs run single-threaded (tests set 0 to force the
/// multi-threaded paths on small shapes).
pub fn set_min_parallel_macs(macs: usize) {
    MIN_MACS.store(macs, Ordering::Relaxed);
}

/// The thread count a GEMM of `m × n × k` actually uses: `threads` capped at the machine's
/// parallelism, and 1 for problems under the [`set_min_parallel_macs`] threshold.
///
/// ```
/// use codegen::kernels::pool::effective_threads;
/// assert_eq!(effective_threads(2, 8, 8, 8), 1); // with the default threshold
/// assert!(effective_threads(2, 1024, 768, 768) >= 1);
/// ```
pub fn effective_threads(threads: usize, m: usize, n: usize, k: usize) -> usize {
    if m.saturating_mul(n).saturating_mul(k.max(1)) < MIN_MACS.load(Ordering::Relaxed) {
        1
    } else {
        threads.clamp(1, max_threads())
    }
}

static EAGER_STEAL: AtomicBool = AtomicBool::new(false);

/// When set, each part of a GEMM first steals one unit of work from the next part before
/// starting its own (tests use it to exercise the work-stealing path deterministically).
pub fn set_eager_steal(on: bool) {
    EAGER_STEAL.store(on, Ordering::Relaxed);
}

/// See [`set_eager_steal`].
pub fn eager_steal() -> bool {
    EAGER_STEAL.load(Ordering::Relaxed)
}

/// Splits `0..total` units into `parts` contiguous ranges, as even as possible; part `t` always
/// gets the same range for the same `(total, parts)`.
///
/// ```
/// assert_eq!(codegen::kernels::pool::split_range(10, 3, 0), 0..4);
/// assert_eq!(codegen::kernels::pool::split_range(10, 3, 2), 7..10);
/// ```
pub fn split_range(total: usize, parts: usize, t: usize) -> std::ops::Range<usize> {
    let base = total / parts;
    let rem = total % parts;
    let start = t * base + t.min(rem);
    let len = base + usize::from(t < rem);
    start..start + len
}

/// Panels of `nr` columns per group when every block boundary must fall on a multiple of
/// `cols` columns: `lcm(cols, nr) / nr` (1 for `cols` 1).
pub(crate) fn panel_granularity(cols: usize, nr: usize) -> usize {
    let (mut a, mut b) = (cols.max(1), nr.max(1));
    while b != 0 {
        (a, b) = (b, a % b);
    }
    cols.max(1) / a
}

/// Part `t` of `parts` of `panels` panels, in whole groups of `g` (the last group may be
/// short, and parts may be empty when there are fewer groups than parts).
pub(crate) fn split_panels(
    panels: usize,
    parts: usize,
    t: usize,
    g: usize,
) -> std::ops::Range<usize> {
    let r = split_range(panels.div_ceil(g), parts, t);
    (r.start * g).min(panels)..(r.end * g).min(panels)
}

/// How a GEMM with a packed weight shares its output among threads.
///
/// Weight-stationary: with [`GemmSplit::Columns`], thread `t` computes the same columns (and so
/// reads the same packed weight panels) on every call, which keeps its weights in its own L2.
/// Rows are shared instead when there are fewer panels than threads, or when the epilogue needs
/// whole rows (LayerNorm) and one thread's block can hold a whole row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GemmSplit {
    /// Column ranges, one per thread, in output columns.
    Columns(Vec<std::ops::Range<usize>>),
    /// Every thread computes all columns of its share of the rows.
    Rows { threads: usize },
}

impl std::fmt::Display for GemmSplit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GemmSplit::Columns(r) => {
                let parts: Vec<String> = r
                    .iter()
                    .map(|r| format!("{}..{}", r.start, r.end))
                    .collect();
                write!(f, "columns({})", parts.join("|"))
            }
            GemmSplit::Rows { threads } => write!(f, "rows({threads})"),
        }
    }
}

/// Whether a GEMM of `panels` weight panels shares columns among `threads` (else rows): the one
/// rule both drivers and [`plan_split`] follow.
pub(crate) fn splits_columns(panels: usize, threads: usize, row_epilogue: bool) -> bool {
    panels >= threads && !row_epilogue
}

/// The split a driver uses for `threads` workers over `n` columns in panels of `nr`.
pub(crate) fn plan_split(
    n: usize,
    nr: usize,
    threads: usize,
    row_epilogue: bool,
    granularity: usize,
) -> GemmSplit {
    let panels = n.div_ceil(nr);
    let threads = threads.max(1);
    if splits_columns(panels, threads, row_epilogue) {
        GemmSplit::Columns(
            (0..threads)
                .map(|t| {
                    let p = split_panels(panels, threads, t, granularity);
                    (p.start * nr).min(n)..(p.end * nr).min(n)
                })
                .collect(),
        )
    } else {
        GemmSplit::Rows { threads }
    }
}

/// One part's share of the output (a row range × a panel range), cut into units of one
/// `mc`-row block × one `nc`-panel block, m-major. The owner claims units from the front, idle
/// threads steal from the back, so a part whose core is busy does not stall the GEMM while the
/// steady state stays weight-stationary.
/// The parts of one GEMM call, inline for up to 8 threads (no allocation per call).
pub(crate) type PartWorks = smallvec::SmallVec<[PartWork; 8]>;

pub(crate) struct PartWork {
    rows: std::ops::Range<usize>,
    pans: std::ops::Range<usize>,
    mc: usize,
    nc_panels: usize,
    units_m: usize,
    units: usize,
    queue: Claims,
}

impl PartWork {
    /// `mc_max` rows (rounded to a multiple of `mr`) by `nc_panels` panels per unit, panel
    /// blocks in whole groups of `g` panels from `pans.start` (which the caller puts on a group).
    pub(crate) fn new(
        rows: std::ops::Range<usize>,
        pans: std::ops::Range<usize>,
        mr: usize,
        mc_max: usize,
        nc_panels: usize,
        g: usize,
    ) -> Self {
        let mc = mc_max.min(rows.len().div_ceil(mr) * mr).max(mr);
        let units_m = rows.len().div_ceil(mc);
        // Panel blocks of near-equal width (8 panels with at most 7 per block: 4 + 4, not
        // 7 + 1), so that no unit is a sliver that costs a pass over A for little work.
        let g = g.max(1);
        let nc_max = (nc_panels / g * g).max(g);
        let units_n = pans.len().div_ceil(nc_max);
        let nc_panels = pans
            .len()
            .div_ceil(units_n.max(1))
            .max(1)
            .next_multiple_of(g);
        let total = units_m * units_n;
        Self {
            rows,
            pans,
            mc,
            nc_panels,
            units_m,
            units: total,
            queue: Claims::new(total),
        }
    }

    /// How many units the part holds.
    pub(crate) fn units(&self) -> usize {
        self.units
    }

    /// Rows and panels of unit `u`. Rows vary fastest: consecutive units share a panel block,
    /// whose weights stay in L2 while the rows sweep past.
    pub(crate) fn unit(&self, u: usize) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        let (um, un) = (u % self.units_m, u / self.units_m);
        let r0 = self.rows.start + um * self.mc;
        let p0 = self.pans.start + un * self.nc_panels;
        (
            r0..(r0 + self.mc).min(self.rows.end),
            p0..(p0 + self.nc_panels).min(self.pans.end),
        )
    }

    /// The owner's next unit.
    pub(crate) fn claim_front(&self) -> Option<usize> {
        self.queue.claim_front()
    }

    /// A thief's next unit (from the back).
    pub(crate) fn claim_back(&self) -> Option<usize> {
        self.queue.claim_back()
    }
}

#[cfg(test)]
mod tests {
    use super::{parallel_chunks, parallel_for, record_regions};
    use std::time::Duration;

    /// Regions of two parts or more are counted (one part is not a region), with the time
    /// between them and inside them at least what the parts and the caller slept; a region
    /// whose parts ran one after another (the pool busy with another test's GEMM) counts too.
    /// Nothing is recorded outside `record_regions`, and an inner recording leaves the outer
    /// one's counts as they were.
    #[test]
    fn recorded_regions_count_the_time_between_and_inside() {
        let pause = Duration::from_millis(15);
        let ((), stats) = record_regions(|| {
            parallel_for(2, &|t| {
                if t == 1 {
                    std::thread::sleep(2 * pause);
                }
            });
            std::thread::sleep(pause);
            parallel_for(1, &|_| {});
            parallel_chunks(8, 2, |_| {});
        });
        assert_eq!(stats.regions, 2, "{stats:?}");
        assert!(stats.between >= pause, "{stats:?}");
        assert!(stats.inside >= 2 * pause, "{stats:?}");
        assert!(stats.spread <= stats.inside, "{stats:?}");

        parallel_for(2, &|_| {});
        let ((), outer) = record_regions(|| {
            parallel_for(2, &|_| {});
            let ((), inner) = record_regions(|| parallel_for(2, &|_| {}));
            assert_eq!(inner.regions, 1);
        });
        assert_eq!(outer.regions, 1, "{outer:?}");
    }
}
