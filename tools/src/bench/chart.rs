//! The roofline chart, drawn by `plotters` into an SVG: log-log axes (arithmetic intensity in
//! FLOP/B against TFLOP/s), each device's two measured ceilings (the bandwidth slope and the
//! compute roof, meeting at the ridge), and every timed row as a point coloured by backend
//! (circle: prefill, square: decode, triangle: MLA), labelled with its case id when there are
//! few enough points to read. Rows without FLOPs (KV write, merge) have no intensity; they get
//! a second panel of GB/s against the devices' copy bandwidth. Every id is also in the table
//! and the JSON.

use std::collections::BTreeMap;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::config_error;
use super::report::{sig, Row};
use polyattn::error::{Error, Result};
use polyattn::probe::Peaks;

const PALETTE: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
];

/// The ceilings' colour.
const CEILING: RGBColor = RGBColor(0x55, 0x55, 0x55);

/// Points drawn with a text label at most; above, the ids are in the table and JSON only.
const MAX_LABELS: usize = 40;

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

fn chart_err(e: impl std::fmt::Display) -> Error {
    config_error(format!("roofline chart: {e}"))
}

/// `min..max` (positive) widened to whole decades.
fn decades(min: f64, max: f64) -> (f64, f64) {
    let (min, max) = if min > 0.0 && max >= min {
        (min, max)
    } else {
        (1e-3, 1e3)
    };
    let lo = min.log10().floor();
    let hi = max.log10().ceil().max(lo + 1.0);
    (10f64.powf(lo), 10f64.powf(hi))
}

/// The smallest and largest positive finite values of `v` (a default range if none).
fn min_max(v: &[f64]) -> (f64, f64) {
    let pos: Vec<f64> = v
        .iter()
        .copied()
        .filter(|x| *x > 0.0 && x.is_finite())
        .collect();
    if pos.is_empty() {
        return (1e-3, 1e3);
    }
    (
        pos.iter().copied().fold(f64::INFINITY, f64::min),
        pos.iter().copied().fold(0.0, f64::max),
    )
}

fn colour_of(backends: &BTreeMap<String, usize>, b: &str) -> RGBColor {
    PALETTE[backends.get(b).copied().unwrap_or(0) % PALETTE.len()]
}

/// The chart for `rows` (timed ones are drawn) under the ceilings `peaks`, as SVG text.
pub fn roofline_svg(peaks: &[Peaks], rows: &[Row], title: &str) -> Result<String> {
    let ok: Vec<&Row> = rows.iter().filter(|r| r.is_ok()).collect();
    let flop_rows: Vec<&Row> = ok
        .iter()
        .copied()
        .filter(|r| r.flops > 0.0 && r.bytes > 0.0)
        .collect();
    let mem_rows: Vec<&Row> = ok
        .iter()
        .copied()
        .filter(|r| r.flops <= 0.0 && r.bytes > 0.0)
        .collect();
    let mut backends: BTreeMap<String, usize> = BTreeMap::new();
    for r in &ok {
        let n = backends.len();
        backends.entry(r.backend.clone()).or_insert(n);
    }
    let peaks: Vec<&Peaks> = peaks
        .iter()
        .filter(|p| p.compute_tflops > 0.0 && p.mem_gbps > 0.0)
        .collect();

    let (w_main, h) = (900u32, 620u32);
    let w_mem = if mem_rows.is_empty() { 0 } else { 420 };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (w_main + w_mem, h)).into_drawing_area();
        root.fill(&WHITE).map_err(chart_err)?;
        let root = root.titled(title, ("sans-serif", 19)).map_err(chart_err)?;
        let (main, mem) = root.split_horizontally(w_main);
        roofline_panel(&main, &peaks, &flop_rows, &backends)?;
        if !mem_rows.is_empty() {
            mem_panel(&mem, &peaks, &mem_rows, &backends)?;
        }
        root.present().map_err(chart_err)?;
    }
    Ok(svg)
}

