//! `mlp-train`: the MLP workload of the `mlp_train` library run three ways
//! (cudarc's `cuMemAllocAsync`, plain `cuMemAlloc`/`cuMemFree`, cachalot)
//! on GPU 0; prints a table, then one JSON line. Exits 0 when the three
//! ways' per-step losses are bit-identical, 1 when they differ, 2 when the
//! GPU or a library is unavailable or a call fails.
//!
//! ```text
//! mlp-train [--tiny] [--steps N] [--warmup N] [--ways cudarc,cudarc-retain,cuMemAlloc,cachalot,cachalot-expandable]
//! ```
//!
//! `cudarc` is cudarc's default (the driver pool gives its memory back at
//! every synchronization); `cudarc-retain` raises the pool's release
//! threshold so that it keeps it. `cachalot` uses the configuration from the environment
//! (`CACHALOT_ALLOC_CONF`, then PyTorch's variables); `cachalot-expandable`
//! adds `expandable_segments:True` to it.

use std::process::ExitCode;

use cachalot::AllocatorConfig;
use cachalot::cuda::CudaAllocator;
use mlp_train::{
    CachalotWay, Config, CudarcWay, Gpu, PlainWay, RunError, WayReport, batch_data,
    gpu_unavailable, json, losses_identical, peaks_by_step, run_way, spread, table, verdicts,
};

const USAGE: &str = "usage: mlp-train [--tiny] [--steps N] [--warmup N] [--ways cudarc,cudarc-retain,cuMemAlloc,cachalot,cachalot-expandable]";

/// The ways, in the default order.
const WAYS: [&str; 5] = [
    "cudarc",
    "cudarc-retain",
    "cuMemAlloc",
    "cachalot",
    "cachalot-expandable",
];

/// Most timed or warm-up steps accepted on the command line.
const MAX_STEPS: usize = 100_000;

struct Args {
    cfg: Config,
    ways: Vec<String>,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut cfg = Config::standard();
    let mut ways: Vec<String> = WAYS.iter().map(|w| w.to_string()).collect();
    let mut it = args.iter();
    let num = |v: Option<&String>, what: &str| -> Result<usize, String> {
        let v = v.ok_or_else(|| format!("{what} needs a value"))?;
        match v.parse::<usize>() {
            Ok(n) if n <= MAX_STEPS => Ok(n),
            _ => Err(format!(
                "{what}: '{v}' is not an integer in [0, {MAX_STEPS}]"
            )),
        }
    };
    let mut steps = None;
    let mut warmup = None;
    while let Some(a) = it.next() {
        match a.as_str() {
            "--tiny" => cfg = Config::tiny(),
            "--steps" => steps = Some(num(it.next(), "--steps")?),
            "--warmup" => warmup = Some(num(it.next(), "--warmup")?),
            "--ways" => {
                let v = it.next().ok_or("--ways needs a value")?;
                ways = v.split(',').map(str::to_string).collect();
                if let Some(bad) = ways.iter().find(|w| !WAYS.contains(&w.as_str())) {
                    return Err(format!("unknown way '{bad}'"));
                }
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument '{other}'\n{USAGE}")),
        }
    }
    if let Some(s) = steps {
        cfg.steps = s;
    }
    if let Some(w) = warmup {
        cfg.warmup = w;
    }
    cfg.validate().map_err(|e| e.to_string())?;
    Ok(Args { cfg, ways })
}

fn run(args: &Args) -> Result<Vec<WayReport>, RunError> {
    let gpu = Gpu::open()?;
    let cfg = &args.cfg;
    let data: Vec<_> = (0..cfg.total_steps()).map(|i| batch_data(cfg, i)).collect();
    let mut reports = Vec::new();
    for w in &args.ways {
        let r = match w.as_str() {
            "cudarc" => run_way(&gpu, &CudarcWay { retain: false }, cfg, &data)?,
            "cudarc-retain" => run_way(&gpu, &CudarcWay { retain: true }, cfg, &data)?,
            "cuMemAlloc" => run_way(&gpu, &PlainWay, cfg, &data)?,
            name => {
                let mut conf = AllocatorConfig::from_env().map_err(|e| RunError(e.to_string()))?;
                let name = if name == "cachalot" {
                    "cachalot"
                } else {
                    conf.apply("expandable_segments:True")
                        .map_err(|e| RunError(e.to_string()))?;
                    "cachalot-expandable"
                };
                let alloc = CudaAllocator::with_config(&gpu.ctx, conf)
                    .map_err(|e| RunError(format!("opening cachalot: {e}")))?;
                let way = CachalotWay {
                    alloc: alloc.clone(),
                    name,
                };
                let r = run_way(&gpu, &way, cfg, &data)?;
                if let Some(e) = alloc.take_error() {
                    return Err(RunError(format!("cachalot kept an error: {e}")));
                }
                r
            }
        };
        eprintln!(
            "{}: median step {:.3} ms, final loss {:?}",
            r.way,
            spread(&r.step_times).map_or(0.0, |s| s.median),
            r.losses.last()
        );
        reports.push(r);
    }
    Ok(reports)
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("mlp-train: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(why) = gpu_unavailable() {
        eprintln!("mlp-train: no GPU run possible: {why}");
        return ExitCode::from(2);
    }
    let reports = match run(&args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mlp-train: {e}");
            return ExitCode::from(2);
        }
    };
    let same = losses_identical(&reports);
    if let Some(r) = reports.first() {
        let l = &r.losses;
        println!(
            "losses: first {:?}, last {:?} over {} steps",
            l.first(),
            l.last(),
            l.len()
        );
    }
    print!("{}", table(&reports));
    print!("{}", peaks_by_step(&reports));
    for v in verdicts(&reports) {
        println!("{v}");
    }
    match &same {
        Ok(()) => println!("losses identical across {} ways: yes", reports.len()),
        Err(e) => println!("losses identical: NO ({e})"),
    }
    println!("{}", json(&args.cfg, &reports, same.is_ok()));
    if same.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments_are_checked() {
        let a = parse(&v(&["--tiny", "--steps", "3", "--ways", "cachalot"])).unwrap();
        assert_eq!(a.cfg.steps, 3);
        assert_eq!(a.cfg.widths, Config::tiny().widths);
        assert_eq!(a.ways, ["cachalot"]);
        assert_eq!(parse(&[]).unwrap().ways.len(), 5);
        for bad in [
            &["--steps"][..],
            &["--steps", "x"],
            &["--steps", "0"],
            &["--steps", "100001"],
            &["--ways", "cuda"],
            &["--frob"],
        ] {
            assert!(parse(&v(bad)).is_err(), "{bad:?}");
        }
    }
}
