// The report's latency chart, drawn with Chart.js from the report JSON (GET /v1/models/{id}/report's body):
// per target and shape, p50 bars with p90 and p99, version N-1's p50 where the report matched one, and the p50
// deploy machines measured (the fleet, `enginefarm measure`) beside the farm's own, never mixed into it.
// Export: the chart as PNG, the rows as CSV.
"use strict";

const COLOURS = { p50: "#0b5cad", p90: "#e36209", p99: "#a40e26", previous: "#8c959f", fleet: "#1a7f37" };

function fleetFigure(row) {  // the GPU model's class before the compute capability's, as resolve ranks them
  const figures = row.fleet || [];
  return figures.find((f) => f.device_class.startsWith("fleet:gpu:")) || figures[0] || null;
}

function measured(report, shape) {
  return report.rows.filter((r) => ((r.status === "measured" && r.latency_ms) || fleetFigure(r))
                                   && (!shape || !r.shape_key || r.shape_key === shape));
}

function label(row) {  // two lines under the bar group; the device is in the tooltip
  return [row.target, `${row.variant ? row.variant + " · " : ""}${row.shape_key || row.precision}`];
}

function datasets(rows, hasPrevious) {
  const sets = [
    { label: "p50", data: rows.map((r) => r.latency_ms?.median ?? null), backgroundColor: COLOURS.p50 },
    { label: "p90", data: rows.map((r) => r.latency_ms?.p90 ?? null), backgroundColor: COLOURS.p90 },
    { label: "p99", data: rows.map((r) => r.latency_ms?.p99 ?? null), backgroundColor: COLOURS.p99 },
  ];
  if (rows.some(fleetFigure)) {
    sets.push({ label: "p50 measured on the fleet", data: rows.map((r) => fleetFigure(r)?.median_ms ?? null),
                on: rows.map((r) => fleetFigure(r)?.label ?? ""), backgroundColor: COLOURS.fleet });
  }
  if (hasPrevious) {
    sets.push({ label: "p50, version N-1", data: rows.map((r) => (r.regression ? r.regression.median_ms : null)),
                backgroundColor: COLOURS.previous });
  }
  return sets;
}

