// An accuracy repair's ranking as horizontal bars, drawn with Chart.js from the figure's data-ranking (the repair's
// ranking as the API answers it: ONNX node names, the measured gain with them alone in float, and whether the repair
// kept them in fp32) and data-precision. int8: the output cosine gained with a tensor alone in float; fp16: the share
// of output elements brought within the fp16 tolerance with a node (or region) alone in fp32. Kept ones in their own
// colour and legend entry.
"use strict";

const RANKING_COLOURS = { kept: "#e36209", int8: "#0b5cad" };

const MEASURES = {
  int8: {
    axis: "output cosine gained with the tensor alone in float",
    left: "left int8",
    label: (gain) => `cosine +${gain.toFixed(4)}`,
    detail: (r) => `tensor ${r.tensor}: cosine ${r.cosine_alone_float.toFixed(4)} alone in float, ` +
      `${r.cosine_int8.toFixed(4)} all int8`,
    status: (n, kept) => `${n} tensor(s) ranked, ${kept} of them with every layer kept in fp32.`,
  },
  fp16: {
    axis: "share of output elements brought within the fp16 tolerance with the node alone in fp32",
    left: "left fp16",
    label: (gain) => `+${(100 * gain).toFixed(2)}% of elements within tolerance`,
    detail: (r) => `${(r.ops || []).join(", ")}: ${(100 * r.violations_alone_float).toFixed(2)}% outside the ` +
      `tolerance alone in fp32, ${(100 * r.violations_fp16).toFixed(2)}% all fp16`,
    status: (n, kept) => `${n} node(s) or region(s) ranked, ${kept} of them kept in fp32.`,
  },
};

function drawRanking(figure) {
  const ranking = JSON.parse(figure.dataset.ranking);
  const measure = MEASURES[figure.dataset.precision] || MEASURES.int8;
  const canvas = figure.querySelector("canvas");
  const status = figure.querySelector("figcaption");
  figure.style.height = `${Math.max(160, 90 + 26 * ranking.length)}px`;
  const labels = ranking.map((r) => r.layers.join(", "));
  const value = (kept) => ranking.map((r) => (r.kept === kept ? r.gain : null));
  const chart = new Chart(canvas, {
    type: "bar",
    data: {
      labels,
      datasets: [
        { label: "kept in fp32", data: value(true), backgroundColor: RANKING_COLOURS.kept },
        { label: measure.left, data: value(false), backgroundColor: RANKING_COLOURS.int8 },
      ],
    },
    options: {
      indexAxis: "y", responsive: true, maintainAspectRatio: false, animation: false,
      scales: {
        x: { stacked: true, title: { display: true, text: measure.axis } },
        y: { stacked: true, ticks: { autoSkip: false } },
      },
      plugins: {
        legend: { position: "bottom" },
        title: { display: true, text: "Layers by measured sensitivity (ONNX node names), most sensitive first" },
        tooltip: { filter: (item) => item.parsed.x !== null, callbacks: {
          label: (c) => `${c.dataset.label}: ${measure.label(c.parsed.x)}`,
          afterLabel: (c) => measure.detail(ranking[c.dataIndex]) } },
      },
    },
  });
  const kept = ranking.filter((r) => r.kept).length;
  figure.dataset.bars = String(ranking.length);
  status.textContent = measure.status(ranking.length, kept);
  return chart;
}

document.addEventListener("DOMContentLoaded", () => {
  for (const figure of document.querySelectorAll("figure[data-ranking]")) {
    try { drawRanking(figure); } catch (e) {
      figure.querySelector("figcaption").textContent = `The chart could not be drawn: ${e}`;
    }
  }
});
