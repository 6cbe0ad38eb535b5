//! `infgram ppl --plot FILE.png`: agreement of the ∞-gram's argmax with the actual token, and
//! the number of tokens, by effective n (suffix length + 1), like Figure 3 of the infini-gram
//! paper.

use anyhow::{anyhow, Result};
use infgram::service::score::PplReport;
use plotters::prelude::*;
use std::path::Path;

/// Draws the two panels into a PNG at `path` (the caller's temporary file: errors do not
/// name it).
pub fn agreement_by_n(report: &PplReport, path: &Path) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow!("cannot draw the plot: {e}");
    let rows: Vec<(usize, f64, u64)> = report
        .agreement_by_n
        .iter()
        .map(|(&n, a)| (n, 100.0 * a.rate(), a.tokens))
        .collect();
    let max_n = rows.iter().map(|r| r.0).max().unwrap_or(1) + 1;
    let max_tokens = rows.iter().map(|r| r.2).max().unwrap_or(1) as f64 * 1.1;
    let root = BitMapBackend::new(path, (900, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (top, bottom) = root.split_vertically(420);
    let mut chart = ChartBuilder::on(&top)
        .caption("∞-gram agreement by effective n", ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0usize..max_n, 0f64..100f64)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("effective n")
        .y_desc("agreement (%)")
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .draw_series(LineSeries::new(
            rows.iter().map(|r| (r.0, r.1)),
            BLUE.stroke_width(2),
        ))
        .map_err(|e| err(&e))?;
    chart
        .draw_series(
            rows.iter()
                .map(|r| Circle::new((r.0, r.1), 3, BLUE.filled())),
        )
        .map_err(|e| err(&e))?;
    let mut counts = ChartBuilder::on(&bottom)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d((0usize..max_n).into_segmented(), 0f64..max_tokens)
        .map_err(|e| err(&e))?;
    counts
        .configure_mesh()
        .x_desc("effective n")
        .y_desc("tokens")
        .draw()
        .map_err(|e| err(&e))?;
    counts
        .draw_series(
            Histogram::vertical(&counts)
                .style(RGBColor(120, 120, 200).filled())
                .data(rows.iter().map(|r| (r.0, r.2 as f64))),
        )
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
