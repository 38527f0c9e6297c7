//! Timing: a region timer per device kind, warm-up, repetitions until a time budget, and the
//! statistics every row reports (median and spread).
//!
//! Method (`perf-anchors.md` §9): warm up, then time many repetitions one by one and report
//! the median with p10–p90 and min–max; the caller rotates among several input sets (the
//! closure gets the repetition index) so that caches do not flatter the result.
//!
//! The timer is per device kind ([`RegionTimer`], [`WallTimer`] and [`Clock`] are the
//! library's, in `polyattn::probe`): the CPU uses the monotonic wall clock around a call that
//! returns when its work is done. GPU backends add their device timer in [`timer_for`] —
//! CUDA events recorded on the stream around the region, Vulkan / wgpu timestamp queries —
//! until then a GPU device is timed by the wall clock between two synchronisations, which
//! includes launch and synchronisation latency. `POLYATTN_BENCH_TRACE=1` prints every timed
//! repetition (device-timed region, host time of the call) to stderr.
//!
//! The loop's own decisions (how long the warm-up lasted, whether the budget or the cap is
//! spent) read a [`Clock`] it is handed: [`measure`] uses the host's monotonic clock, and the
//! unit tests hand [`measure_with`] a clock that advances only when the code under test says
//! so, so that no test depends on how fast the machine is.

use std::time::Duration;

use polyattn::device::Device;
use polyattn::error::Result;
use polyattn::probe::{Clock, MonotonicClock, RegionTimer, WallTimer};

/// The best timer `device` has.
///
/// Hook for GPU backends: return an event timer here (`Device::Cuda(d) =>` CUDA events on the
/// stream the kernels run on; `Device::Wgpu(d) =>` timestamp queries when the adapter has
/// `TIMESTAMP_QUERY`), keeping the wall clock as the fallback. A device timer should enqueue
/// some device work before its start mark in [`RegionTimer::start`] (triton's `do_bench` and
/// `benches/reference_sdpa.py` zero 256 MB): it evicts L2, and it keeps the device busy while
/// the host enqueues the timed call, so that a small kernel is not timed as host launch
/// latency (that inflated 16 µs H200 decodes to 50 µs before the reference script did it).
pub fn timer_for(device: &Device) -> Box<dyn RegionTimer> {
    match device {
        Device::Cpu(_) => Box::new(WallTimer::new(device)),
        Device::Wgpu(d) => polyattn::backends::wgpu::probes::timer(d),
        Device::Vulkan(d) => polyattn::backends::vulkan::probes::timer(d),
        Device::Cuda(d) => polyattn::backends::cuda::probes::timer(d),
        // No HIP event timer yet: the wall clock around a synchronised region.
        Device::Hip(d) => polyattn::backends::hip::probes::timer(d),
    }
}

/// How long and how often to run one row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TimingConfig {
    /// Warm-up calls before timing (at least one; a single call longer than the budget ends
    /// the warm-up early).
    pub warmup: usize,
    /// Warm-up lasts at least this long (more calls than `warmup` when needed; GPU rows: the
    /// clocks ramp up from idle).
    pub warmup_time: Duration,
    /// Timed repetitions at least.
    pub min_reps: usize,
    /// Timed repetitions at most.
    pub max_reps: usize,
    /// Keep repeating (past `min_reps`) until this much time was spent timing.
    pub budget: Duration,
    /// Slow rows: past [`MIN_REPS_FLOOR`] repetitions, stop once this much time was spent
    /// timing, even below `min_reps`.
    pub cap: Duration,
}

/// Timed repetitions no row goes below.
pub const MIN_REPS_FLOOR: usize = 3;

impl Default for TimingConfig {
    fn default() -> Self {
        TimingConfig {
            warmup: 3,
            warmup_time: Duration::ZERO,
            min_reps: 5,
            max_reps: 1000,
            budget: Duration::from_secs(1),
            cap: Duration::from_secs(20),
        }
    }
}

