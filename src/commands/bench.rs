//! `encore bench`: throughput and latency on random token ids.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use codegen::kernels::int8::{record_unit_cycles, UnitCycles};
use codegen::kernels::pool::{record_regions, RegionStats};
use runtime::{CompileOptions, Model, NodeTime, Session, TensorValue};
use std::collections::BTreeMap;

use crate::error::CliError;

#[derive(Args, Clone)]
pub struct BenchArgs {
    /// The ONNX model.
    #[arg(long)]
    pub model: PathBuf,
    /// Sequences per run.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 128)]
    pub seq: usize,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Untimed runs before measuring.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Measure for at least this many seconds…
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// …and at least this many runs.
    #[arg(long, default_value_t = 5)]
    pub min_runs: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Compile without the `fuse` pipeline (to see what epilogue fusion buys).
    #[arg(long)]
    pub no_fuse: bool,
    /// Compute every padded token (no `pack` pipeline), to see what padding-free execution buys.
    #[arg(long)]
    pub no_padding_free: bool,
    /// Run batches of more real tokens than about 1.5 times this as parts of about this many
    /// tokens (whole sequences; same results), where the model allows it; 0 runs every batch
    /// whole.
    #[arg(long, default_value_t = runtime::DEFAULT_BATCH_TOKENS)]
    pub batch_tokens: usize,
    /// Run the int8 GEMM loop nests interpreted instead of JIT-compiled, to see what the JIT
    /// buys (same results).
    #[arg(long)]
    pub no_jit: bool,
    /// Time batches of real lengths instead of full `--seq` ones: the token counts of the texts
    /// of this file (JSONL with a `text` field, or one text per line), tokenized with
    /// `--tokenizer` and truncated to `--seq`. `--distinct-batches` batches of `--batch` texts
    /// are drawn with a fixed seed, each padded to its longest text, and the runs cycle through
    /// them (ids random, as for full batches).
    #[arg(long, requires = "tokenizer")]
    pub lengths_from: Option<PathBuf>,
    /// The tokenizer that counts the tokens of `--lengths-from`.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// How many batches `--lengths-from` draws.
    #[arg(long, default_value_t = 16)]
    pub distinct_batches: usize,
    /// After the timed runs, profile `--min-runs` more: time per op kind and per op, and the
    /// standalone elementwise ops that fusion left inside the layers.
    #[arg(long)]
    pub profile: bool,
    /// Hand every run its outputs in new buffers (`Session::run`) instead of running into the
    /// previous run's (`Session::run_into`, as a server loop does, and as an OpenVINO infer
    /// request writes into the output tensors it keeps): shows what the fresh pages cost.
    #[arg(long)]
    pub fresh_outputs: bool,
}

/// What one benchmark measured.
pub struct BenchResult {
    pub runs: usize,
    pub throughput_seq_per_s: f64,
    pub latencies_ms: Vec<f64>,
    pub compile_s: f64,
    /// With `--lengths-from`: the real length of each sequence of each distinct batch.
    pub lengths: Option<Vec<Vec<usize>>>,
    /// With `--profile`.
    pub profile: Option<Profile>,
    /// JIT-compiled units the program calls, Cranelift's time for them, and why there are none
    /// when JIT was asked for and unavailable.
    pub jit: (usize, f64, Option<String>),
}

impl BenchResult {
    pub fn percentile(&self, p: f64) -> f64 {
        let mut v = self.latencies_ms.clone();
        v.sort_by(f64::total_cmp);
        let idx = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
        v[idx.min(v.len() - 1)]
    }
}

