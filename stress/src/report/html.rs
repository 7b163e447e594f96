//! Self-contained HTML report: verdict table, totals, and inline SVG plots of
//! latency and throughput over time per scenario. No JavaScript, no external
//! resources, so the file opens anywhere (CI artifacts, air-gapped clusters).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{Report, ScenarioReport};

const COLORS: [&str; 8] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

pub fn render(r: &Report) -> String {
    let mut o = String::with_capacity(64 * 1024);
    let verdict_color = if r.passed() { "#2ca02c" } else { "#d62728" };
    let _ = write!(
        o,
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>Mailcluster stress {id}</title><style>\
body{{font-family:sans-serif;margin:2em;color:#222}}table{{border-collapse:collapse;margin:1em 0}}\
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}th{{background:#f4f4f4}}\
td.l,th.l{{text-align:left}}.pass{{color:#2ca02c;font-weight:bold}}.fail{{color:#d62728;font-weight:bold}}\
.nodata{{color:#888}}svg{{background:#fff;border:1px solid #ddd;margin:0.5em 0.5em 0.5em 0}}</style></head><body>\
<h1>Mailcluster stress run {id}</h1><p>{start} → {end}</p>\
<h2 style=\"color:{verdict_color}\">Verdict: {verdict}</h2><p>Success rate {sr:.3}%</p>",
        id = esc(&r.run_id),
        start = esc(&r.started_at),
        end = esc(&r.finished_at),
        verdict = esc(&r.verdict),
        sr = r.success_rate,
    );
    if r.interrupted {
        o.push_str("<p class=\"fail\">Interrupted: partial report.</p>");
    }
    let g = &r.generator;
    let _ = write!(
        o,
        "<p>Generator: CPU mean {:.0}%, max {:.0}% of {} worker thread(s); scheduling lag P99 {:.1} ms{}</p>",
        g.cpu_mean_percent,
        g.cpu_max_percent,
        g.worker_threads,
        g.lag_p99_ms,
        if g.saturated {
            format!(" — <span class=\"fail\">SATURATED: {}</span>", esc(g.reason.as_deref().unwrap_or("")))
        } else {
            String::new()
        }
    );
    o.push_str("<h2>SLO</h2><table><tr><th class=\"l\">scope</th><th class=\"l\">threshold</th><th>actual</th><th>result</th></tr>");
    for s in &r.slo {
        let (class, text) = match s.pass {
            Some(true) => ("pass", "PASS"),
            Some(false) => ("fail", "FAIL"),
            None => ("nodata", "no data"),
        };
        let actual = s.actual.map_or(String::from("–"), |a| format!("{a:.3}"));
        let _ = write!(
            o,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{actual}</td><td class=\"{class}\">{text}</td></tr>",
            esc(&s.scope),
            esc(&s.threshold)
        );
    }
    o.push_str("</table>");
    for s in &r.scenarios {
        scenario(&mut o, s);
    }
    o.push_str("</body></html>\n");
    o
}

fn scenario(o: &mut String, s: &ScenarioReport) {
    let mode = s.rate.map_or("closed loop".to_string(), |r| format!("open loop {r}/s"));
    let _ = write!(
        o,
        "<h2>{} <small>({}, {} workers, {mode}, {:.1} s)</small></h2>",
        esc(&s.name),
        esc(&s.kind),
        s.concurrency,
        s.elapsed_s
    );
    o.push_str(
        "<table><tr><th class=\"l\">operation</th><th>count</th><th>errors</th><th>success</th><th>ops/s</th>\
<th>p50 ms</th><th>p90 ms</th><th>p95 ms</th><th>p99 ms</th><th>p99.9 ms</th><th>max ms</th><th class=\"l\">errors by kind</th></tr>",
    );
    for (name, op) in &s.ops {
        let errs: Vec<String> = op.errors_by_kind.iter().map(|(k, n)| format!("{}: {n}", esc(k))).collect();
        let label = if op.primary { esc(name) } else { format!("({})", esc(name)) };
        let _ = write!(
            o,
            "<tr><td class=\"l\">{label}</td><td>{}</td><td>{}</td><td>{:.2}%</td><td>{:.1}</td><td>{:.2}</td>\
<td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td>{:.2}</td><td class=\"l\">{}</td></tr>",
            op.count,
            op.errors,
            op.success_rate,
            op.throughput,
            op.p50_ms,
            op.p90_ms,
            op.p95_ms,
            op.p99_ms,
            op.p999_ms,
            op.max_ms,
            errs.join(", ")
        );
    }
    o.push_str("</table>");
    if s.backlog > 0 {
        let _ =
            write!(o, "<p class=\"fail\">{} operations were due and never sent (backlog).</p>", s.backlog);
    }
    // Plots of primary operations only: auxiliary ones (connects) would crowd them.
    let primary: Vec<&String> = s.ops.iter().filter(|(_, v)| v.primary).map(|(k, _)| k).collect();
    let mut lat: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut tput: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for p in s.series.iter().filter(|p| primary.contains(&&p.op)) {
        let t = p.second as f64;
        if p.ok > 0 {
            lat.entry(format!("{} p50", p.op)).or_default().push((t, p.p50_ms));
            lat.entry(format!("{} p99", p.op)).or_default().push((t, p.p99_ms));
        }
        tput.entry(format!("{} ok/s", p.op)).or_default().push((t, p.ok as f64));
        if p.errors > 0 || tput.contains_key(&format!("{} errors/s", p.op)) {
            tput.entry(format!("{} errors/s", p.op)).or_default().push((t, p.errors as f64));
        }
    }
    o.push_str(&chart("Latency over time", "ms", &lat));
    o.push_str(&chart("Throughput over time", "ops/s", &tput));
    let cpu: BTreeMap<String, Vec<(f64, f64)>> = [(
        "generator CPU %".to_string(),
        s.generator_series.iter().map(|g| (g.second as f64, g.cpu_percent)).collect(),
    )]
    .into_iter()
    .collect();
    o.push_str(&chart("Generator CPU", "%", &cpu));
}

/// A line chart as inline SVG.
pub fn chart(title: &str, unit: &str, series: &BTreeMap<String, Vec<(f64, f64)>>) -> String {
    let (w, h, left, right, top, bottom) = (720.0, 260.0, 60.0, 170.0, 28.0, 30.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let xmax = series.values().flatten().map(|p| p.0).fold(1.0f64, f64::max);
    let ymax = nice(series.values().flatten().map(|p| p.1).filter(|v| v.is_finite()).fold(0.0f64, f64::max));
    let mut o = String::new();
    let _ = write!(
        o,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\">\
<text x=\"{left}\" y=\"18\" font-size=\"14\" font-weight=\"bold\">{}</text>",
        esc(title)
    );
    for i in 0..=4 {
        let v = ymax * i as f64 / 4.0;
        let y = top + ph - ph * i as f64 / 4.0;
        let _ = write!(
            o,
            "<line x1=\"{left}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#eee\"/>\
<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\">{}</text>",
            left + pw,
            left - 4.0,
            y + 3.0,
            fmt_num(v)
        );
    }
    let _ = write!(
        o,
        "<text x=\"12\" y=\"{:.1}\" font-size=\"10\" transform=\"rotate(-90 12 {:.1})\">{}</text>\
<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"middle\">seconds (0–{})</text>\
<rect x=\"{left}\" y=\"{top}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#999\"/>",
        top + ph / 2.0,
        top + ph / 2.0,
        esc(unit),
        left + pw / 2.0,
        h - 8.0,
        xmax
    );
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = pts
            .iter()
            .filter(|p| p.1.is_finite())
            .map(|(x, y)| format!("{:.1},{:.1}", left + pw * x / xmax, top + ph - ph * (y / ymax).min(1.0)))
            .collect();
        let _ = write!(
            o,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>\
<rect x=\"{:.1}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{color}\"/>\
<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\">{}</text>",
            path.join(" "),
            left + pw + 10.0,
            top + 14.0 * i as f64,
            left + pw + 24.0,
            top + 14.0 * i as f64 + 9.0,
            esc(name)
        );
    }
    o.push_str("</svg>");
    o
}

/// Round an axis maximum up to 1, 2 or 5 × 10^n.
fn nice(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    let e = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if v <= m * e {
            return m * e;
        }
    }
    10.0 * e
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 || v == 0.0 { format!("{v:.0}") } else { format!("{v:.2}") }
}

pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_and_escape() {
        assert_eq!(nice(0.0), 1.0);
        assert_eq!(nice(7.0), 10.0);
        assert_eq!(nice(130.0), 200.0);
        assert_eq!(esc("<a&\"b>"), "&lt;a&amp;&quot;b&gt;");
        let s: BTreeMap<String, Vec<(f64, f64)>> =
            [("x p99".to_string(), vec![(1.0, 5.0), (2.0, 8.0)])].into_iter().collect();
        let svg = chart("T", "ms", &s);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("polyline") && svg.contains("x p99"));
    }
}