/// TFLOP/s against FLOP/byte, with each device's roofline.
fn roofline_panel(
    area: &Area<'_>,
    peaks: &[&Peaks],
    rows: &[&Row],
    backends: &BTreeMap<String, usize>,
) -> Result<()> {
    // Ranges: every point, every ridge, a decade around them.
    let mut xs: Vec<f64> = rows.iter().map(|r| r.intensity()).collect();
    let mut ys: Vec<f64> = rows.iter().filter_map(|r| r.tflops).collect();
    for p in peaks {
        xs.push(p.ridge());
        ys.push(p.compute_tflops);
    }
    let (xmin, xmax) = min_max(&xs);
    let (ymin, ymax) = min_max(&ys);
    let (x0, x1) = decades(xmin / 3.0, xmax * 3.0);
    let (y0, y1) = decades(ymin / 3.0, ymax * 2.0);
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
        .map_err(chart_err)?;
    chart
        .configure_mesh()
        .x_desc("arithmetic intensity (FLOP/byte, §8 useful bytes)")
        .y_desc("TFLOP/s")
        .x_label_formatter(&|v| decade(*v))
        .y_label_formatter(&|v| decade(*v))
        .draw()
        .map_err(chart_err)?;

    // Ceilings: the bandwidth slope from where it enters the chart up to the ridge, then the
    // compute roof, labelled above its right end (moved up past labels already there).
    let mut taken = Vec::new();
    for (i, p) in peaks.iter().enumerate() {
        let ridge = p.ridge();
        let enter = (y0 * 1e3 / p.mem_gbps).max(x0);
        let mut pts = Vec::new();
        if enter < ridge {
            pts.push((enter, enter * p.mem_gbps / 1e3));
        }
        pts.extend([(ridge.max(x0), p.compute_tflops), (x1, p.compute_tflops)]);
        let dash = if i % 2 == 0 { 6 } else { 2 };
        chart
            .draw_series(DashedLineSeries::new(pts, dash, 3, CEILING.stroke_width(2)))
            .map_err(chart_err)?;
        let (_, y) = chart.backend_coord(&(x1, p.compute_tflops));
        let dy = free_row(&mut taken, y - 3, -13);
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((x1, p.compute_tflops))
                    + Text::new(
                        format!(
                            "{}: {} TFLOP/s, {} GB/s (measured)",
                            p.device,
                            sig(p.compute_tflops),
                            sig(p.mem_gbps)
                        ),
                        (-4, dy),
                        ("sans-serif", 12)
                            .into_font()
                            .color(&CEILING)
                            .pos(Pos::new(HPos::Right, VPos::Bottom)),
                    ),
            ))
            .map_err(chart_err)?;
    }

    // Points, one series per backend and marker; labels moved down past the ones already
    // placed when there are few enough to read.
    let point = |r: &Row| (r.intensity(), r.tflops.unwrap_or(0.0));
    for (name, &i) in backends {
        let c = PALETTE[i % PALETTE.len()];
        let style = c.mix(0.8).filled();
        let mine = |family: &'static str| {
            rows.iter()
                .copied()
                .filter(move |r| r.backend == *name && family_marker(&r.family) == family)
        };
        chart
            .draw_series(mine("circle").map(|r| Circle::new(point(r), 4, style)))
            .map_err(chart_err)?
            .label(name.as_str())
            .legend(move |(x, y)| Circle::new((x + 9, y), 4, c.filled()));
        chart
            .draw_series(
                mine("square").map(|r| {
                    EmptyElement::at(point(r)) + Rectangle::new([(-3, -3), (4, 4)], style)
                }),
            )
            .map_err(chart_err)?;
        chart
            .draw_series(mine("triangle").map(|r| TriangleMarker::new(point(r), 5, style)))
            .map_err(chart_err)?;
    }
    if rows.len() <= MAX_LABELS {
        let mut placed: Vec<(i32, i32, i32)> = Vec::new();
        for r in rows {
            let text = format!("{} {}", r.id, r.kv_dtype);
            let (x, y) = chart.backend_coord(&point(r));
            let w = (4.6 * text.chars().count() as f64) as i32;
            let mut dy = -4;
            for _ in 0..8 {
                let ly = y + dy;
                let clash = placed
                    .iter()
                    .any(|&(px, py, pw)| (ly - py).abs() < 9 && x + 6 < px + pw && px < x + 6 + w);
                if !clash {
                    break;
                }
                dy += 9;
            }
            placed.push((x + 6, y + dy, w));
            let font = ("sans-serif", 10)
                .into_font()
                .color(&colour_of(backends, &r.backend));
            chart
                .draw_series(std::iter::once(
                    EmptyElement::at(point(r)) + Text::new(text, (6, dy), font),
                ))
                .map_err(chart_err)?;
        }
    } else {
        chart
            .plotting_area()
            .draw(&Text::new(
                format!(
                    "{} points: labels only up to {MAX_LABELS} (case ids in the table and JSON)",
                    rows.len()
                ),
                (x0 * 1.3, y0 * 1.5),
                ("sans-serif", 13).into_font().color(&CEILING),
            ))
            .map_err(chart_err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(CEILING)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(chart_err)?;
    let (w, h) = area.dim_in_pixel();
    area.draw(&Text::new(
        "○ prefill  □ decode  △ MLA",
        (w as i32 - 12, h as i32 - 6),
        ("sans-serif", 13)
            .into_font()
            .color(&CEILING)
            .pos(Pos::new(HPos::Right, VPos::Bottom)),
    ))
    .map_err(chart_err)?;
    Ok(())
}

/// A decade's axis label: `0.01`, `1`, `1000`, `100000`.
fn decade(v: f64) -> String {
    format!("{}", (v * 1e6).round() / 1e6)
}

/// The pixel offset (from `y`, moving by `step`) of the first text row at least 12 pixels
/// from every row in `taken`, which it joins.
fn free_row(taken: &mut Vec<i32>, y: i32, step: i32) -> i32 {
    let mut dy = -3;
    while taken.iter().any(|&t| (y + dy - t).abs() < 12) {
        dy += step;
    }
    taken.push(y + dy);
    dy
}

/// The marker of a row's family: a square for decode, a triangle for MLA, else a circle.
fn family_marker(family: &str) -> &'static str {
    match family {
        "decode" => "square",
        "mla" => "triangle",
        _ => "circle",
    }
}