pub fn run(args: BenchArgs) -> Result<(), CliError> {
    let model = Model::load(&args.model)?;
    let r = measure(&model, &args)?;
    if args.json {
        let mut obj = serde_json::json!({
            "model": args.model.display().to_string(),
            "precision": if model.is_quantized() { "int8" } else { "fp32" },
            "batch": args.batch,
            "seq": args.seq,
            "threads": args.threads,
            "runs": r.runs,
            "compile_s": r.compile_s,
            "throughput_seq_per_s": r.throughput_seq_per_s,
            "latency_ms_mean": r.latencies_ms.iter().sum::<f64>() / r.runs as f64,
            "latency_ms_p50": r.percentile(50.0),
            "latency_ms_p90": r.percentile(90.0),
            "latency_ms_p99": r.percentile(99.0),
            "padding_free": !args.no_padding_free,
            "batch_tokens": args.batch_tokens,
            "jit_units": r.jit.0,
            "jit_compile_ms": r.jit.1,
            "jit_unavailable": r.jit.2,
            "outputs": if args.fresh_outputs { "fresh" } else { "reused" },
        });
        if let Some(l) = &r.lengths {
            obj["lengths"] = serde_json::json!(l);
        }
        if let Some(p) = &r.profile {
            obj["profile"] = p.to_json();
        }
        println!("{obj}");
    } else {
        print_result(&args, model.is_quantized(), &r);
        if let Some(p) = &r.profile {
            p.print();
        }
    }
    Ok(())
}

