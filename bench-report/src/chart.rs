//! PNG charts (plotters, bitmap backend). Text uses an embedded subset of DejaVu Sans
//! (`assets/`), so no system font is needed.

use std::path::Path;
use std::sync::OnceLock;

use anyhow::anyhow;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{register_font, FontStyle};

/// The embedded font (DejaVu Sans, printable ASCII + a few symbols; license in `assets/`).
const FONT: &[u8] = include_bytes!("../assets/DejaVuSans-subset.ttf");
const FAMILY: &str = "sans-serif";

fn ensure_font() -> anyhow::Result<()> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err(anyhow!("the embedded font could not be loaded"))
    }
}

/// One series of bars (one per category, `None` = no bar).
#[derive(Debug, Clone)]
pub struct BarSeries {
    /// Legend text.
    pub name: String,
    /// Values per category.
    pub values: Vec<Option<f64>>,
    /// Fill colour.
    pub color: RGBColor,
    /// Draw as an outline with a light fill (for projections).
    pub hollow: bool,
}

/// One panel: grouped bars over categories.
#[derive(Debug, Clone)]
pub struct Panel {
    /// Panel caption.
    pub title: String,
    /// Y axis description.
    pub y_label: String,
    /// Category names (x axis).
    pub categories: Vec<String>,
    /// Series (bars side by side within a category).
    pub series: Vec<BarSeries>,
}

impl Panel {
    /// A panel of `series` over `categories`.
    pub fn new(title: &str, y_label: &str, categories: &[String], series: Vec<BarSeries>) -> Panel {
        let (title, y_label, categories) = (title.into(), y_label.into(), categories.to_vec());
        Panel {
            title,
            y_label,
            categories,
            series,
        }
    }
}

/// Colours for servers: measured bars use these, projected ones a light fill with this outline.
pub const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];

fn lighten(c: RGBColor) -> RGBColor {
    let l = |v: u8| (v as u16 + (255 - v as u16) * 3 / 4) as u8;
    RGBColor(l(c.0), l(c.1), l(c.2))
}

/// Distinct values in first-seen order (the categories of a chart).
pub fn distinct<'a>(values: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for x in values {
        if !v.contains(x) {
            v.push(x.clone());
        }
    }
    v
}

/// One series per name over `cats`, coloured in palette order: the bar of name `i` over a
/// category is `value(i, category)`.
pub fn series(
    names: &[String],
    cats: &[String],
    hollow: bool,
    value: impl Fn(usize, &str) -> Option<f64>,
) -> Vec<BarSeries> {
    names
        .iter()
        .enumerate()
        .map(|(i, name)| BarSeries {
            name: name.clone(),
            values: cats.iter().map(|c| value(i, c)).collect(),
            color: PALETTE[i % PALETTE.len()],
            hollow,
        })
        .collect()
}

/// A value of a row for a chart, if it has one.
pub type Pick<'a, R> = &'a dyn Fn(&R) -> Option<f64>;

/// Per server: a solid `measured` bar series and a hollow `projected` one over `cats`, from the
/// row `find(server, category)` of each.
pub fn measured_and_projected<'r, R: 'r>(
    servers: &[String],
    cats: &[String],
    find: impl Fn(&str, &str) -> Option<&'r R>,
    measured: (&str, Pick<R>),
    projected: Pick<R>,
) -> Vec<BarSeries> {
    let mut series = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        let pick = |f: Pick<R>| -> Vec<Option<f64>> {
            cats.iter().map(|c| find(server, c).and_then(f)).collect()
        };
        for (name, f, hollow) in [
            (measured.0, measured.1, false),
            ("projected", projected, true),
        ] {
            series.push(BarSeries {
                name: format!("{server} {name}"),
                values: pick(f),
                color: PALETTE[i % PALETTE.len()],
                hollow,
            });
        }
    }
    series
}