/// Runs `f` (given the repetition index, for input rotation) under `cfg` and returns the
/// timed samples in seconds: at least one warm-up call, then repetitions until `min_reps` and
/// the `budget` are both reached (or `max_reps`), cut short by the `cap` for slow rows. The
/// warm-up time, budget and cap are read on the host's monotonic clock.
pub fn measure<F>(timer: &mut dyn RegionTimer, cfg: &TimingConfig, f: F) -> Result<Samples>
where
    F: FnMut(usize) -> Result<()>,
{
    measure_with(timer, &MonotonicClock::new(), cfg, f)
}

/// [`measure`] with the warm-up time, budget and cap read on `clock`.
pub fn measure_with<F>(
    timer: &mut dyn RegionTimer,
    clock: &dyn Clock,
    cfg: &TimingConfig,
    mut f: F,
) -> Result<Samples>
where
    F: FnMut(usize) -> Result<()>,
{
    let since = |t: Duration| clock.now().saturating_sub(t);
    // The first call may compile pipelines or allocate (the WGPU coop prefill compiles for
    // ~20 s on the H200, its clocks dropping to idle meanwhile): it does not count toward
    // the warm-up, which starts after it. Timed from its start, such a call ended the
    // warm-up at once and the first timed repetitions ran at idle clocks (the coop form's
    // P2 f16 at 4k tokens: 8.9 TFLOP/s as a process's first row, 38.7 after a warm run).
    let first = clock.now();
    timer.start()?;
    f(0)?;
    timer.stop()?;
    let first = since(first);
    let mut i = 1;
    let mut calls = 1;
    // Rows without a warm-up time (CPU): a first call slower than the budget is warm-up
    // enough, as before.
    let mut done = cfg.warmup_time.is_zero() && (first > cfg.budget || calls >= cfg.warmup.max(1));
    let t0 = clock.now();
    while !done {
        // Each warm-up call is bracketed by the timer, which waits for the device: GPU
        // submissions return at once, so an unsynchronised loop would queue seconds of device
        // work per second of host time (a 27 ms WGPU prefill queued ~40 s in one "1 s" warm-up
        // on the H200) and the warm-up time would not be device time.
        timer.start()?;
        f(i)?;
        timer.stop()?;
        i += 1;
        calls += 1;
        let e = since(t0);
        // A row slower than the budget (and the warm-up time) stops warming up early.
        done = e > cfg.budget.max(cfg.warmup_time)
            || (calls >= cfg.warmup.max(1) && e >= cfg.warmup_time);
    }
    let mut secs = Vec::new();
    let start = clock.now();
    let min_reps = cfg.min_reps.max(1);
    let floor = min_reps.min(MIN_REPS_FLOOR);
    let trace = std::env::var_os("POLYATTN_BENCH_TRACE").is_some_and(|v| v != "0");
    while secs.len() < cfg.max_reps.max(min_reps)
        && (secs.len() < min_reps || since(start) < cfg.budget)
        && (secs.len() < floor || since(start) < cfg.cap)
    {
        timer.start()?;
        let call = clock.now();
        f(i)?;
        let call = since(call).as_secs_f64();
        let s = timer.stop()?;
        if trace {
            eprintln!(
                "[bench trace] rep {}: region {:.1} µs, host call {:.1} µs",
                secs.len(),
                s * 1e6,
                call * 1e6
            );
        }
        secs.push(s);
        i += 1;
    }
    Ok(Samples::new(secs))
}

/// Timed samples, in seconds, sorted.
#[derive(Clone, Debug, PartialEq)]
pub struct Samples {
    sorted: Vec<f64>,
}

