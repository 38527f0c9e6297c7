//! The roofline chart, as hand-written SVG: log-log axes (arithmetic intensity in FLOP/B
//! against TFLOP/s), each device's two measured ceilings (the bandwidth slope and the compute
//! roof, meeting at the ridge), and every timed row as a point coloured by backend and
//! labelled with its case id. Rows without FLOPs (KV write, merge) have no intensity; they
//! get a second panel of GB/s against the devices' copy bandwidth.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::report::{sig, Row};
use polyattn::probe::Peaks;

const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
];

/// Escapes text for SVG.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A log10 axis mapped onto pixels.
#[derive(Clone, Copy, Debug)]
struct LogAxis {
    lo: f64,
    hi: f64,
    p0: f64,
    p1: f64,
}

impl LogAxis {
    /// Covers `min..max` (positive), widened to whole decades.
    fn new(min: f64, max: f64, p0: f64, p1: f64) -> Self {
        let (min, max) = if min > 0.0 && max >= min {
            (min, max)
        } else {
            (1e-3, 1e3)
        };
        let lo = min.log10().floor();
        let mut hi = max.log10().ceil();
        if hi <= lo {
            hi = lo + 1.0;
        }
        LogAxis { lo, hi, p0, p1 }
    }

    fn px(&self, v: f64) -> f64 {
        let l = v.max(1e-300).log10().clamp(self.lo, self.hi);
        self.p0 + (l - self.lo) / (self.hi - self.lo) * (self.p1 - self.p0)
    }

    fn decades(&self) -> impl Iterator<Item = i32> {
        (self.lo as i32)..=(self.hi as i32)
    }
}

fn decade_label(e: i32) -> String {
    match e {
        e if e < 0 => format!("{}", 10f64.powi(e)),
        0..=3 => format!("{}", 10i64.pow(e as u32)),
        e => format!("1e{e}"),
    }
}

fn colour_of(backends: &BTreeMap<String, usize>, b: &str) -> &'static str {
    PALETTE[backends.get(b).copied().unwrap_or(0) % PALETTE.len()]
}

