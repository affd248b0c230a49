//! The charts, drawn with plotters' SVG backend and no font crate: plotters only estimates text
//! widths, and the SVG's `<text>` elements are laid out by whatever renders the file.

use std::collections::BTreeSet;

use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use tandem_engine::bench::results::{BenchResult, Spread};

use super::markdown::{axis_number, number, percent};
use super::series_label;

const WIDTH: u32 = 1000;
const FONT: &str = "sans-serif";
/// A rough width of one character at the label size, for laying out legends and row labels.
const CHAR_PX: u32 = 7;

/// Dark, distinguishable colours on white (Tableau 10).
const COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

fn colour(i: usize) -> RGBColor {
    COLOURS[i % COLOURS.len()]
}

/// A point marker.
#[derive(Clone, Copy)]
enum Marker {
    Circle,
    Triangle,
    Square,
}

/// How one series is drawn: past ten series the colours repeat with another dash and marker.
#[derive(Clone, Copy)]
struct Look {
    colour: RGBColor,
    /// Dash and gap lengths in pixels; solid when `None`.
    dash: Option<(u32, u32)>,
    marker: Marker,
}

fn look(i: usize) -> Look {
    let (dash, marker) = match (i / COLOURS.len()) % 3 {
        0 => (None, Marker::Circle),
        1 => (Some((9, 5)), Marker::Triangle),
        _ => (Some((3, 4)), Marker::Square),
    };
    Look {
        colour: colour(i),
        dash,
        marker,
    }
}

/// Draws a polyline in a series' look on any drawing area.
fn draw_line<DB, CT>(area: &DrawingArea<DB, CT>, points: Vec<CT::From>, look: Look) -> Result<(), String>
where
    DB: DrawingBackend,
    CT: CoordTranslate,
    CT::From: Clone,
{
    let style = look.colour.stroke_width(2);
    match look.dash {
        None => area.draw(&PathElement::new(points, style)),
        Some((dash, gap)) => area.draw(&DashedPathElement::new(points, dash, gap, style)),
    }
    .map_err(|e| e.to_string())
}

/// Draws a series' marker at `at` on any drawing area.
fn draw_marker<DB, CT>(area: &DrawingArea<DB, CT>, at: CT::From, look: Look) -> Result<(), String>
where
    DB: DrawingBackend,
    CT: CoordTranslate,
{
    let style = look.colour.filled();
    match look.marker {
        Marker::Circle => area.draw(&Circle::new(at, 4, style)),
        Marker::Triangle => area.draw(&TriangleMarker::new(at, 6, style)),
        Marker::Square => area.draw(&(EmptyElement::at(at) + Rectangle::new([(-4, -4), (4, 4)], style))),
    }
    .map_err(|e| e.to_string())
}

/// One line of the tokens/s chart.
struct Series {
    label: String,
    /// (index of the batch size on the x axis, decode tokens/s spread)
    points: Vec<(usize, Spread)>,
}

/// Groups the runs by (tool, backend, model, dtype) and lists the batch sizes on the x axis.
fn tokens_series(results: &[BenchResult]) -> (Vec<u32>, Vec<Series>) {
    let batches: Vec<u32> = results
        .iter()
        .flat_map(|r| r.runs.iter().map(|run| run.batch))
        .collect::<BTreeSet<u32>>()
        .into_iter()
        .collect();
    let mut series: Vec<Series> = Vec::new();
    for r in results {
        let label = series_label(r);
        let index = match series.iter().position(|s| s.label == label) {
            Some(i) => i,
            None => {
                series.push(Series {
                    label,
                    points: Vec::new(),
                });
                series.len() - 1
            }
        };
        for run in &r.runs {
            if let Some(x) = batches.iter().position(|&b| b == run.batch) {
                series[index].points.push((x, run.decode_tokens_per_s));
            }
        }
    }
    for s in &mut series {
        s.points.sort_by_key(|&(x, _)| x);
    }
    (batches, series)
}

fn text_style(size: u32) -> TextStyle<'static> {
    (FONT, size).into_font().color(&BLACK)
}