/// Where the time of a run goes, from profiled runs.
pub struct Profile {
    pub runs: usize,
    /// Mean milliseconds per run of all profiled nodes.
    pub total_ms: f64,
    /// Per op kind: nodes per run and mean milliseconds per run.
    pub kinds: Vec<(&'static str, usize, f64)>,
    /// Per op name: its kind, nodes per run and mean milliseconds per run, slowest first.
    pub ops: Vec<(&'static str, &'static str, usize, f64)>,
    /// Transformer layers (attention ops) per run.
    pub layers: usize,
    /// Standalone elementwise nodes executed between the first and the last GEMM or
    /// attention of a run (inside the layers), with their op names.
    pub elementwise_in_layers: Vec<(String, &'static str)>,
    /// Multiply-accumulates of the weight GEMMs per run, and their nodes' milliseconds per run.
    pub gemm_macs: f64,
    pub gemm_ms: f64,
    /// The weight GEMMs grouped by role (node name with its numbers as `N`, so the same
    /// projection of every layer falls in one group): nodes per run, milliseconds and MACs per
    /// run, in order of first appearance.
    pub gemm_groups: Vec<GemmGroup>,
    /// The compute peak the GEMMs are rated against (ops/s) and which unit it is.
    pub peak: Option<(f64, &'static str)>,
    /// The `vpdpbusd` peak (ops/s) when `peak` is the AMX tile unit's: the runtime issue's
    /// roofline is the GEMM MACs at this peak on every CPU, so an AMX run is rated against both.
    pub vnni_peak: Option<f64>,
    /// The parallel regions of the profiled runs, summed over them (none recorded on one
    /// thread).
    pub regions: RegionStats,
    /// Per op name, milliseconds per run its nodes' calling thread worked alone (outside the
    /// parallel regions they dispatched), most first; empty when not recorded.
    pub alone_ops: Vec<(&'static str, f64)>,
    /// Mean milliseconds per run of the profiled runs' wall time, when measured: what exceeds
    /// `total_ms` ran outside the nodes (inputs bound, a batch's parts split and assembled).
    pub wall_ms: Option<f64>,
}

/// The weight GEMMs of one role (see [`Profile::gemm_groups`]).
pub struct GemmGroup {
    pub role: String,
    /// Nodes per run.
    pub nodes: usize,
    /// Milliseconds and multiply-accumulates per run.
    pub ms: f64,
    pub macs: f64,
    /// The int8 units' ticks of the group's nodes, summed over the runs, where recorded (see
    /// `codegen::kernels::int8::record_unit_cycles`).
    pub cycles: Option<UnitCycles>,
}

/// [`Profile::gemm_groups`]: the weight GEMM nodes of `runs` grouped by role.
fn gemm_groups(runs: &[Vec<NodeTime>]) -> Vec<GemmGroup> {
    let n = runs.len().max(1) as f64;
    let role = |node: &str| {
        let mut r = String::with_capacity(node.len());
        let mut in_number = false;
        for c in node.chars() {
            if !c.is_ascii_digit() {
                r.push(c);
            } else if !in_number {
                r.push('N');
            }
            in_number = c.is_ascii_digit();
        }
        r
    };
    let mut groups: Vec<GemmGroup> = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        for t in run.iter().filter(|t| t.macs > 0) {
            let r = role(&t.node);
            let at = match groups.iter().position(|g| g.role == r) {
                Some(at) => at,
                None => {
                    groups.push(GemmGroup {
                        role: r,
                        nodes: 0,
                        ms: 0.0,
                        macs: 0.0,
                        cycles: None,
                    });
                    groups.len() - 1
                }
            };
            let g = &mut groups[at];
            if i == 0 {
                g.nodes += 1;
            }
            g.ms += t.time.as_secs_f64() * 1e3 / n;
            g.macs += t.macs as f64 / n;
            if let Some(c) = t.gemm_cycles {
                *g.cycles.get_or_insert_with(UnitCycles::default) += c;
            }
        }
    }
    groups
}

/// The peak of the unit a model's GEMMs run on (measured now, `threads` threads): the AMX tile
/// unit or `vpdpbusd` for an INT8 model (whichever the int8 kernel picker uses), FMA for FP32;
/// and, when that unit is AMX, the `vpdpbusd` peak measured with it.
fn gemm_peak(quantized: bool, threads: usize) -> (f64, &'static str, Option<f64>) {
    use codegen::kernels::{measure_peak, pick_int8, Int8Kernel};
    let p = measure_peak(threads);
    if !quantized {
        return (p.fma_flops_per_s, "FMA", None);
    }
    // What the weights were packed for (`PackedI8::pack` picks for a large M).
    match pick_int8(usize::MAX, 768, 768) {
        Int8Kernel::Amx => (
            p.int8_ops_per_s(Int8Kernel::Amx),
            "AMX tdpbusd",
            Some(p.vnni_ops_per_s),
        ),
        // AVX2 without VNNI: the `vpmaddwd` loop (see `measure_peak`).
        Int8Kernel::Avx2 => (p.vnni_ops_per_s, "vpmaddwd", None),
        kernel => (p.int8_ops_per_s(kernel), "vpdpbusd", None),
    }
}

impl Profile {
    /// Aggregates the node times of `runs` runs (each in execution order).
    pub fn from_runs(runs: &[Vec<NodeTime>]) -> Profile {
        let n = runs.len().max(1) as f64;
        let mut kinds: BTreeMap<&'static str, (usize, f64)> = BTreeMap::new();
        let mut ops: BTreeMap<&'static str, (&'static str, usize, f64)> = BTreeMap::new();
        let mut total_ms = 0.0;
        for run in runs {
            for t in run {
                let ms = t.time.as_secs_f64() * 1e3;
                total_ms += ms / n;
                let k = kinds.entry(t.kind.name()).or_default();
                k.0 += 1;
                k.1 += ms / n;
                let o = ops.entry(t.op).or_insert((t.kind.name(), 0, 0.0));
                o.1 += 1;
                o.2 += ms / n;
            }
        }
        let per_run = |c: usize| c / runs.len().max(1);
        let first = runs.first().map(|r| &r[..]).unwrap_or(&[]);
        let heavy = |t: &NodeTime| matches!(t.kind, ir::OpKind::Gemm | ir::OpKind::Attention);
        let span = match (first.iter().position(heavy), first.iter().rposition(heavy)) {
            (Some(a), Some(b)) => &first[a..=b],
            _ => &[],
        };
        let mut ops: Vec<_> = ops
            .into_iter()
            .map(|(op, (kind, c, ms))| (op, kind, per_run(c), ms))
            .collect();
        ops.sort_by(|a, b| b.3.total_cmp(&a.3));
        let mut alone: BTreeMap<&'static str, f64> = BTreeMap::new();
        for t in runs.iter().flatten() {
            if let Some(a) = t.alone {
                *alone.entry(t.op).or_default() += a.as_secs_f64() * 1e3 / n;
            }
        }
        let mut alone_ops: Vec<_> = alone.into_iter().collect();
        alone_ops.sort_by(|a, b| b.1.total_cmp(&a.1));
        Profile {
            runs: runs.len(),
            total_ms,
            kinds: kinds
                .into_iter()
                .map(|(k, (c, ms))| (k, per_run(c), ms))
                .collect(),
            ops,
            layers: first
                .iter()
                .filter(|t| t.kind == ir::OpKind::Attention)
                .count(),
            elementwise_in_layers: span
                .iter()
                .filter(|t| t.kind == ir::OpKind::Elementwise)
                .map(|t| (t.node.clone(), t.op))
                .collect(),
            gemm_macs: runs.iter().flatten().map(|t| t.macs as f64).sum::<f64>() / n,
            gemm_ms: runs
                .iter()
                .flatten()
                .filter(|t| t.macs > 0)
                .map(|t| t.time.as_secs_f64() * 1e3)
                .sum::<f64>()
                / n,
            gemm_groups: gemm_groups(runs),
            peak: None,
            vnni_peak: None,
            regions: RegionStats::default(),
            alone_ops,
            wall_ms: None,
        }
    }

    /// Milliseconds per run outside the nodes (the profiled runs' wall time less the nodes'),
    /// when the wall time was measured.
    pub fn outside_ms(&self) -> Option<f64> {
        self.wall_ms.map(|w| (w - self.total_ms).max(0.0))
    }

    /// Milliseconds per run the calling thread worked alone in the ops.
    pub fn alone_ms(&self) -> f64 {
        self.alone_ops.iter().map(|a| a.1).sum()
    }

    /// The calling thread alone, per run: in the ops (by op, most first) and outside them;
    /// `None` when nothing was recorded.
    fn alone_line(&self) -> Option<String> {
        if self.alone_ops.is_empty() || self.regions.regions == 0 {
            return None;
        }
        let in_ops = self.alone_ms();
        let top: Vec<String> = self
            .alone_ops
            .iter()
            .take(5)
            .map(|(op, ms)| format!("{op} {ms:.2}"))
            .collect();
        let outside = self.outside_ms().map_or(String::new(), |o| {
            format!(", {o:.2} ms outside the ops (inputs bound, batch parts split and assembled)")
        });
        Some(format!(
            "  alone         the calling thread working without the others: {in_ops:.2} ms per run in the ops ({}){outside}",
            top.join(", ")
        ))
    }

    /// GEMM ops per second over the GEMM nodes' time and over all nodes' time.
    pub fn gemm_rates(&self) -> (f64, f64) {
        let ops = 2.0 * self.gemm_macs;
        let rate = |ms: f64| if ms > 0.0 { ops / (ms / 1e3) } else { 0.0 };
        (rate(self.gemm_ms), rate(self.total_ms))
    }

    /// Standalone elementwise ops per layer (`None` when the model has no attention op).
    pub fn elementwise_per_layer(&self) -> Option<f64> {
        (self.layers > 0).then(|| self.elementwise_in_layers.len() as f64 / self.layers as f64)
    }

    fn print(&self) {
        println!(
            "  profile       {} runs, {:.2} ms of nodes per run",
            self.runs, self.total_ms
        );
        for (k, c, ms) in &self.kinds {
            println!(
                "    {k:<12} {c:>5} nodes  {ms:>9.2} ms  {:>5.1} %",
                100.0 * ms / self.total_ms.max(1e-9)
            );
        }
        if let Some(line) = self.regions_line() {
            println!("{line}");
        }
        if let Some(line) = self.alone_line() {
            println!("{line}");
        }
        println!("  slowest ops");
        for (op, kind, c, ms) in self.ops.iter().take(8) {
            println!("    {op:<24} {kind:<12} {c:>5} nodes  {ms:>9.2} ms");
        }
        match self.elementwise_per_layer() {
            Some(v) => println!(
                "  standalone elementwise ops per layer: {v:.2} ({} in {} layers)",
                self.elementwise_in_layers.len(),
                self.layers
            ),
            None => println!(
                "  standalone elementwise ops between the first and last GEMM: {} (no attention op, layers unknown)",
                self.elementwise_in_layers.len()
            ),
        }
        for (node, op) in self.elementwise_in_layers.iter().take(10) {
            println!("    {op} {node}");
        }
        if self.gemm_macs > 0.0 {
            let (in_gemm, whole) = self.gemm_rates();
            let frac = |r: f64| match self.peak {
                Some((p, _)) if p > 0.0 => format!(" ({:.1} %)", 100.0 * r / p),
                _ => String::new(),
            };
            println!(
                "  roofline      {:.2} GMAC of weight GEMMs per run: {:.1} GOPS over their nodes' time{}, {:.1} GOPS over the whole run{}",
                self.gemm_macs / 1e9,
                in_gemm / 1e9,
                frac(in_gemm),
                whole / 1e9,
                frac(whole)
            );
            if let Some((p, unit)) = self.peak {
                println!(
                    "                of the {unit} peak, the higher of two measurements around the profiled runs: {:.1} GOPS",
                    p / 1e9
                );
            }
            if let Some(v) = self.vnni_peak.filter(|&v| v > 0.0) {
                println!(
                    "                {:.1} % of the vpdpbusd peak ({:.1} GOPS) over the whole run: the runtime issue's roofline, GEMM MACs at that peak",
                    100.0 * whole / v,
                    v / 1e9
                );
            }
            // The epilogues' share of all int8 units' time: some only where one was measured.
            let all_epilogue = self.unit_cycles().and_then(|c| c.epilogue_share());
            println!(
                "  weight GEMMs by role{}",
                if all_epilogue.is_some() {
                    " (epilogue: its share of the int8 units' time, the rest in the microkernel)"
                } else {
                    ""
                }
            );
            for g in &self.gemm_groups {
                let rate = if g.ms > 0.0 {
                    2.0 * g.macs / (g.ms / 1e3)
                } else {
                    0.0
                };
                let epilogue = g
                    .cycles
                    .and_then(|c| c.epilogue_share())
                    .map_or(String::new(), |e| {
                        format!("  epilogue {:>4.1} %", 100.0 * e)
                    });
                println!(
                    "    {:>3} x {:<48} {:>9.2} ms  {:>7.1} GOPS{}{epilogue}",
                    g.nodes,
                    g.role,
                    g.ms,
                    rate / 1e9,
                    frac(rate)
                );
            }
            if let Some(e) = all_epilogue {
                println!(
                    "    all int8 GEMM units: microkernel {:.1} %, epilogue {:.1} % of their time",
                    100.0 * (1.0 - e),
                    100.0 * e
                );
            }
        }
    }

    /// The hand-offs between threads per run: regions, the calling thread alone between them,
    /// parts ending apart; `None` without regions (one thread).
    fn regions_line(&self) -> Option<String> {
        let r = &self.regions;
        if r.regions == 0 || self.runs == 0 {
            return None;
        }
        let runs = self.runs as f64;
        let per_run_ms = |d: std::time::Duration| d.as_secs_f64() * 1e3 / runs;
        let share = |ms: f64| 100.0 * ms / self.total_ms.max(1e-9);
        let regions = r.regions as f64 / runs;
        let (between, spread) = (per_run_ms(r.between), per_run_ms(r.spread));
        Some(format!(
            "  threads       {regions:.1} parallel regions per run, {:.1} us each; the calling thread alone between them {:.2} ms per run ({:.1} %, {:.1} us a gap); their parts ending apart {spread:.2} ms ({:.1} %)",
            1e3 * per_run_ms(r.inside) / regions,
            between,
            share(between),
            1e3 * between / (regions - 1.0).max(1.0),
            share(spread),
        ))
    }

    /// The int8 units' ticks of every weight GEMM, where recorded.
    fn unit_cycles(&self) -> Option<UnitCycles> {
        let mut all: Option<UnitCycles> = None;
        for c in self.gemm_groups.iter().filter_map(|g| g.cycles) {
            *all.get_or_insert_with(UnitCycles::default) += c;
        }
        all
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "runs": self.runs,
            "total_ms": self.total_ms,
            "kinds": self.kinds.iter().map(|(k, c, ms)| serde_json::json!({"kind": k, "nodes": c, "ms": ms})).collect::<Vec<_>>(),
            "ops": self.ops.iter().map(|(op, k, c, ms)| serde_json::json!({"op": op, "kind": k, "nodes": c, "ms": ms})).collect::<Vec<_>>(),
            "layers": self.layers,
            "elementwise_per_layer": self.elementwise_per_layer(),
            "elementwise_in_layers": self.elementwise_in_layers.iter().map(|(n, op)| serde_json::json!({"node": n, "op": op})).collect::<Vec<_>>(),
            "gemm_macs_per_run": self.gemm_macs,
            "gemm_groups": self.gemm_groups.iter().map(|g| serde_json::json!({"role": g.role, "nodes": g.nodes, "ms": g.ms, "macs": g.macs, "epilogue_share": g.cycles.and_then(|c| c.epilogue_share())})).collect::<Vec<_>>(),
            "gemm_ms_per_run": self.gemm_ms,
            "gemm_epilogue_share": self.unit_cycles().and_then(|c| c.epilogue_share()),
            "gemm_ops_per_s": self.gemm_rates().0,
            "run_gemm_ops_per_s": self.gemm_rates().1,
            "peak_ops_per_s": self.peak.map(|p| p.0),
            "peak_unit": self.peak.map(|p| p.1),
            "vnni_peak_ops_per_s": self.vnni_peak,
            "regions_per_run": self.regions.regions as f64 / self.runs.max(1) as f64,
            "region_ms_per_run": self.regions.inside.as_secs_f64() * 1e3 / self.runs.max(1) as f64,
            "between_regions_ms_per_run": self.regions.between.as_secs_f64() * 1e3 / self.runs.max(1) as f64,
            "region_spread_ms_per_run": self.regions.spread.as_secs_f64() * 1e3 / self.runs.max(1) as f64,
            "alone_ms_per_run": self.alone_ms(),
            "alone_by_op": self.alone_ops.iter().map(|(op, ms)| serde_json::json!({"op": op, "ms": ms})).collect::<Vec<_>>(),
            "wall_ms_per_run": self.wall_ms,
            "outside_ops_ms_per_run": self.outside_ms(),
        })
    }
}