/// GB/s of the FLOP-free rows against each device's copy bandwidth (devices by kind: their
/// full names are on the roofline panel).
fn mem_panel(
    area: &Area<'_>,
    peaks: &[&Peaks],
    rows: &[&Row],
    backends: &BTreeMap<String, usize>,
) -> Result<()> {
    let mut ys: Vec<f64> = rows.iter().filter_map(|r| r.gbps).collect();
    ys.extend(peaks.iter().map(|p| p.mem_gbps));
    let (ymin, ymax) = min_max(&ys);
    let (y0, y1) = decades(ymin / 3.0, ymax * 2.0);
    let n = rows.len() as f64;
    let mut chart = ChartBuilder::on(area)
        .caption("data movement (KV write, merge): GB/s", ("sans-serif", 14))
        .margin(12)
        .x_label_area_size(10)
        .y_label_area_size(56)
        .margin_right(70)
        .build_cartesian_2d(-0.5..n - 0.5, (y0..y1).log_scale())
        .map_err(chart_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_label_formatter(&|v| decade(*v))
        .draw()
        .map_err(chart_err)?;
    let mut taken = Vec::new();
    for p in peaks {
        chart
            .draw_series(DashedLineSeries::new(
                [(-0.5, p.mem_gbps), (n - 0.5, p.mem_gbps)],
                6,
                3,
                CEILING.stroke_width(1),
            ))
            .map_err(chart_err)?;
        let (_, y) = chart.backend_coord(&(-0.5, p.mem_gbps));
        let dy = free_row(&mut taken, y - 3, -12);
        chart
            .draw_series(std::iter::once(
                EmptyElement::at((-0.5, p.mem_gbps))
                    + Text::new(
                        format!("{}: copy {} GB/s", p.kind, sig(p.mem_gbps)),
                        (4, dy),
                        ("sans-serif", 10)
                            .into_font()
                            .color(&CEILING)
                            .pos(Pos::new(HPos::Left, VPos::Bottom)),
                    ),
            ))
            .map_err(chart_err)?;
    }
    for (i, r) in rows.iter().enumerate() {
        let c = colour_of(backends, &r.backend);
        let at = (i as f64, r.gbps.unwrap_or(0.0));
        let font = ("sans-serif", 10).into_font().color(&c);
        chart
            .draw_series(std::iter::once(
                EmptyElement::at(at)
                    + Circle::new((0, 0), 4, c.mix(0.8).filled())
                    + Text::new(r.id.clone(), (6, -4), font),
            ))
            .map_err(chart_err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::formulas::Bound;
    use crate::bench::report::Status;

    fn row(id: &str, flops: f64, bytes: f64, us: f64) -> Row {
        Row {
            id: id.into(),
            group: "C".into(),
            family: "prefill".into(),
            shape: String::new(),
            backend: "CPU".into(),
            device: "cpu <2>".into(),
            dtype: "f32".into(),
            kv_dtype: "auto".into(),
            status: Status::Ok,
            note: None,
            flops,
            bytes,
            reps: 3,
            sets: 2,
            timer: None,
            us_median: Some(us),
            us_p10: None,
            us_p90: None,
            us_min: None,
            us_max: None,
            tflops: Some(flops / us / 1e6),
            gbps: Some(bytes / us / 1e3),
            bound: Some(Bound::Compute),
            fraction: Some(0.1),
            peak_tflops: None,
            peak_gbps: None,
        }
    }

    /// Every opened tag is closed in order (a minimal well-formedness check).
    fn balanced(svg: &str) -> bool {
        let mut stack: Vec<String> = Vec::new();
        let mut rest = svg;
        while let Some(i) = rest.find('<') {
            let j = rest[i..].find('>').map(|j| i + j).unwrap_or(rest.len());
            let tag = &rest[i + 1..j];
            if let Some(name) = tag.strip_prefix('/') {
                if stack.pop().as_deref() != Some(name.trim()) {
                    return false;
                }
            } else if !tag.ends_with('/') {
                stack.push(tag.split_whitespace().next().unwrap_or("").to_string());
            }
            rest = &rest[(j + 1).min(rest.len())..];
        }
        stack.is_empty()
    }

    #[test]
    fn svg_is_well_formed_and_has_every_point() {
        let peaks = vec![Peaks {
            device: "cpu <2>".into(),
            kind: "cpu".into(),
            dtype: "f32".into(),
            compute_tflops: 0.1,
            compute_method: String::new(),
            mem_gbps: 10.0,
            mem_method: String::new(),
            read_gbps: None,
        }];
        let mut rows = vec![
            row("C.P2.s4k", 1.4e11, 3.4e7, 2e6),
            row("C.D1.s4k", 6.7e7, 3.4e7, 5e3),
            row("K.t16.h8.nhd", 0.0, 1e5, 20.0),
        ];
        let mut skipped = row("M.x", 1.0, 1.0, 1.0);
        skipped.status = Status::Skipped;
        rows.push(skipped);
        let svg = roofline_svg(&peaks, &rows, "roofline & <test>").unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(balanced(&svg), "{svg}");
        // Every timed row is labelled (the prefill and decode in the roofline, the KV write
        // in the data-movement panel); the skipped one is not drawn.
        for label in ["C.P2.s4k auto", "C.D1.s4k auto", "K.t16.h8.nhd"] {
            assert!(svg.contains(label), "no {label:?} in\n{svg}");
        }
        assert!(!svg.contains("M.x"));
        // Both ceilings, with the device named (escaped), and the escaped title.
        assert!(
            svg.contains("cpu &lt;2&gt;: 0.100 TFLOP/s, 10.00 GB/s (measured)"),
            "{svg}"
        );
        assert!(svg.contains("cpu: copy 10.00 GB/s"), "{svg}");
        assert!(svg.contains("roofline &amp; &lt;test&gt;"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }
}
