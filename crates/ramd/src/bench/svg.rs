//! The results as a horizontal bar chart: one group per figure, one bar
//! per target, lengths relative to the first target (a dashed line marks
//! it), each bar labelled with its value and ratio. Hand-written SVG: a
//! plotting crate would be most of the binary for a few rectangles.

use std::fmt::Write;

use super::report::{letter, num, Report};

const WIDTH: f64 = 960.0;
const LABEL_W: f64 = 230.0;
const BAR_X: f64 = LABEL_W + 40.0;
/// Room right of the longest bar for its label.
const BAR_W: f64 = WIDTH - BAR_X - 170.0;
const BAR_H: f64 = 16.0;
const GROUP_TITLE: f64 = 20.0;
const GROUP_GAP: f64 = 14.0;
const COLORS: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub fn render(r: &Report) -> String {
    let n = r.targets.len();
    let legend_h = 24.0 + 18.0 * n as f64;
    let group_h = GROUP_TITLE + BAR_H * n as f64 + 4.0 * n as f64 + GROUP_GAP;
    let height = 50.0 + legend_h + group_h * r.rows.len() as f64 + 10.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">"##
    );
    let _ = writeln!(
        s,
        r##"<rect width="{WIDTH}" height="{height}" fill="white"/>"##
    );
    let _ = writeln!(
        s,
        r##"<text x="12" y="26" font-size="17" font-weight="bold">ramd bench: each bar relative to A (dashed line); --size {} --runs {} --qd {}</text>"##,
        super::target::human(r.size),
        r.runs,
        r.qd
    );
    let mut y = 50.0;
    for (i, t) in r.targets.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let _ = writeln!(
            s,
            r##"<rect x="12" y="{}" width="14" height="14" fill="{c}"/><text x="32" y="{}">{} = {} ({})</text>"##,
            y,
            y + 11.5,
            letter(i),
            esc(&t.spec),
            t.kind
        );
        y += 18.0;
    }
    y += 24.0 - 18.0 + 10.0;
    for row in &r.rows {
        let better = if row.higher_is_better {
            "higher is better"
        } else {
            "lower is better"
        };
        let _ = writeln!(
            s,
            r##"<text x="12" y="{}" font-weight="bold">{} {}</text><text x="{BAR_X}" y="{}" fill="#555">{}, {better}</text>"##,
            y + 13.0,
            esc(row.workload.name()),
            esc(row.label),
            y + 13.0,
            esc(row.unit)
        );
        y += GROUP_TITLE;
        let ratios: Vec<Option<f64>> = (0..n).map(|t| row.ratio(t)).collect();
        // The longest bar fills the width; A's bar then shows where 1.0 is.
        let max = ratios.iter().flatten().fold(1.0f64, |a, &b| a.max(b));
        let scale = BAR_W / max;
        // The reference line first, so that labels are drawn over it.
        let ref_x = BAR_X + scale;
        let _ = writeln!(
            s,
            r##"<line x1="{ref_x:.1}" y1="{}" x2="{ref_x:.1}" y2="{}" stroke="#333" stroke-dasharray="3,3"/>"##,
            y - 2.0,
            y + (BAR_H + 4.0) * n as f64 - 2.0
        );
        for (ti, v) in row.values.iter().enumerate() {
            let c = COLORS[ti % COLORS.len()];
            let _ = writeln!(
                s,
                r##"<text x="{}" y="{}" text-anchor="end">{}</text>"##,
                BAR_X - 8.0,
                y + 12.0,
                letter(ti)
            );
            match (v, ratios[ti]) {
                (Some(f), Some(ratio)) => {
                    let w = (ratio * scale).max(1.0);
                    let label = if ti == 0 {
                        format!("{} {}", num(f.median), row.unit)
                    } else {
                        format!("{} {} ({:.2}×)", num(f.median), row.unit, ratio)
                    };
                    let _ = writeln!(
                        s,
                        r##"<rect x="{BAR_X}" y="{y}" width="{w:.1}" height="{BAR_H}" fill="{c}"/><text x="{:.1}" y="{}">{}</text>"##,
                        BAR_X + w + 6.0,
                        y + 12.0,
                        esc(&label)
                    );
                }
                (Some(f), None) => {
                    let _ = writeln!(
                        s,
                        r##"<text x="{BAR_X}" y="{}" fill="#555">{} {} (A has no figure)</text>"##,
                        y + 12.0,
                        num(f.median),
                        esc(row.unit)
                    );
                }
                (None, _) => {
                    let _ = writeln!(
                        s,
                        r##"<text x="{BAR_X}" y="{}" fill="#888">not measured</text>"##,
                        y + 12.0
                    );
                }
            }
            y += BAR_H + 4.0;
        }
        y += GROUP_GAP;
    }
    s.push_str("</svg>\n");
    s
}