pub fn print_result(args: &BenchArgs, quantized: bool, r: &BenchResult) {
    println!(
        "{}: batch {} × seq {}, {} threads, {}",
        args.model.display(),
        args.batch,
        args.seq,
        args.threads,
        if quantized { "int8" } else { "fp32" }
    );
    if let Some(l) = &r.lengths {
        let real: usize = l.iter().flatten().sum();
        let padded: usize = l
            .iter()
            .map(|b| b.len() * b.iter().copied().max().unwrap_or(0))
            .sum();
        println!(
            "  lengths       {} batches of real lengths: {:.1} real tokens per sequence, {:.1} padded ({:.0} % padding){}",
            l.len(),
            real as f64 / (l.len() * args.batch) as f64,
            padded as f64 / (l.len() * args.batch) as f64,
            100.0 * (1.0 - real as f64 / padded.max(1) as f64),
            if args.no_padding_free { ", all computed" } else { ", padding not computed" }
        );
    }
    println!("  compile       {:.2} s", r.compile_s);
    match &r.jit.2 {
        Some(why) => println!("  jit           none: {why}"),
        None if r.jit.0 > 0 => println!(
            "  jit           {} loop nests compiled in {:.1} ms",
            r.jit.0, r.jit.1
        ),
        None => {}
    }
    println!(
        "  outputs       {}",
        if args.fresh_outputs {
            "new buffers every run (--fresh-outputs)"
        } else {
            "into the run before's (Session::run_into)"
        }
    );
    println!("  runs          {}", r.runs);
    println!("  throughput    {:.2} sequences/s", r.throughput_seq_per_s);
    println!(
        "  latency (ms)  p50 {:.2}  p90 {:.2}  p99 {:.2}",
        r.percentile(50.0),
        r.percentile(90.0),
        r.percentile(99.0)
    );
}