/// A legend of coloured entries laid out in columns; returns the height it needs.
fn legend_height(labels: &[String]) -> u32 {
    let (_, rows) = legend_grid(labels);
    rows * 22 + 16
}

fn legend_grid(labels: &[String]) -> (u32, u32) {
    let longest = labels.iter().map(|l| l.chars().count() as u32).max().unwrap_or(0);
    let column = longest * CHAR_PX + 48;
    let columns = ((WIDTH - 60) / column.max(1)).clamp(1, 4);
    let n = labels.len() as u32;
    (columns, n.div_ceil(columns).max(1))
}

/// How a legend entry shows what it names.
#[derive(Clone, Copy)]
enum Swatch {
    /// A series of points: its line and marker.
    Series(Look),
    /// A kind of bar: a filled box.
    Bar(RGBColor),
}

fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    entries: &[(String, Swatch)],
) -> Result<(), String> {
    let labels: Vec<String> = entries.iter().map(|(l, _)| l.clone()).collect();
    let (columns, _) = legend_grid(&labels);
    let column_px = ((WIDTH - 60) / columns) as i32;
    for (i, (label, swatch)) in entries.iter().enumerate() {
        let col = (i as u32 % columns) as i32;
        let row = (i as u32 / columns) as i32;
        let x = 60 + col * column_px;
        let y = 12 + row * 22;
        match *swatch {
            Swatch::Series(look) => {
                draw_line(area, vec![(x, y), (x + 28, y)], look)?;
                draw_marker(area, (x + 14, y), look)?;
            }
            Swatch::Bar(c) => {
                area.draw(&Rectangle::new([(x + 4, y - 7), (x + 24, y + 7)], c.filled()))
                    .map_err(|e| e.to_string())?;
            }
        }
        area.draw(&Text::new(
            label.clone(),
            (x + 36, y),
            text_style(14).pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The SVG of decode tokens/s by batch size, one line per (tool, backend, model, dtype), with
/// min–max bars; the y axis is logarithmic when the values span more than 30×.
pub fn tokens_chart(results: &[BenchResult]) -> Result<String, String> {
    let (batches, series) = tokens_series(results);
    let values: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter())
        .flat_map(|(_, sp)| [sp.median, sp.min, sp.max])
        .filter(|v| v.is_finite())
        .collect();
    let hi = values.iter().copied().fold(0.0f64, f64::max);
    let lo = values
        .iter()
        .copied()
        .filter(|&v| v > 0.0)
        .fold(f64::INFINITY, f64::min);
    let log = lo.is_finite() && hi / lo > 30.0;
    let labels: Vec<String> = series.iter().map(|s| s.label.clone()).collect();
    let legend_h = legend_height(&labels);
    let height = 520 + legend_h;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (top, bottom) = root.split_vertically(520);
        let title = if log {
            "Decode tokens/s by batch size (log scale)"
        } else {
            "Decode tokens/s by batch size"
        };
        let n = batches.len().max(1) as f64;
        let x_range = -0.5..(n - 0.5);
        let mut builder = ChartBuilder::on(&top);
        builder
            .caption(title, text_style(22))
            .margin(16)
            .margin_right(30)
            .x_label_area_size(50)
            .y_label_area_size(80);
        if log {
            let chart = builder
                .build_cartesian_2d(x_range, (lo / 1.5..hi * 1.5).log_scale())
                .map_err(|e| e.to_string())?;
            draw_tokens(chart, &batches, &series, true)?;
        } else {
            let top_y = if hi > 0.0 { hi * 1.12 } else { 1.0 };
            let chart = builder
                .build_cartesian_2d(x_range, 0.0..top_y)
                .map_err(|e| e.to_string())?;
            draw_tokens(chart, &batches, &series, false)?;
        }
        let entries: Vec<(String, Swatch)> = labels
            .iter()
            .enumerate()
            .map(|(i, l)| (l.clone(), Swatch::Series(look(i))))
            .collect();
        draw_legend(&bottom, &entries)?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

fn draw_tokens<DB, Y>(
    mut chart: ChartContext<'_, DB, Cartesian2d<RangedCoordf64, Y>>,
    batches: &[u32],
    series: &[Series],
    log: bool,
) -> Result<(), String>
where
    DB: DrawingBackend,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let x_label = |x: &f64| -> String {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 {
            batches.get(i as usize).map_or_else(String::new, u32::to_string)
        } else {
            String::new()
        }
    };
    // On a log axis the labels are drawn below with the 1-2-5 grid.
    let y_label = |y: &f64| if log { String::new() } else { axis_number(*y) };
    let mut mesh = chart.configure_mesh();
    mesh.x_labels(batches.len().max(1))
        .x_label_formatter(&x_label)
        .y_label_formatter(&y_label)
        .disable_x_mesh()
        .light_line_style(RGBColor(240, 240, 240))
        .bold_line_style(RGBColor(215, 215, 215))
        .x_desc("batch size (sequences decoded together)")
        .y_desc("decode tokens/s, summed over the batch")
        .label_style(text_style(14))
        .axis_desc_style(text_style(15));
    if log {
        // plotters' log axis labels only the powers of ten: draw the 1-2-5 grid here instead.
        mesh.disable_y_mesh().y_labels(0);
    }
    mesh.draw().map_err(|e| e.to_string())?;
    if log {
        let x_range = chart.x_range();
        let y_range = chart.y_range();
        let grid = RGBColor(215, 215, 215);
        for tick in log_ticks(y_range.start, y_range.end) {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(x_range.start, tick), (x_range.end, tick)],
                    grid.stroke_width(1),
                )))
                .map_err(|e| e.to_string())?;
            chart
                .draw_series(std::iter::once(
                    EmptyElement::at((x_range.start, tick))
                        + PathElement::new(vec![(-5, 0), (0, 0)], BLACK.stroke_width(1))
                        + Text::new(
                            if tick >= 1.0 {
                                format!("{tick:.0}")
                            } else {
                                format!("{tick}")
                            },
                            (-8, 0),
                            text_style(14).pos(Pos::new(HPos::Right, VPos::Center)),
                        ),
                ))
                .map_err(|e| e.to_string())?;
        }
    }
    let count = series.len().max(1) as f64;
    let area = chart.plotting_area();
    for (i, s) in series.iter().enumerate() {
        let look = look(i);
        let c = look.colour;
        // Spread the series a little along x so their min–max bars do not overlap.
        let shift = if series.len() > 1 {
            (i as f64 / (count - 1.0) - 0.5) * 0.08
        } else {
            0.0
        };
        let points: Vec<(f64, f64)> = s
            .points
            .iter()
            .map(|&(x, sp)| (x as f64 + shift, sp.median))
            .collect();
        draw_line(area, points.clone(), look)?;
        for &(x, sp) in &s.points {
            let x = x as f64 + shift;
            area.draw(&PathElement::new(
                vec![(x, sp.min), (x, sp.max)],
                c.stroke_width(1),
            ))
            .map_err(|e| e.to_string())?;
        }
        for &(x, y) in &points {
            draw_marker(area, (x, y), look)?;
            // Each median written beside its point, while there are few enough to read.
            if series.len() <= 6 {
                area.draw(
                    &(EmptyElement::at((x, y))
                        + Text::new(
                            number(y),
                            (8, -4),
                            text_style(12).color(&c).pos(Pos::new(HPos::Left, VPos::Bottom)),
                        )),
                )
                .map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(())
}

/// 1, 2 and 5 times the powers of ten within `lo..=hi` (both positive).
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    if !(lo > 0.0 && hi > lo && hi.is_finite()) {
        return ticks;
    }
    let mut power = 10f64.powf(lo.log10().floor());
    while power <= hi {
        for m in [1.0, 2.0, 5.0] {
            let t = m * power;
            if t >= lo && t <= hi {
                ticks.push(t);
            }
        }
        power *= 10.0;
    }
    ticks
}

/// The SVG of each run's decode bandwidth fraction and prefill FLOP fraction, as horizontal
/// bars against a line at 1.0 (the limit measured in the same run).
pub fn roofline_chart(results: &[BenchResult]) -> Result<String, String> {
    let rows: Vec<(String, f64, f64)> = results
        .iter()
        .flat_map(|r| {
            r.runs.iter().map(move |run| {
                (
                    format!("{} · batch {}", series_label(r), run.batch),
                    run.decode_bandwidth_fraction,
                    run.prefill_flops_fraction,
                )
            })
        })
        .collect();
    let longest = rows
        .iter()
        .map(|(l, _, _)| l.chars().count() as u32)
        .max()
        .unwrap_or(10);
    let label_w = (longest * CHAR_PX + 24).clamp(120, 520);
    let row_h = 34;
    let n = rows.len().max(1);
    let plot_h = n as u32 * row_h;
    let height = plot_h + 160;
    let top_x = rows
        .iter()
        .flat_map(|&(_, a, b)| [a, b])
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::max)
        * 1.15;
    let bandwidth_colour = colour(0);
    let flops_colour = colour(1);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (top, bottom) = root.split_vertically(height - 40);
        let mut chart = ChartBuilder::on(&top)
            .caption("Fraction of the limits measured in the same run", text_style(22))
            .margin(16)
            .margin_right(30)
            .x_label_area_size(50)
            .y_label_area_size(label_w)
            .build_cartesian_2d(0.0..top_x, 0.0..n as f64)
            .map_err(|e| e.to_string())?;
        let x_label = |x: &f64| format!("{:.0}%", x * 100.0);
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(0)
            .x_label_formatter(&x_label)
            .light_line_style(RGBColor(240, 240, 240))
            .bold_line_style(RGBColor(215, 215, 215))
            .x_desc("fraction of the limit (decode: copy bandwidth; prefill: matmul peak)")
            .label_style(text_style(14))
            .axis_desc_style(text_style(15))
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, (label, bw, fl)) in rows.iter().enumerate() {
            // Row 0 at the top.
            let y0 = (n - 1 - i) as f64;
            let bars = [
                (*bw, y0 + 0.5, y0 + 0.88, bandwidth_colour),
                (*fl, y0 + 0.12, y0 + 0.5, flops_colour),
            ];
            for (v, lo, hi, c) in bars {
                let v = if v.is_finite() { v.max(0.0) } else { 0.0 };
                chart
                    .draw_series(std::iter::once(Rectangle::new([(0.0, lo), (v, hi)], c.filled())))
                    .map_err(|e| e.to_string())?;
                let (px, py) = chart.backend_coord(&(v, (lo + hi) / 2.0));
                root.draw(&Text::new(
                    percent(v),
                    (px + 5, py),
                    text_style(12).pos(Pos::new(HPos::Left, VPos::Center)),
                ))
                .map_err(|e| e.to_string())?;
            }
            let (px, py) = chart.backend_coord(&(0.0, y0 + 0.5));
            root.draw(&Text::new(
                label.clone(),
                (px - 8, py),
                text_style(13).pos(Pos::new(HPos::Right, VPos::Center)),
            ))
            .map_err(|e| e.to_string())?;
        }
        if rows.is_empty() {
            let (px, py) = chart.backend_coord(&(top_x / 2.0, 0.5));
            root.draw(&Text::new(
                "no runs",
                (px, py),
                text_style(16).pos(Pos::new(HPos::Center, VPos::Center)),
            ))
            .map_err(|e| e.to_string())?;
        }
        let limit = RGBColor(200, 0, 0);
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(1.0, 0.0), (1.0, n as f64)],
                limit.stroke_width(2),
            )))
            .map_err(|e| e.to_string())?;
        let (px, py) = chart.backend_coord(&(1.0, n as f64));
        root.draw(&Text::new(
            "limit (1.0)",
            (px + 4, py + 4),
            text_style(12).color(&limit).pos(Pos::new(HPos::Left, VPos::Top)),
        ))
        .map_err(|e| e.to_string())?;
        let entries = [
            (
                "decode: bytes per step / step time ÷ copy bandwidth".to_string(),
                Swatch::Bar(bandwidth_colour),
            ),
            (
                "prefill: FLOP/s ÷ matmul peak".to_string(),
                Swatch::Bar(flops_colour),
            ),
        ];
        draw_legend(&bottom, &entries)?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}
