//! Medians over the runs, ratios to the first target, and the two ways
//! to print them: a table for people, one JSON object for scripts.

use serde_json::{json, Map, Value};

use super::target::{human, Target};
use super::workloads::{Metric, Plan, Workload};
use super::BenchArgs;

/// Every run of one workload on one target.
#[derive(Default)]
pub struct Cell {
    pub runs: Vec<Vec<Metric>>,
    pub note: Option<String>,
    pub skipped: Option<String>,
}

/// One figure on one target: its median and every run.
pub struct Figure {
    pub median: f64,
    pub runs: Vec<f64>,
}

/// One row: a workload's figure, on every target.
pub struct Row {
    pub workload: Workload,
    pub key: &'static str,
    pub label: &'static str,
    pub unit: &'static str,
    pub higher_is_better: bool,
    /// Per target; `None` where the workload was skipped.
    pub values: Vec<Option<Figure>>,
}

impl Row {
    /// value / the first target's value.
    pub fn ratio(&self, t: usize) -> Option<f64> {
        let first = self.values.first()?.as_ref()?.median;
        let v = self.values.get(t)?.as_ref()?.median;
        (first > 0.0).then(|| v / first)
    }
}

pub struct TargetInfo {
    pub spec: String,
    pub kind: &'static str,
}

pub struct Report {
    pub size: u64,
    pub runs: u16,
    pub qd: u16,
    pub targets: Vec<TargetInfo>,
    pub workloads: Vec<Workload>,
    /// cells[w][t], for notes and skips.
    notes: Vec<Vec<(Option<String>, Option<String>)>>,
    pub rows: Vec<Row>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

impl Report {
    pub fn new(
        args: &BenchArgs,
        plan: &Plan,
        targets: &[Target],
        workloads: &[Workload],
        cells: Vec<Vec<Cell>>,
    ) -> Report {
        let mut rows = Vec::new();
        let mut notes = Vec::new();
        for (wi, &w) in workloads.iter().enumerate() {
            let row_cells = &cells[wi];
            notes.push(
                row_cells
                    .iter()
                    .map(|c| (c.note.clone(), c.skipped.clone()))
                    .collect(),
            );
            // The figures this workload gives, from whichever target ran it.
            let Some(shape) = row_cells.iter().find_map(|c| c.runs.first()) else {
                continue;
            };
            for (mi, proto) in shape.iter().enumerate() {
                let values = row_cells
                    .iter()
                    .map(|c| {
                        if c.runs.is_empty() {
                            return None;
                        }
                        let runs: Vec<f64> = c.runs.iter().map(|r| r[mi].value).collect();
                        Some(Figure {
                            median: median(&runs),
                            runs,
                        })
                    })
                    .collect();
                rows.push(Row {
                    workload: w,
                    key: proto.key,
                    label: proto.label,
                    unit: proto.unit,
                    higher_is_better: proto.higher_is_better,
                    values,
                });
            }
        }
        Report {
            size: plan.size,
            runs: args.runs,
            qd: args.qd,
            targets: targets
                .iter()
                .map(|t| TargetInfo {
                    spec: t.spec.clone(),
                    kind: t.kind.name(),
                })
                .collect(),
            workloads: workloads.to_vec(),
            notes,
            rows,
        }
    }

    pub fn json(&self) -> Value {
        let targets: Vec<Value> = self
            .targets
            .iter()
            .enumerate()
            .map(|(ti, t)| {
                let mut results = Map::new();
                for (wi, w) in self.workloads.iter().enumerate() {
                    let (note, skipped) = &self.notes[wi][ti];
                    let entry = if let Some(why) = skipped {
                        json!({ "skipped": why })
                    } else {
                        let mut metrics = Map::new();
                        for row in self.rows.iter().filter(|r| r.workload == *w) {
                            if let Some(Some(f)) = row.values.get(ti) {
                                metrics.insert(
                                    row.key.to_string(),
                                    json!({
                                        "value": f.median,
                                        "unit": row.unit,
                                        "higher_is_better": row.higher_is_better,
                                        "ratio": row.ratio(ti),
                                        "runs": f.runs,
                                    }),
                                );
                            }
                        }
                        json!({ "metrics": metrics, "note": note })
                    };
                    results.insert(w.name().to_string(), entry);
                }
                json!({ "target": t.spec, "kind": t.kind, "results": results })
            })
            .collect();
        json!({
            "size_bytes": self.size,
            "runs": self.runs,
            "qd": self.qd,
            "workloads": self.workloads.iter().map(|w| w.name()).collect::<Vec<_>>(),
            "targets": targets,
        })
    }

    pub fn table(&self) -> String {
        let letters: Vec<String> = (0..self.targets.len()).map(letter).collect();
        let mut out = format!(
            "ramd bench: --size {} --runs {} --qd {} (medians; ratios to A)\n",
            human(self.size),
            self.runs,
            self.qd
        );
        for (i, t) in self.targets.iter().enumerate() {
            out.push_str(&format!("  {} = {} ({})\n", letters[i], t.spec, t.kind));
        }
        out.push('\n');
        let mut lines: Vec<Vec<String>> = Vec::new();
        let mut head = vec!["workload".into(), "figure".into(), "unit".into()];
        head.extend(letters.iter().cloned());
        lines.push(head);
        for row in &self.rows {
            let unit = if row.higher_is_better {
                row.unit.to_string()
            } else {
                format!("{} (lower better)", row.unit)
            };
            let mut l = vec![row.workload.name().to_string(), row.label.to_string(), unit];
            for (ti, v) in row.values.iter().enumerate() {
                l.push(match (v, row.ratio(ti)) {
                    (None, _) => "-".into(),
                    (Some(f), Some(r)) if ti > 0 => format!("{} ({:.2}x)", num(f.median), r),
                    (Some(f), _) => num(f.median),
                });
            }
            lines.push(l);
        }
        let cols = lines[0].len();
        let width: Vec<usize> = (0..cols)
            .map(|c| {
                lines
                    .iter()
                    .map(|l| l[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for l in &lines {
            let mut s = String::new();
            for (c, cell) in l.iter().enumerate() {
                let pad = width[c] - cell.chars().count();
                if c < 3 {
                    s.push_str(cell);
                    s.push_str(&" ".repeat(pad));
                } else {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(cell);
                }
                s.push_str("  ");
            }
            out.push_str(s.trim_end());
            out.push('\n');
        }
        let mut notes = String::new();
        for (wi, w) in self.workloads.iter().enumerate() {
            for (ti, (note, skipped)) in self.notes[wi].iter().enumerate() {
                if let Some(n) = skipped.as_ref().or(note.as_ref()) {
                    notes.push_str(&format!("  {} on {}: {n}\n", w.name(), letters[ti]));
                }
            }
        }
        if !notes.is_empty() {
            out.push_str("\nnotes:\n");
            out.push_str(&notes);
        }
        out
    }
}

/// A, B, … Z, then T27, T28, …
pub fn letter(i: usize) -> String {
    if i < 26 {
        ((b'A' + i as u8) as char).to_string()
    } else {
        format!("T{}", i + 1)
    }
}

/// Three significant figures or so: 123456, 1234, 123, 12.3, 1.23, 0.123.
pub fn num(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}
