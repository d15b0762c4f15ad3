//! A hand-written SVG line chart (no plotting dependency), in the style of
//! the simulator's report: categorical x axis, linear y axis from 0.

use std::fmt::Write as _;

/// One line of a chart.
pub struct Series {
    /// Legend text.
    pub label: String,
    /// One value per x label.
    pub values: Vec<f64>,
    /// Dashed (for models and baselines).
    pub dashed: bool,
}

const COLORS: [&str; 4] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"];

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A chart of `series` over the categories `x_labels`.
pub fn line_chart(
    title: &str,
    x_title: &str,
    y_title: &str,
    x_labels: &[String],
    series: &[Series],
) -> String {
    const W: f64 = 820.0;
    const H: f64 = 480.0;
    const LEFT: f64 = 80.0;
    const TOP: f64 = 40.0;
    const PLOT_W: f64 = 500.0;
    const PLOT_H: f64 = 380.0;
    let max = series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .fold(0.0f64, f64::max);
    let y_max = nice_ceiling(max);
    let n = x_labels.len().max(2);
    let x = |i: usize| LEFT + 20.0 + i as f64 * (PLOT_W - 40.0) / (n - 1) as f64;
    let y = |v: f64| TOP + (1.0 - v / y_max) * PLOT_H;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"20\" text-anchor=\"middle\" font-size=\"13\">{}</text>",
        LEFT + PLOT_W / 2.0,
        xml_escape(title)
    );
    let _ = writeln!(
        svg,
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{PLOT_W}\" height=\"{PLOT_H}\" fill=\"none\" stroke=\"black\"/>"
    );
    for k in 0..=4 {
        let v = y_max * f64::from(k) / 4.0;
        let _ = writeln!(
            svg,
            "<line x1=\"{LEFT}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"#ddd\"/><text x=\"{2}\" y=\"{3:.1}\" text-anchor=\"end\">{4}</text>",
            y(v),
            LEFT + PLOT_W,
            LEFT - 5.0,
            y(v) + 4.0,
            super::thousands(v)
        );
    }
    for (i, label) in x_labels.iter().enumerate() {
        let _ = writeln!(
            svg,
            "<line x1=\"{0:.1}\" y1=\"{TOP}\" x2=\"{0:.1}\" y2=\"{1}\" stroke=\"#eee\"/><text x=\"{0:.1}\" y=\"{2}\" text-anchor=\"middle\">{3}</text>",
            x(i),
            TOP + PLOT_H,
            TOP + PLOT_H + 15.0,
            xml_escape(label)
        );
    }
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
        LEFT + PLOT_W / 2.0,
        TOP + PLOT_H + 35.0,
        xml_escape(x_title)
    );
    let _ = writeln!(
        svg,
        "<text transform=\"translate(18,{:.1}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
        TOP + PLOT_H / 2.0,
        xml_escape(y_title)
    );
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let dash = if s.dashed {
            " stroke-dasharray=\"6,3\""
        } else {
            ""
        };
        let points: Vec<String> = s
            .values
            .iter()
            .enumerate()
            .map(|(k, v)| format!("{:.1},{:.1}", x(k), y(*v)))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{color}\"{dash} stroke-width=\"2\" points=\"{}\"/>",
            points.join(" ")
        );
        for (k, v) in s.values.iter().enumerate() {
            let _ = writeln!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"/>",
                x(k),
                y(*v)
            );
        }
        let ly = TOP + 10.0 + i as f64 * 18.0;
        let _ = writeln!(
            svg,
            "<line x1=\"{0}\" y1=\"{ly}\" x2=\"{1}\" y2=\"{ly}\" stroke=\"{color}\"{dash} stroke-width=\"3\"/><text x=\"{2}\" y=\"{3}\">{4}</text>",
            LEFT + PLOT_W + 15.0,
            LEFT + PLOT_W + 35.0,
            LEFT + PLOT_W + 40.0,
            ly + 4.0,
            xml_escape(&s.label)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// The smallest of 1, 2, 5 × 10^k at or above `v` (1 for nothing positive).
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let decade = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * decade)
        .find(|c| *c >= v)
        .unwrap_or(10.0 * decade)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_are_nice() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(3.0), 5.0);
        assert_eq!(nice_ceiling(12_000.0), 20_000.0);
        assert_eq!(nice_ceiling(100.0), 100.0);
    }

    #[test]
    fn chart_has_one_polyline_per_series() {
        let svg = line_chart(
            "t",
            "x",
            "y",
            &["1".to_string(), "8".to_string()],
            &[
                Series {
                    label: "a".into(),
                    values: vec![1.0, 2.0],
                    dashed: false,
                },
                Series {
                    label: "b".into(),
                    values: vec![2.0, 3.0],
                    dashed: true,
                },
            ],
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.ends_with("</svg>\n"));
    }
}