/// Compiles `model` and times runs on random ids with a full attention mask.
pub fn measure(model: &Model, args: &BenchArgs) -> Result<BenchResult, CliError> {
    if args.batch == 0 || args.seq == 0 {
        return Err(CliError::usage("--batch/--seq", "must be at least 1"));
    }
    let t0 = Instant::now();
    let session = Session::new(
        model,
        CompileOptions {
            threads: args.threads.max(1),
            max_batch: None,
            optimize: true,
            fuse: !args.no_fuse,
            padding_free: !args.no_padding_free,
            jit: !args.no_jit && CompileOptions::default().jit,
            kernel: None,
            batch_tokens: (args.batch_tokens > 0).then_some(args.batch_tokens),
        },
    )?;
    let compile_s = t0.elapsed().as_secs_f64();
    let (units, jit_time) = session.program().jit_units();
    let jit = (
        units,
        jit_time.as_secs_f64() * 1e3,
        session.program().jit_unavailable.clone(),
    );
    let (lengths, batches) = match &args.lengths_from {
        None => (None, vec![random_feeds(&session, args.batch, args.seq)?]),
        Some(texts) => {
            let lengths = real_length_batches(args, texts)?;
            let mut ids = RandomIds::new();
            let batches = lengths
                .iter()
                .map(|l| feeds_of_lengths(&session, l, &mut ids))
                .collect::<Result<Vec<_>, _>>()?;
            (Some(lengths), batches)
        }
    };
    let refs: Vec<Vec<(&str, TensorValue)>> = batches
        .iter()
        .map(|f| f.iter().map(|(n, t)| (n.as_str(), t.clone())).collect())
        .collect();
    // Every run goes into one output vector, whose outputs land in the buffers of the run
    // before; `--fresh-outputs` drops them first, so that each run makes new ones.
    let mut kept = Vec::new();
    let fresh = args.fresh_outputs;
    fn outputs_for_run(kept: &mut runtime::Outputs, fresh: bool) -> &mut runtime::Outputs {
        if fresh {
            kept.clear();
        }
        kept
    }
    for _ in 0..args.warmup {
        for r in &refs {
            session.run_into(r, outputs_for_run(&mut kept, fresh))?;
        }
    }
    let budget = Duration::from_secs_f64(args.seconds.max(0.0));
    let mut latencies_ms = Vec::new();
    let start = Instant::now();
    // Whole cycles through the distinct batches, so that each weighs the same.
    while latencies_ms.len() < args.min_runs.max(1)
        || start.elapsed() < budget
        || !latencies_ms.len().is_multiple_of(refs.len())
    {
        let t = Instant::now();
        session.run_into(
            &refs[latencies_ms.len() % refs.len()],
            outputs_for_run(&mut kept, fresh),
        )?;
        latencies_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let total_s = latencies_ms.iter().sum::<f64>() / 1e3;
    let profile = if args.profile {
        // The peak before and after the profiled runs, the higher kept: nothing outruns it, so
        // each is a lower bound, and on a busy 2-vCPU guest one short measurement came out at
        // half the other (469 against 930 GOPS), which would double every fraction printed.
        let peak_before = gemm_peak(model.is_quantized(), args.threads.max(1));
        // Each run's parallel regions recorded on this thread, which dispatches them all.
        let mut regions = RegionStats::default();
        let mut wall = Duration::ZERO;
        let runs = (0..args.min_runs.max(1))
            .map(|i| {
                let t = Instant::now();
                let feeds = &refs[i % refs.len()];
                let (run, r) = record_unit_cycles(|| {
                    record_regions(|| {
                        session.run_profiled_into(feeds, outputs_for_run(&mut kept, fresh))
                    })
                });
                wall += t.elapsed();
                regions += r;
                run
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut p = Profile::from_runs(&runs);
        p.regions = regions;
        p.wall_ms = Some(wall.as_secs_f64() * 1e3 / runs.len().max(1) as f64);
        let peak_after = gemm_peak(model.is_quantized(), args.threads.max(1));
        let higher = if peak_after.0 > peak_before.0 {
            peak_after
        } else {
            peak_before
        };
        p.peak = Some((higher.0, higher.1));
        p.vnni_peak = match (peak_before.2, peak_after.2) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        Some(p)
    } else {
        None
    };
    Ok(BenchResult {
        runs: latencies_ms.len(),
        throughput_seq_per_s: (latencies_ms.len() * args.batch) as f64 / total_s,
        latencies_ms,
        compile_s,
        lengths,
        profile,
        jit,
    })
}

/// `--distinct-batches` batches of `--batch` real lengths: the token counts (truncated to
/// `--seq`) of texts of `path` drawn with a fixed seed.
fn real_length_batches(
    args: &BenchArgs,
    path: &std::path::Path,
) -> Result<Vec<Vec<usize>>, CliError> {
    use runtime::text::{Padding, Tokenizer, TokenizerOptions};
    let tokenizer_path = args
        .tokenizer
        .as_ref()
        .ok_or_else(|| CliError::usage("--tokenizer", "needed with --lengths-from"))?;
    if args.distinct_batches == 0 {
        return Err(CliError::usage("--distinct-batches", "must be at least 1"));
    }
    let tokenizer = Tokenizer::from_file(
        tokenizer_path,
        TokenizerOptions {
            max_length: Some(args.seq),
            padding: Padding::Longest,
        },
    )?;
    let texts = super::texts::read_all(path)?;
    let mut counts = Vec::with_capacity(texts.len());
    for chunk in texts.chunks(256) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let mask = tokenizer.encode(&refs)?.attention_mask;
        let width = mask.shape()[1];
        let m = mask.to_i64_vec()?;
        counts.extend(
            m.chunks(width.max(1))
                .map(|r| r.iter().filter(|&&x| x != 0).count()),
        );
    }
    // A fixed 64-bit LCG: the same draws on every machine.
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let mut draw = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as usize % counts.len()
    };
    Ok((0..args.distinct_batches)
        .map(|_| (0..args.batch).map(|_| counts[draw()]).collect())
        .collect())
}

/// One batch of the given real lengths, padded to the longest: random ids at the real tokens,
/// the mask, token type 0.
fn feeds_of_lengths(
    session: &Session,
    lengths: &[usize],
    ids: &mut RandomIds,
) -> Result<Vec<(String, TensorValue)>, CliError> {
    let seq = lengths.iter().copied().max().unwrap_or(0).max(1);
    let mut feeds = random_feeds_from(session, lengths.len(), seq, ids)?;
    let real = |i: usize| i % seq < lengths[i / seq];
    for (name, t) in feeds.iter_mut() {
        let values = t.to_i64_vec()?;
        let values: Vec<i64> = match name.as_str() {
            "attention_mask" => (0..values.len()).map(|i| i64::from(real(i))).collect(),
            "input_ids" => (0..values.len())
                .map(|i| if real(i) { values[i] } else { 0 })
                .collect(),
            _ => values,
        };
        *t = TensorValue::from_i64(vec![lengths.len(), seq], values)?;
    }
    Ok(feeds)
}

/// A xorshift stream of token ids: the same inputs on every machine and every run.
pub(crate) struct RandomIds(u64);

impl RandomIds {
    pub(crate) fn new() -> RandomIds {
        RandomIds(0x9E37_79B9_7F4A_7C15)
    }

    /// An id in `[5, vocab)` (ids below 5 are the special tokens of the usual vocabularies).
    fn next_id(&mut self, vocab: usize) -> i64 {
        let s = &mut self.0;
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        5 + (*s % (vocab.saturating_sub(5).max(1) as u64)) as i64
    }
}

/// Token ids drawn from the model's vocabulary (found from the embedding table that `input_ids`
/// indexes), a full mask, and token type 0.
fn random_feeds(
    session: &Session,
    batch: usize,
    seq: usize,
) -> Result<Vec<(String, TensorValue)>, CliError> {
    random_feeds_from(session, batch, seq, &mut RandomIds::new())
}

/// [`random_feeds`] continuing the stream `ids` (for several batches of different ids).
pub(crate) fn random_feeds_from(
    session: &Session,
    batch: usize,
    seq: usize,
    ids: &mut RandomIds,
) -> Result<Vec<(String, TensorValue)>, CliError> {
    // The ids must be valid rows of the model's own embedding table: no guessed vocabulary.
    let vocab = || {
        session.lookup_rows("input_ids").ok_or_else(|| {
            CliError::usage(
                "--model",
                "cannot tell the vocabulary size: input_ids does not index a constant embedding table",
            )
        })
    };
    let mut feeds = Vec::new();
    for input in session.inputs() {
        let n = batch * seq;
        let values: Vec<i64> = match input.name.as_str() {
            "input_ids" => {
                let vocab = vocab()?;
                (0..n).map(|_| ids.next_id(vocab)).collect()
            }
            "attention_mask" => vec![1; n],
            "token_type_ids" | "position_ids" => vec![0; n],
            other => {
                return Err(CliError::usage(
                    "--model",
                    format!("random inputs fill input_ids, attention_mask and token_type_ids, not `{other}`"),
                ))
            }
        };
        feeds.push((input.name, TensorValue::from_i64(vec![batch, seq], values)?));
    }
    Ok(feeds)
}
