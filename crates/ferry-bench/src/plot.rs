//! PNG plots like the iRODS whitepaper's: throughput against streams, one panel per RTT (columns)
//! and TCP regime (rows), lines per file size, iperf3's memory-to-memory figure as a dashed
//! line. Plus one comparison per data set: lines per tool.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Result};
use ferry_units::units::parse_rate_tc;
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

use crate::report::Med;

const FONT: &str = "sans-serif";
pub const FONT_CANDIDATES: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

/// Loads a TTF (FERRY_BENCH_FONT, else DejaVu Sans) for the plots' text, once.
pub fn init_font() -> Result<()> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let mut cands: Vec<String> = Vec::new();
        if let Ok(p) = std::env::var("FERRY_BENCH_FONT") {
            cands.push(p);
        }
        cands.extend(FONT_CANDIDATES.iter().map(|s| s.to_string()));
        for c in &cands {
            if let Ok(bytes) = std::fs::read(c) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font(FONT, FontStyle::Normal, bytes).is_ok() {
                    return Ok(());
                }
            }
        }
        Err(format!(
            "no TTF font found for the plots' text (tried {}; install fonts-dejavu-core: \
             bash scripts/bench-deps.sh, or set FERRY_BENCH_FONT)",
            cands.join(", ")
        ))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// One line of a panel.
struct Line {
    label: String,
    points: Vec<(usize, f64)>,
    dashed: bool,
    color: RGBColor,
}

struct Panel {
    title: String,
    lines: Vec<Line>,
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// ferry's defaults on a comparison plot (a colour no tool line takes first).
const FERRY_DEFAULTS: RGBColor = RGBColor(199, 21, 133);

/// A link's rate label ("1gbit", "200mbit", "uncapped") in Mbit/s; None when uncapped.
fn rate_mbps(rate: &str) -> Option<f64> {
    let bps = parse_rate_tc(rate).ok().flatten()?;
    Some(bps as f64 / 1e6)
}

/// Sort key of data set labels: files by size, then trees.
fn ds_order(label: &str) -> (u8, u64, String) {
    if let Ok(d) = crate::plan::Dataset::parse(label) {
        let kind = if d.is_file() { 0 } else { 1 };
        return (kind, d.bytes(), label.to_owned());
    }
    (2, 0, label.to_owned())
}

fn draw_figure(
    path: &Path,
    title: &str,
    rows: &[String],
    cols: &[u32],
    streams: &[u16],
    panels: &[Panel],
    ymax: f64,
) -> Result<()> {
    let (pw, ph) = (560u32, 400u32);
    let w = pw * cols.len() as u32;
    let h = ph * rows.len() as u32 + 50;
    let root = BitMapBackend::new(path, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e:?}"))?;
    let (top, body) = root.split_vertically(50);
    top.draw_text(
        title,
        &TextStyle::from((FONT, 22).into_font()).color(&BLACK),
        (15, 14),
    )
    .map_err(|e| anyhow!("{e:?}"))?;
    let areas = body.split_evenly((rows.len(), cols.len()));
    let n = streams.len();
    for (area, panel) in areas.iter().zip(panels) {
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, (FONT, 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((0..n as i32 - 1).into_segmented(), 0f64..ymax)
            .map_err(|e| anyhow!("{e:?}"))?;
        let st = streams.to_vec();
        chart
            .configure_mesh()
            .x_desc("streams")
            .y_desc("Mbit/s")
            .y_label_formatter(&|v| {
                if ymax < 20.0 {
                    format!("{v:.1}")
                } else {
                    format!("{v:.0}")
                }
            })
            .x_labels(n + 1)
            .x_label_formatter(&move |v| match v {
                SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => st
                    .get(*i as usize)
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
                SegmentValue::Last => String::new(),
            })
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 15))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(|e| anyhow!("{e:?}"))?;
        let mut any = false;
        for line in &panel.lines {
            if line.points.is_empty() {
                continue;
            }
            any = true;
            let pts: Vec<(SegmentValue<i32>, f64)> = line
                .points
                .iter()
                .map(|&(i, y)| (SegmentValue::CenterOf(i as i32), y))
                .collect();
            let color = line.color;
            let style = color.stroke_width(2);
            if line.dashed {
                chart
                    .draw_series(DashedLineSeries::new(pts.clone(), 8, 5, style))
                    .map_err(|e| anyhow!("{e:?}"))?
                    .label(&line.label)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 8, y)], color.stroke_width(2))
                    });
            } else {
                chart
                    .draw_series(LineSeries::new(pts.clone(), style))
                    .map_err(|e| anyhow!("{e:?}"))?
                    .label(&line.label)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(
                        pts.iter()
                            .map(|p| Circle::new(p.clone(), 3, color.filled())),
                    )
                    .map_err(|e| anyhow!("{e:?}"))?;
            }
        }
        if any {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .label_font((FONT, 13))
                .background_style(WHITE.mix(0.85))
                .border_style(RGBColor(180, 180, 180))
                .draw()
                .map_err(|e| anyhow!("{e:?}"))?;
        } else {
            area.draw_text(
                "no data",
                &TextStyle::from((FONT, 16).into_font()).color(&RGBColor(150, 150, 150)),
                (pw as i32 / 2 - 30, ph as i32 / 2),
            )
            .map_err(|e| anyhow!("{e:?}"))?;
        }
    }
    root.present().map_err(|e| anyhow!("{e:?}"))?;
    Ok(())
}