function csv(report) {
  const head = ["model", "version", "engine_id", "target", "variant", "precision", "shape", "device", "status",
                "p50_ms", "p90_ms", "p99_ms", "mean_ms", "throughput_qps", "previous_p50_ms", "accuracy",
                "fleet_p50_ms", "fleet_measured_on"];
  const quote = (v) => (v === null || v === undefined ? "" : /[",\n]/.test(String(v)) ? `"${String(v).replace(/"/g, '""')}"` : String(v));
  const lines = report.rows.map((r) => [report.model.name, report.model.version, r.engine_id, r.target, r.variant,
    r.precision, r.shape_key, r.device, r.status, r.latency_ms?.median, r.latency_ms?.p90, r.latency_ms?.p99,
    r.latency_ms?.mean, r.throughput_qps, r.regression?.median_ms,
    r.accuracy ? (r.accuracy.pass ? "pass" : "fail") : "", fleetFigure(r)?.median_ms, fleetFigure(r)?.label]
    .map(quote).join(","));
  return [head.join(","), ...lines].join("\n") + "\n";
}

function download(href, filename) {
  const a = document.createElement("a");
  a.href = href; a.download = filename;
  document.body.appendChild(a); a.click(); a.remove();
}

async function drawReport() {
  const figure = document.getElementById("latency-figure");
  if (!figure) return;
  const status = document.getElementById("chart-status");
  const canvas = document.getElementById("latency-chart");
  const filter = document.getElementById("shape-filter");
  const answer = await fetch(figure.dataset.report, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (!answer.ok) { status.textContent = `The report could not be read (${answer.status}).`; return; }
  const report = await answer.json();
  const shapes = [...new Set(measured(report, "").map((r) => r.shape_key))].sort();
  for (const s of shapes) { const o = document.createElement("option"); o.value = s; o.textContent = s; filter.appendChild(o); }
  const hasPrevious = Boolean(report.previous) && report.rows.some((r) => r.regression);
  let rows = measured(report, "");
  // A shared CPU's p99 can be 50 times its p50: then a logarithmic axis keeps the p50 bars readable.
  const logScale = document.getElementById("log-scale");
  logScale.checked = rows.some((r) => r.latency_ms?.p99 && r.latency_ms.p99 > 10 * r.latency_ms.median);
  function yAxis() {  // a log axis starts at the power of ten below the smallest bar, or that bar is not drawn
    if (!logScale.checked) return { type: "linear", beginAtZero: true, min: undefined };
    const values = chartValues().filter((v) => v > 0);
    const low = values.length ? Math.pow(10, Math.floor(Math.log10(Math.min(...values)))) : undefined;
    return { type: "logarithmic", beginAtZero: false, min: low };
  }
  function chartValues() {
    return datasets(rows, hasPrevious).flatMap((d) => d.data).filter((v) => v !== null && v !== undefined);
  }
  const chart = new Chart(canvas, {
    type: "bar",
    data: { labels: rows.map(label), datasets: datasets(rows, hasPrevious) },
    options: {
      responsive: true, maintainAspectRatio: false, animation: false,
      plugins: {
        legend: { position: "bottom" },
        tooltip: { callbacks: {
          label: (c) => `${c.dataset.label}: ${c.parsed.y === null ? "–" : c.parsed.y.toFixed(3)} ms`
            + (c.dataset.on && c.dataset.on[c.dataIndex] ? ` on ${c.dataset.on[c.dataIndex]}` : ""),
          afterTitle: (items) => (items.length && rows[items[0].dataIndex].device) || "" } },
        title: { display: true, text: `${report.model.name} ${report.model.version}: end-to-end latency (ms)` },
      },
      scales: { y: { ...yAxis(), title: { display: true, text: "milliseconds" } },
                x: { ticks: { autoSkip: false, maxRotation: 60 } } },
    },
    plugins: [{ id: "white", beforeDraw: (c) => { // a PNG export with a background, not a transparent one
      const ctx = c.canvas.getContext("2d"); ctx.save(); ctx.globalCompositeOperation = "destination-over";
      ctx.fillStyle = "#ffffff"; ctx.fillRect(0, 0, c.width, c.height); ctx.restore(); } }],
  });
  function show() {
    figure.dataset.points = String(rows.length);
    figure.dataset.series = chart.data.datasets.map((d) => d.label).join("|");
    status.textContent = rows.length
      ? `${rows.length} measurement(s) of ${new Set(rows.map((r) => r.target)).size} target(s)${hasPrevious ? ", with version " + report.previous.version : ""}.`
      : "No measurements yet: an engine is measured once a worker that can run it has benchmarked it.";
  }
  filter.addEventListener("change", () => {
    rows = measured(report, filter.value);
    chart.data.labels = rows.map(label);
    chart.data.datasets = datasets(rows, hasPrevious);
    Object.assign(chart.options.scales.y, yAxis());
    chart.update();
    show();
  });
  logScale.addEventListener("change", () => {
    Object.assign(chart.options.scales.y, yAxis());
    chart.update();
  });
  show();
  const name = figure.dataset.name || "report";
  document.getElementById("export-png").addEventListener("click", () => download(chart.toBase64Image("image/png"), `${name}-latency.png`));
  document.getElementById("export-csv").addEventListener("click", () => {
    const url = URL.createObjectURL(new Blob([csv(report)], { type: "text/csv" }));
    download(url, `${name}-latency.csv`);
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  });
}

document.addEventListener("DOMContentLoaded", () => { drawReport().catch((e) => {
  document.getElementById("chart-status").textContent = `The chart could not be drawn: ${e}`; }); });