/// The chart for `rows` (timed ones are drawn) under the ceilings `peaks`.
pub fn roofline_svg(peaks: &[Peaks], rows: &[Row], title: &str) -> String {
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

    let (w_main, h) = (900.0, 620.0);
    let w_mem = if mem_rows.is_empty() { 0.0 } else { 420.0 };
    let width = w_main + w_mem;
    let (left, right, top, bottom) = (80.0, w_main - 30.0, 60.0, h - 110.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" viewBox="0 0 {width} {h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<rect x="0" y="0" width="{width}" height="{h}" fill="white"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" font-size="15" text-anchor="middle">{}</text>"#,
        width / 2.0,
        esc(title)
    );

    // Ranges: every point, every ridge, a decade around them.
    let mut xs: Vec<f64> = flop_rows.iter().map(|r| r.intensity()).collect();
    let mut ys: Vec<f64> = flop_rows.iter().filter_map(|r| r.tflops).collect();
    for p in peaks {
        if p.compute_tflops > 0.0 && p.mem_gbps > 0.0 {
            xs.push(p.ridge());
            ys.push(p.compute_tflops);
        }
    }
    let (xmin, xmax) = min_max(&xs);
    let (ymin, ymax) = min_max(&ys);
    let ax = LogAxis::new(xmin / 3.0, xmax * 3.0, left, right);
    let ay = LogAxis::new(ymin / 3.0, ymax * 2.0, bottom, top);

    // Grid and ticks.
    for e in ax.decades() {
        let x = ax.px(10f64.powi(e));
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{bottom}" stroke="#ddd"/>"##
        );
        let _ = writeln!(
            s,
            r#"<text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
            bottom + 16.0,
            decade_label(e)
        );
    }
    for e in ay.decades() {
        let y = ay.px(10f64.powi(e));
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{y:.1}" x2="{right}" y2="{y:.1}" stroke="#ddd"/>"##
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
            left - 6.0,
            y + 4.0,
            decade_label(e)
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{top}" width="{}" height="{}" fill="none" stroke="#333"/>"##,
        right - left,
        bottom - top
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">arithmetic intensity (FLOP/byte, §8 useful bytes)</text>"#,
        (left + right) / 2.0,
        bottom + 36.0
    );
    let _ = writeln!(
        s,
        r#"<text x="20" y="{}" text-anchor="middle" transform="rotate(-90 20 {})">TFLOP/s</text>"#,
        (top + bottom) / 2.0,
        (top + bottom) / 2.0
    );

    // Ceilings: bandwidth slope up to the ridge, then the compute roof.
    for (i, p) in peaks.iter().enumerate() {
        if p.compute_tflops <= 0.0 || p.mem_gbps <= 0.0 {
            continue;
        }
        let x0 = 10f64.powf(ax.lo);
        let x1 = 10f64.powf(ax.hi);
        let ridge = p.ridge();
        let y_at = |x: f64| (x * p.mem_gbps / 1e3).min(p.compute_tflops);
        let pts = [
            (x0, y_at(x0)),
            (ridge, p.compute_tflops),
            (x1, p.compute_tflops),
        ];
        let path: Vec<String> = pts
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", ax.px(x), ay.px(y)))
            .collect();
        let _ = writeln!(
            s,
            r##"<polyline class="ceiling" points="{}" fill="none" stroke="#555" stroke-width="1.5" stroke-dasharray="{}"/>"##,
            path.join(" "),
            if i % 2 == 0 { "6 3" } else { "2 3" }
        );
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" fill="#333" text-anchor="end">{}: {} TFLOP/s, {} GB/s (measured)</text>"##,
            right - 4.0,
            ay.px(p.compute_tflops) - 5.0,
            esc(&p.device),
            sig(p.compute_tflops),
            sig(p.mem_gbps)
        );
    }

    // Points (circle: prefill, square: decode, triangle: MLA); labels when there are few
    // enough to read, moved down past the ones already placed. Every point has a tooltip.
    let label = flop_rows.len() <= MAX_LABELS;
    let mut placed: Vec<(f64, f64, f64)> = Vec::new();
    for r in &flop_rows {
        let (x, y) = (ax.px(r.intensity()), ay.px(r.tflops.unwrap_or(0.0)));
        let c = colour_of(&backends, &r.backend);
        let title = format!(
            "<title>{} {} {}/{}: {} µs, {} TFLOP/s, {} GB/s</title>",
            esc(&r.backend),
            esc(&r.id),
            esc(&r.dtype),
            esc(&r.kv_dtype),
            sig(r.us_median.unwrap_or(0.0)),
            sig(r.tflops.unwrap_or(0.0)),
            sig(r.gbps.unwrap_or(0.0))
        );
        let _ = writeln!(s, "{}", marker(&r.family, x, y, c, &title));
        if !label {
            continue;
        }
        let text = format!("{} {}", r.id, r.kv_dtype);
        let w = 4.6 * text.chars().count() as f64;
        let mut ly = y + 3.0;
        for _ in 0..8 {
            let clash = placed.iter().any(|&(px, py, pw)| {
                (ly - py).abs() < 9.0 && x + 6.0 < px + pw && px < x + 6.0 + w
            });
            if !clash {
                break;
            }
            ly += 9.0;
        }
        placed.push((x + 6.0, ly, w));
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{ly:.1}" font-size="8" fill="{c}">{}</text>"#,
            x + 6.0,
            esc(&text)
        );
    }
    if !label {
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" fill="#555">{} points: hover for case ids (labels only up to {MAX_LABELS})</text>"##,
            left + 6.0,
            top + 14.0,
            flop_rows.len()
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" fill="#555" text-anchor="end">○ prefill  □ decode  △ MLA</text>"##,
        right,
        h - 60.0
    );

    // Legend.
    for (name, i) in &backends {
        let y = h - 60.0 + 16.0 * (*i as f64 % 3.0);
        let x = left + 220.0 * (*i as f64 / 3.0).floor();
        let c = PALETTE[i % PALETTE.len()];
        let _ = writeln!(
            s,
            r#"<circle cx="{x:.1}" cy="{:.1}" r="5" fill="{c}"/>"#,
            y - 4.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{y:.1}">{}</text>"#,
            x + 10.0,
            esc(name)
        );
    }

    if !mem_rows.is_empty() {
        mem_panel(
            &mut s, peaks, &mem_rows, &backends, w_main, w_mem, top, bottom,
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Points drawn with a text label at most; above, the ids are in the tooltips only.
const MAX_LABELS: usize = 40;

/// One point: a circle (prefill and anything else), a square (decode) or a triangle (MLA).
fn marker(family: &str, x: f64, y: f64, c: &str, title: &str) -> String {
    match family {
        "decode" => format!(
            r#"<rect class="pt" x="{:.1}" y="{:.1}" width="7" height="7" fill="{c}" fill-opacity="0.8">{title}</rect>"#,
            x - 3.5,
            y - 3.5
        ),
        "mla" => format!(
            r#"<polygon class="pt" points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}" fill="{c}" fill-opacity="0.8">{title}</polygon>"#,
            x,
            y - 4.5,
            x - 4.5,
            y + 3.5,
            x + 4.5,
            y + 3.5
        ),
        _ => format!(
            r#"<circle class="pt" cx="{x:.1}" cy="{y:.1}" r="4" fill="{c}" fill-opacity="0.8">{title}</circle>"#
        ),
    }
}

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

/// GB/s of the FLOP-free rows against each device's copy bandwidth.
#[allow(clippy::too_many_arguments)]
fn mem_panel(
    s: &mut String,
    peaks: &[Peaks],
    rows: &[&Row],
    backends: &BTreeMap<String, usize>,
    x_off: f64,
    w: f64,
    top: f64,
    bottom: f64,
) {
    let (left, right) = (x_off + 60.0, x_off + w - 20.0);
    let mut ys: Vec<f64> = rows.iter().filter_map(|r| r.gbps).collect();
    ys.extend(peaks.iter().map(|p| p.mem_gbps));
    let (ymin, ymax) = min_max(&ys);
    let ay = LogAxis::new(ymin / 3.0, ymax * 2.0, bottom, top);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">data movement (KV write, merge): GB/s</text>"#,
        (left + right) / 2.0,
        top - 10.0
    );
    for e in ay.decades() {
        let y = ay.px(10f64.powi(e));
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{y:.1}" x2="{right}" y2="{y:.1}" stroke="#ddd"/>"##
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
            left - 6.0,
            y + 4.0,
            decade_label(e)
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{top}" width="{}" height="{}" fill="none" stroke="#333"/>"##,
        right - left,
        bottom - top
    );
    for p in peaks.iter().filter(|p| p.mem_gbps > 0.0) {
        let y = ay.px(p.mem_gbps);
        let _ = writeln!(
            s,
            r##"<line class="ceiling" x1="{left}" y1="{y:.1}" x2="{right}" y2="{y:.1}" stroke="#555" stroke-dasharray="6 3"/>"##
        );
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" fill="#333" text-anchor="end">{}: copy {} GB/s</text>"##,
            right - 4.0,
            y - 4.0,
            esc(&p.device),
            sig(p.mem_gbps)
        );
    }
    let n = rows.len().max(1) as f64;
    for (i, r) in rows.iter().enumerate() {
        let x = left + (i as f64 + 0.5) / n * (right - left);
        let y = ay.px(r.gbps.unwrap_or(0.0));
        let c = colour_of(backends, &r.backend);
        let _ = writeln!(
            s,
            r#"<circle class="pt" cx="{x:.1}" cy="{y:.1}" r="4" fill="{c}" fill-opacity="0.8"><title>{} {} {}: {} µs, {} GB/s</title></circle>"#,
            esc(&r.backend),
            esc(&r.id),
            esc(&r.dtype),
            sig(r.us_median.unwrap_or(0.0)),
            sig(r.gbps.unwrap_or(0.0))
        );
        let _ = writeln!(
            s,
            r#"<text x="{x:.1}" y="{:.1}" font-size="8" fill="{c}" transform="rotate(60 {x:.1} {:.1})">{}</text>"#,
            bottom + 8.0,
            bottom + 8.0,
            esc(&r.id)
        );
    }
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
        let svg = roofline_svg(&peaks, &rows, "roofline & <test>");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(balanced(&svg), "{svg}");
        assert_eq!(svg.matches(r#"class="pt""#).count(), 3);
        assert_eq!(svg.matches(r#"class="ceiling""#).count(), 2);
        assert!(svg.contains("roofline &amp; &lt;test&gt;") && svg.contains("cpu &lt;2&gt;"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }
}