fn iperf_line(
    meds: &[Med],
    dir: &str,
    rate: &str,
    regime: &str,
    rtt: u32,
    streams: &[u16],
) -> Line {
    let points = streams
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            meds.iter()
                .find(|m| {
                    m.tool == "iperf3"
                        && m.dataset == "memory"
                        && m.usable()
                        && m.direction == dir
                        && m.rate == rate
                        && m.regime == regime
                        && m.rtt_ms == rtt
                        && m.streams == *s
                })
                .map(|m| (i, m.mbps_median))
        })
        .collect();
    Line {
        label: "iperf3 (memory)".into(),
        points,
        dashed: true,
        color: BLACK,
    }
}

fn is_file(label: &str) -> bool {
    label.starts_with("file-")
}

fn uniq<T: Ord + Clone>(it: impl Iterator<Item = T>) -> Vec<T> {
    it.collect::<BTreeSet<T>>().into_iter().collect()
}

fn file_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Draws every figure the medians allow into `dir`; returns the files written.
pub fn plot_all(meds: &[Med], dir: &Path, runs: u32) -> Result<Vec<PathBuf>> {
    init_font()?;
    std::fs::create_dir_all(dir)?;
    // Figures of an earlier --replot of the same results go.
    for e in std::fs::read_dir(dir)?.flatten() {
        if e.path().extension().is_some_and(|x| x == "png") {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let mut written = Vec::new();
    // Points of a sweep: explicit stream counts (0 = a tool's defaults, not plotted).
    let pts: Vec<&Med> = meds
        .iter()
        .filter(|m| m.streams > 0 && m.tool != "iperf3")
        .collect();
    let regime_rank = |r: &String| if r == "default" { 0 } else { 1 };
    for dir_name in uniq(pts.iter().map(|m| m.direction.clone())) {
        for rate in uniq(pts.iter().map(|m| m.rate.clone())) {
            let here: Vec<&Med> = pts
                .iter()
                .copied()
                .filter(|m| m.direction == dir_name && m.rate == rate)
                .collect();
            if here.is_empty() {
                continue;
            }
            let mut regimes = uniq(here.iter().map(|m| m.regime.clone()));
            regimes.sort_by_key(regime_rank);
            let rtts = uniq(here.iter().map(|m| m.rtt_ms));
            let streams = uniq(
                here.iter().map(|m| m.streams).chain(
                    meds.iter()
                        .filter(|m| m.tool == "iperf3")
                        .map(|m| m.streams),
                ),
            );
            let idx = |s: u16| streams.iter().position(|&x| x == s).unwrap_or(0);
            let ymax_for = |vals: &mut dyn Iterator<Item = f64>| {
                let top = vals.fold(0.0, f64::max);
                let cap = rate_mbps(&rate).map(|r| r * 1.08).unwrap_or(0.0);
                (top * 1.12).max(cap).max(10.0)
            };
            let iperf_vals = meds
                .iter()
                .filter(|m| m.tool == "iperf3" && m.rate == rate && m.direction == dir_name)
                .map(|m| m.mbps_median);
            let all_vals: Vec<f64> = here.iter().map(|m| m.mbps_max).chain(iperf_vals).collect();
            let ymax = ymax_for(&mut all_vals.iter().copied());

            // Per tool (and block size): lines per file size, as in the whitepaper. Trees are in
            // the comparisons (on their own scale); tools with one stream have one point.
            for tool in uniq(here.iter().map(|m| m.tool.clone())) {
                let tm: Vec<&Med> = here
                    .iter()
                    .copied()
                    .filter(|m| m.tool == tool && is_file(&m.dataset))
                    .collect();
                if uniq(tm.iter().map(|m| m.streams)).len() < 2 {
                    continue;
                }
                for block in uniq(tm.iter().map(|m| m.block.clone())) {
                    let bm: Vec<&Med> = tm.iter().copied().filter(|m| m.block == block).collect();
                    let mut datasets = uniq(bm.iter().map(|m| m.dataset.clone()));
                    datasets.sort_by_key(|d| ds_order(d));
                    let mut panels = Vec::new();
                    for regime in &regimes {
                        for &rtt in &rtts {
                            let mut lines: Vec<Line> = datasets
                                .iter()
                                .enumerate()
                                .map(|(k, ds)| {
                                    let mut points: Vec<(usize, f64)> = bm
                                        .iter()
                                        .filter(|m| {
                                            &m.dataset == ds
                                                && &m.regime == regime
                                                && m.rtt_ms == rtt
                                                && m.usable()
                                        })
                                        .map(|m| (idx(m.streams), m.mbps_median))
                                        .collect();
                                    points.sort_by_key(|p| p.0);
                                    Line {
                                        label: ds.clone(),
                                        points,
                                        dashed: false,
                                        color: COLORS[k % COLORS.len()],
                                    }
                                })
                                .collect();
                            lines.push(iperf_line(meds, &dir_name, &rate, regime, rtt, &streams));
                            panels.push(Panel {
                                title: format!("RTT {rtt} ms, {regime} TCP buffers"),
                                lines,
                            });
                        }
                    }
                    let blk = if block == "-" {
                        String::new()
                    } else {
                        format!(", block {block}")
                    };
                    let title = format!(
                        "{tool} {dir_name}, {rate}{blk}: throughput vs streams (median of {runs})"
                    );
                    let name = if block == "-" {
                        format!("{tool}-{dir_name}-{rate}.png")
                    } else {
                        format!("{tool}-{dir_name}-{rate}-block{block}.png")
                    };
                    let p = dir.join(file_safe(&name));
                    draw_figure(&p, &title, &regimes, &rtts, &streams, &panels, ymax)?;
                    written.push(p);
                }
            }

            // Comparison per data set: lines per tool (ferry at its best block per point).
            let tools = uniq(here.iter().map(|m| m.tool.clone()));
            if tools.len() < 2 {
                continue;
            }
            let mut datasets = uniq(here.iter().map(|m| m.dataset.clone()));
            datasets.sort_by_key(|d| ds_order(d));
            for ds in datasets {
                let dm: Vec<&Med> = here.iter().copied().filter(|m| m.dataset == ds).collect();
                if uniq(dm.iter().map(|m| m.tool.clone())).len() < 2 {
                    continue;
                }
                // ferry with its defaults chooses its stream count per run, so it has no place
                // on the axis: a dashed level across it, which the explicit counts compare to.
                let defaults: Vec<&Med> = meds
                    .iter()
                    .filter(|m| {
                        m.tool == "ferry"
                            && m.streams == 0
                            && m.usable()
                            && m.direction == dir_name
                            && m.rate == rate
                            && m.dataset == ds
                    })
                    .collect();
                // A tree is far below the link: its own scale, iperf3 named in the title.
                let tree = !is_file(&ds);
                let ymax_here = if tree {
                    (dm.iter()
                        .chain(defaults.iter())
                        .map(|m| m.mbps_max)
                        .fold(0.0, f64::max)
                        * 1.15)
                        .max(0.1)
                } else {
                    ymax
                };
                let mut panels = Vec::new();
                for regime in &regimes {
                    for &rtt in &rtts {
                        let mut lines = Vec::new();
                        for (k, tool) in tools.iter().enumerate() {
                            let mut points: Vec<(usize, f64)> = Vec::new();
                            for &s in &streams {
                                let best = dm
                                    .iter()
                                    .filter(|m| {
                                        &m.tool == tool
                                            && &m.regime == regime
                                            && m.rtt_ms == rtt
                                            && m.streams == s
                                            && m.usable()
                                    })
                                    .map(|m| m.mbps_median)
                                    .fold(f64::NAN, f64::max);
                                if best.is_finite() {
                                    points.push((idx(s), best));
                                }
                            }
                            let label = if tool == "ferry"
                                && uniq(
                                    dm.iter()
                                        .filter(|m| m.tool == "ferry")
                                        .map(|m| m.block.clone()),
                                )
                                .len()
                                    > 1
                            {
                                "ferry (best block size)".to_owned()
                            } else {
                                tool.clone()
                            };
                            lines.push(Line {
                                label,
                                points,
                                dashed: false,
                                color: COLORS[k % COLORS.len()],
                            });
                        }
                        let level = defaults
                            .iter()
                            .filter(|m| &m.regime == regime && m.rtt_ms == rtt)
                            .map(|m| m.mbps_median)
                            .fold(f64::NAN, f64::max);
                        if level.is_finite() {
                            let k = tools.iter().position(|t| t == "ferry");
                            lines.push(Line {
                                label: "ferry defaults (streams auto)".into(),
                                points: (0..streams.len()).map(|i| (i, level)).collect(),
                                dashed: true,
                                color: k.map_or(FERRY_DEFAULTS, |k| COLORS[k % COLORS.len()]),
                            });
                        }
                        let ip = iperf_line(meds, &dir_name, &rate, regime, rtt, &streams);
                        let mut title = format!("RTT {rtt} ms, {regime} TCP buffers");
                        if tree {
                            let best = ip.points.iter().map(|p| p.1).fold(0.0, f64::max);
                            if best > 0.0 {
                                title.push_str(&format!(" (iperf3 {best:.0})"));
                            }
                        } else {
                            lines.push(ip);
                        }
                        panels.push(Panel { title, lines });
                    }
                }
                let title = format!("{ds} {dir_name}, {rate}: tools compared (median of {runs})");
                let p = dir.join(file_safe(&format!("compare-{dir_name}-{rate}-{ds}.png")));
                draw_figure(&p, &title, &regimes, &rtts, &streams, &panels, ymax_here)?;
                written.push(p);
            }
        }
    }
    if written.is_empty() {
        bail!("nothing to plot (no point with an explicit stream count)");
    }
    Ok(written)
}