impl Samples {
    /// From unsorted samples.
    pub fn new(mut secs: Vec<f64>) -> Self {
        secs.sort_by(f64::total_cmp);
        Samples { sorted: secs }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// True when there is no sample.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// The `q`-quantile (0..=1), linear between order statistics; 0 when empty.
    pub fn quantile(&self, q: f64) -> f64 {
        let n = self.sorted.len();
        if n == 0 {
            return 0.0;
        }
        let x = q.clamp(0.0, 1.0) * (n - 1) as f64;
        let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
        let w = x - lo as f64;
        self.sorted[lo] * (1.0 - w) + self.sorted[hi] * w
    }

    /// The median.
    pub fn median(&self) -> f64 {
        self.quantile(0.5)
    }

    /// The smallest sample.
    pub fn min(&self) -> f64 {
        self.sorted.first().copied().unwrap_or(0.0)
    }

    /// The largest sample.
    pub fn max(&self) -> f64 {
        self.sorted.last().copied().unwrap_or(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// A clock that moves only when a test advances it: the code under test "takes" exactly
    /// the time the test says, however loaded the machine is.
    #[derive(Clone, Default)]
    struct FakeClock(Rc<Cell<Duration>>);

    impl FakeClock {
        fn advance(&self, by: Duration) {
            self.0.set(self.0.get() + by);
        }
    }

    impl Clock for FakeClock {
        fn now(&self) -> Duration {
            self.0.get()
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A CPU wall timer that reads `clock`.
    fn timer(clock: &FakeClock) -> WallTimer {
        WallTimer::with_clock(&Device::cpu(), Box::new(clock.clone()))
    }

    fn assert_close(got: f64, want: f64) {
        assert!((got - want).abs() < 1e-12, "{got} s, expected {want} s");
    }

    #[test]
    fn quantiles_interpolate() {
        let s = Samples::new(vec![4.0, 1.0, 3.0, 2.0, 5.0]);
        assert_eq!(s.median(), 3.0);
        assert_eq!(s.min(), 1.0);
        assert_eq!(s.max(), 5.0);
        assert!((s.quantile(0.1) - 1.4).abs() < 1e-12);
        assert_eq!(Samples::new(vec![1.0, 2.0]).median(), 1.5);
        assert_eq!(Samples::new(vec![]).median(), 0.0);
    }

    #[test]
    fn warm_up_lasts_its_minimum_time() {
        let cfg = TimingConfig {
            warmup: 1,
            warmup_time: ms(30),
            min_reps: 1,
            max_reps: 1,
            budget: Duration::from_secs(10),
            cap: Duration::from_secs(10),
        };
        let clock = FakeClock::default();
        let mut calls = 0usize;
        let s = measure_with(&mut timer(&clock), &clock, &cfg, |_| {
            calls += 1;
            clock.advance(ms(5));
            Ok(())
        })
        .unwrap();
        assert_eq!(s.len(), 1);
        // The first call, 30 ms of 5 ms warm-up calls (6), then one timed call.
        assert_eq!(calls, 8);
        assert_eq!(clock.now(), ms(40));
        assert_close(s.median(), 0.005);
    }

    #[test]
    fn a_slow_first_call_does_not_end_the_warm_up() {
        let cfg = TimingConfig {
            warmup: 1,
            warmup_time: ms(30),
            min_reps: 1,
            max_reps: 1,
            budget: ms(20),
            cap: Duration::from_secs(10),
        };
        let clock = FakeClock::default();
        let mut calls = 0usize;
        let s = measure_with(&mut timer(&clock), &clock, &cfg, |i| {
            calls += 1;
            // The first call "compiles" for 100 ms, longer than budget and warm-up time.
            clock.advance(ms(if i == 0 { 100 } else { 5 }));
            Ok(())
        })
        .unwrap();
        assert_eq!(s.len(), 1);
        // The first call, 30 ms of 5 ms warm-up calls (6), one timed call.
        assert_eq!(calls, 8);
        assert_close(s.median(), 0.005);
    }

    #[test]
    fn rows_without_a_warm_up_time_stop_warming_up_after_a_slow_first_call() {
        let cfg = TimingConfig {
            warmup: 3,
            warmup_time: Duration::ZERO,
            min_reps: 2,
            max_reps: 2,
            budget: ms(20),
            cap: Duration::from_secs(10),
        };
        let clock = FakeClock::default();
        let mut calls = 0usize;
        let s = measure_with(&mut timer(&clock), &clock, &cfg, |_| {
            calls += 1;
            clock.advance(ms(50));
            Ok(())
        })
        .unwrap();
        // A first call over the budget is warm-up enough: it and the two timed calls.
        assert_eq!(calls, 3);
        assert_eq!(s.len(), 2);
        assert_close(s.median(), 0.05);
    }

    /// A device that runs its queue only when synchronised: each call queues 10 ms of work,
    /// `stop` waits for the queue (as the GPU timers do) and the clock moves by that much.
    struct QueueTimer {
        queued: Rc<Cell<u32>>,
        clock: FakeClock,
    }

    impl RegionTimer for QueueTimer {
        fn method(&self) -> &str {
            "test queue"
        }
        fn start(&mut self) -> Result<()> {
            Ok(())
        }
        fn stop(&mut self) -> Result<f64> {
            let n = self.queued.replace(0);
            self.clock.advance(ms(10) * n);
            Ok(0.01 * n as f64)
        }
    }

    #[test]
    fn warm_up_waits_for_the_device() {
        let cfg = TimingConfig {
            warmup: 1,
            warmup_time: ms(50),
            min_reps: 1,
            max_reps: 1,
            budget: Duration::from_secs(10),
            cap: Duration::from_secs(10),
        };
        let clock = FakeClock::default();
        let queued = Rc::new(Cell::new(0));
        let mut timer = QueueTimer {
            queued: queued.clone(),
            clock: clock.clone(),
        };
        let mut calls = 0usize;
        measure_with(&mut timer, &clock, &cfg, |_| {
            calls += 1;
            // Without a wait per call the queue never drains and the clock never moves.
            assert!(
                calls < 1000,
                "the warm-up queued work without waiting for the device"
            );
            queued.set(queued.get() + 1);
            Ok(())
        })
        .unwrap();
        // The first call, 50 ms of 10 ms device calls (5) and one timed.
        assert_eq!(calls, 7);
        assert_eq!(clock.now(), ms(70));
    }

    #[test]
    fn measure_warms_up_rotates_and_stops() {
        let cfg = TimingConfig {
            warmup: 2,
            warmup_time: Duration::ZERO,
            min_reps: 4,
            max_reps: 6,
            budget: Duration::from_secs(10),
            cap: Duration::from_secs(10),
        };
        let clock = FakeClock::default();
        let mut seen = Vec::new();
        let s = measure_with(&mut timer(&clock), &clock, &cfg, |i| {
            seen.push(i);
            Ok(())
        })
        .unwrap();
        // Calls that take no time: the budget is not reached, so max_reps bounds the loop.
        assert_eq!(s.len(), 6);
        assert_eq!(seen, (0..8).collect::<Vec<_>>());
        // A zero cap: slow rows stop at the floor of three repetitions.
        let cfg = TimingConfig {
            cap: Duration::ZERO,
            ..cfg
        };
        let s = measure_with(&mut timer(&clock), &clock, &cfg, |_| Ok(())).unwrap();
        assert_eq!(s.len(), MIN_REPS_FLOOR);
    }

    #[test]
    fn the_budget_and_the_cap_end_the_timed_loop() {
        let clock = FakeClock::default();
        let run = |cfg: &TimingConfig, step: Duration| {
            measure_with(&mut timer(&clock), &clock, cfg, |_| {
                clock.advance(step);
                Ok(())
            })
            .unwrap()
            .len()
        };
        let budget = TimingConfig {
            warmup: 1,
            warmup_time: Duration::ZERO,
            min_reps: 1,
            max_reps: 1000,
            budget: ms(10),
            cap: Duration::from_secs(10),
        };
        // 1 ms calls: repetitions until 10 ms were spent timing.
        assert_eq!(run(&budget, ms(1)), 10);
        // min_reps beyond the budget still run.
        assert_eq!(
            run(
                &TimingConfig {
                    min_reps: 25,
                    ..budget
                },
                ms(1)
            ),
            25
        );
        let capped = TimingConfig {
            min_reps: 100,
            cap: ms(50),
            ..budget
        };
        // Slow rows: past the floor, the cap ends the loop below min_reps.
        assert_eq!(run(&capped, ms(10)), 5);
        assert_eq!(run(&capped, ms(20)), MIN_REPS_FLOOR);
    }
}