/// Draws `panels` (side by side, two per row when more than two) with a title and footer lines
/// into a PNG, and says so on stderr.
pub fn draw(path: &Path, title: &str, panels: &[Panel], footer: &[String]) -> anyhow::Result<()> {
    ensure_font()?;
    let cols = panels.len().clamp(1, 2);
    let rows = panels.len().div_ceil(cols).max(1);
    let width = 900 * cols as u32;
    let footer_h = 22 * footer.len() as u32 + 10;
    let height = 40 + 600 * rows as u32 + footer_h;
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let (main, foot) = root.split_vertically(height - footer_h);
    let main = main
        .titled(title, (FAMILY, 26))
        .map_err(|e| anyhow!("{e}"))?;
    let areas = main.split_evenly((rows, cols));
    for (area, panel) in areas.iter().zip(panels) {
        draw_panel(area, panel)?;
    }
    for (i, line) in footer.iter().enumerate() {
        foot.draw(&Text::new(
            line.as_str(),
            (20, 4 + 22 * i as i32),
            (FAMILY, 15).into_font().color(&BLACK),
        ))
        .map_err(|e| anyhow!("{e}"))?;
    }
    root.present()
        .map_err(|e| anyhow!("cannot write {}: {e}", path.display()))?;
    eprintln!("chart written to {}", path.display());
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    p: &Panel,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let n = p.categories.len().max(1);
    let ymax = p
        .series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .fold(0.0f64, |a, &b| a.max(b));
    let ymax = if ymax > 0.0 { ymax * 1.45 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, (FAMILY, 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..ymax)
        .map_err(|e| anyhow!("{e}"))?;
    let cats = p.categories.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n + 1)
        .x_label_formatter(&move |x: &f64| {
            let r = x.round();
            if (x - r).abs() < 1e-6 && r >= 0.0 {
                cats.get(r as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc(p.y_label.as_str())
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 16))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    let k = p.series.len().max(1) as f64;
    let group = 0.84;
    let w = group / k;
    for (si, s) in p.series.iter().enumerate() {
        let x0 = |i: usize| i as f64 - group / 2.0 + si as f64 * w;
        let bars: Vec<(usize, f64)> = s
            .values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| (i, v)))
            .collect();
        let fill = if s.hollow { lighten(s.color) } else { s.color };
        let color = s.color;
        chart
            .draw_series(bars.iter().map(|&(i, v)| {
                Rectangle::new([(x0(i) + 0.01, 0.0), (x0(i) + w - 0.01, v)], fill.filled())
            }))
            .map_err(|e| anyhow!("{e}"))?
            .label(s.name.as_str())
            .legend(move |(x, y)| {
                Rectangle::new([(x, y - 6), (x + 14, y + 6)], fill.filled().stroke_width(1))
            });
        if s.hollow {
            chart
                .draw_series(bars.iter().map(|&(i, v)| {
                    Rectangle::new(
                        [(x0(i) + 0.01, 0.0), (x0(i) + w - 0.01, v)],
                        color.stroke_width(2),
                    )
                }))
                .map_err(|e| anyhow!("{e}"))?;
        }
        chart
            .draw_series(bars.iter().map(|&(i, v)| {
                Text::new(
                    format_value(v),
                    (x0(i) + w / 2.0, v + ymax * 0.012),
                    (FAMILY, 12)
                        .into_font()
                        .color(&BLACK)
                        .pos(Pos::new(HPos::Center, VPos::Bottom)),
                )
            }))
            .map_err(|e| anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FAMILY, 14))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

fn format_value(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_png() {
        let dir = std::env::temp_dir().join(format!("rpc-bench-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.png");
        let panel = Panel {
            title: "t".into(),
            y_label: "ms".into(),
            categories: vec!["none".into(), "2.5gbe".into()],
            series: vec![
                BarSeries {
                    name: "a".into(),
                    values: vec![Some(1.0), Some(2.0)],
                    color: PALETTE[0],
                    hollow: false,
                },
                BarSeries {
                    name: "b".into(),
                    values: vec![None, Some(2.5)],
                    color: PALETTE[0],
                    hollow: true,
                },
            ],
        };
        draw(
            &path,
            "title µs",
            &[panel.clone(), panel],
            &["footer".into()],
        )
        .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        std::fs::remove_dir_all(&dir).ok();
    }
}
