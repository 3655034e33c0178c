//! Plots of a `bench/run.sh` run: `cargo run --release --example bench_plot -- RESULTS OUT_DIR`.
//!
//! RESULTS is the run's raw result file (one `key=value` line per load-generator run, as
//! `examples/loadgen.rs` prints it; `bench/run.sh` keeps it with `OUT=dir`). Writes
//! `bench-latency.svg` (p50 and p99 against the offered rate, one line per server) and
//! `bench-throughput.svg` (best closed-loop throughput per server, with its ratio to the
//! baseline).

use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// One line of the load generator's output.
struct Run {
    label: String,
    proto: String,
    mode: String,
    fields: BTreeMap<String, String>,
}

impl Run {
    fn parse(line: &str) -> Option<Run> {
        let fields: BTreeMap<String, String> = line
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if fields.get("phase").is_some_and(|p| p == "memory") {
            return None;
        }
        Some(Run {
            label: fields.get("label")?.clone(),
            proto: fields.get("proto")?.clone(),
            mode: fields.get("mode")?.clone(),
            fields,
        })
    }

    fn num(&self, key: &str) -> Option<f64> {
        self.fields
            .get(key)?
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite())
    }

    /// The offered rate of an open-loop run.
    fn rate(&self) -> Option<f64> {
        self.mode.strip_prefix("open@")?.parse().ok()
    }
}

const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn plot_latency(runs: &[Run], proto: &str, path: &Path) -> Result<(), String> {
    let open: Vec<&Run> = runs
        .iter()
        .filter(|r| r.proto == proto && r.rate().is_some())
        .collect();
    if open.is_empty() {
        return Err(format!("no fixed-rate runs for {proto}"));
    }
    let mut servers: Vec<&str> = open.iter().map(|r| r.label.as_str()).collect();
    servers.sort_unstable();
    servers.dedup();
    let x_max = open.iter().filter_map(|r| r.rate()).fold(0.0, f64::max) * 1.1;
    let y_max = open
        .iter()
        .filter_map(|r| r.num("p99_ms"))
        .fold(0.1, f64::max)
        * 2.0;
    let y_min = open
        .iter()
        .filter_map(|r| r.num("p50_ms"))
        .fold(f64::INFINITY, f64::min)
        .clamp(0.01, 1.0)
        / 2.0;
    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("latency at fixed rates ({proto}): p50 dashed, p99 solid; log scale"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..x_max, (y_min..y_max).log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("offered requests per second")
        .y_desc("ms")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, server) in servers.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points = |key: &str| -> Vec<(f64, f64)> {
            let mut p: Vec<(f64, f64)> = open
                .iter()
                .filter(|r| r.label == *server)
                .filter_map(|r| Some((r.rate()?, r.num(key)?.max(y_min))))
                .collect();
            p.sort_by(|a, b| a.0.total_cmp(&b.0));
            p
        };
        let p99 = points("p99_ms");
        let p50 = points("p50_ms");
        chart
            .draw_series(LineSeries::new(p99.clone(), colour.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(*server)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
        chart
            .draw_series(p99.iter().map(|&p| Circle::new(p, 3, colour.filled())))
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(DashedLineSeries::new(p50, 6, 4, colour.stroke_width(1)))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

fn plot_throughput(runs: &[Run], proto: &str, path: &Path) -> Result<(), String> {
    // Best of the rounds, per server, in the order of first appearance.
    let mut best: Vec<(String, f64)> = Vec::new();
    for r in runs
        .iter()
        .filter(|r| r.proto == proto && r.mode.starts_with("closed@"))
    {
        let Some(tp) = r.num("throughput") else {
            continue;
        };
        match best.iter_mut().find(|(l, _)| *l == r.label) {
            Some((_, b)) => *b = b.max(tp),
            None => best.push((r.label.clone(), tp)),
        }
    }
    if best.is_empty() {
        return Err(format!("no maximum-throughput runs for {proto}"));
    }
    let baseline = best
        .iter()
        .find(|(l, _)| l == "baseline")
        .map(|(_, tp)| *tp);
    let y_max = best.iter().map(|(_, tp)| *tp).fold(1.0, f64::max) * 1.2;
    let root = SVGBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("maximum throughput ({proto}), best round; ratio to the baseline"),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..best.len() as f64, 0f64..y_max)
        .map_err(|e| e.to_string())?;
    let names: Vec<String> = best.iter().map(|(l, _)| l.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(best.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - i as f64 - 0.5).abs() < 0.01 {
                names.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("answers per second")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (_, tp)) in best.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let x = i as f64;
        chart
            .draw_series([Rectangle::new(
                [(x + 0.15, 0.0), (x + 0.85, *tp)],
                colour.filled(),
            )])
            .map_err(|e| e.to_string())?;
        let ratio = baseline.map_or(String::new(), |b| format!(" ({:.2}×)", tp / b));
        chart
            .draw_series([Text::new(
                format!("{tp:.0}/s{ratio}"),
                (x + 0.2, tp + y_max * 0.02),
                ("sans-serif", 14),
            )])
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [results, out_dir] = args.as_slice() else {
        eprintln!("usage: bench_plot RESULTS OUT_DIR");
        std::process::exit(2);
    };
    let text = std::fs::read_to_string(results).unwrap_or_else(|e| {
        eprintln!("bench_plot: cannot read {results}: {e}");
        std::process::exit(1);
    });
    let runs: Vec<Run> = text.lines().filter_map(Run::parse).collect();
    let mut protos: Vec<&str> = runs.iter().map(|r| r.proto.as_str()).collect();
    protos.sort_unstable();
    protos.dedup();
    let mut failed = false;
    for proto in protos {
        // h2 is what kube-apiserver uses: its plots keep the plain names.
        let suffix = if proto == "h2" {
            String::new()
        } else {
            format!("-{proto}")
        };
        let latency = Path::new(out_dir).join(format!("bench-latency{suffix}.svg"));
        let throughput = Path::new(out_dir).join(format!("bench-throughput{suffix}.svg"));
        for (path, result) in [
            (&latency, plot_latency(&runs, proto, &latency)),
            (&throughput, plot_throughput(&runs, proto, &throughput)),
        ] {
            match result {
                Ok(()) => eprintln!("bench_plot: wrote {}", path.display()),
                Err(e) => {
                    eprintln!("bench_plot: {}: {e}", path.display());
                    failed = true;
                }
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}
