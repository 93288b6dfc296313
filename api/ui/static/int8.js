// An int8 accuracy repair's ranking as horizontal bars, drawn with Chart.js from the figure's data-ranking (the
// repair's ranking as the API answers it: ONNX node names, the output's cosine gained with the tensor alone in
// float, and whether the repair kept its layers in fp32). Kept ones in their own colour and legend entry.
"use strict";

const RANKING_COLOURS = { kept: "#e36209", int8: "#0b5cad" };

function drawRanking(figure) {
  const ranking = JSON.parse(figure.dataset.ranking);
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
        { label: "left int8", data: value(false), backgroundColor: RANKING_COLOURS.int8 },
      ],
    },
    options: {
      indexAxis: "y", responsive: true, maintainAspectRatio: false, animation: false,
      scales: {
        x: { stacked: true, title: { display: true, text: "output cosine gained with the tensor alone in float" } },
        y: { stacked: true, ticks: { autoSkip: false } },
      },
      plugins: {
        legend: { position: "bottom" },
        title: { display: true, text: "Layers by measured sensitivity (ONNX node names), most sensitive first" },
        tooltip: { filter: (item) => item.parsed.x !== null, callbacks: {
          label: (c) => `${c.dataset.label}: cosine +${c.parsed.x.toFixed(4)}`,
          afterLabel: (c) => { const r = ranking[c.dataIndex];
            return `tensor ${r.tensor}: cosine ${r.cosine_alone_float.toFixed(4)} alone in float, ${r.cosine_int8.toFixed(4)} all int8`; } } },
      },
    },
  });
  const kept = ranking.filter((r) => r.kept).length;
  figure.dataset.bars = String(ranking.length);
  status.textContent = `${ranking.length} tensor(s) ranked, ${kept} of them with every layer kept in fp32.`;
  return chart;
}

document.addEventListener("DOMContentLoaded", () => {
  for (const figure of document.querySelectorAll("figure[data-ranking]")) {
    try { drawRanking(figure); } catch (e) {
      figure.querySelector("figcaption").textContent = `The chart could not be drawn: ${e}`;
    }
  }
});
