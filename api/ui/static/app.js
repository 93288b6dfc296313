// The dashboard's own script: the upload drop zone with progress, and the clocks of a live build page (its tasks
// come by a long poll, only when they change). Everything else is htmx attributes.
"use strict";

function setupUpload() {
  const form = document.getElementById("upload-form");
  if (!form) return;
  const zone = document.getElementById("dropzone");
  const input = document.getElementById("upload-file");
  const name = document.getElementById("upload-name");
  const bar = document.getElementById("upload-progress");
  const status = document.getElementById("upload-status");

  function chosen(file) {
    if (file && !name.value) name.value = file.name.replace(/\.(onnx|zip|tar)$/i, "");
    status.textContent = file ? `${file.name}, ${(file.size / 1048576).toFixed(2)} MiB` : "";
  }
  input.addEventListener("change", () => chosen(input.files[0]));
  ["dragenter", "dragover"].forEach((t) => zone.addEventListener(t, (e) => { e.preventDefault(); zone.classList.add("over"); }));
  ["dragleave", "drop"].forEach((t) => zone.addEventListener(t, () => zone.classList.remove("over")));
  zone.addEventListener("drop", (e) => {
    e.preventDefault();
    if (e.dataTransfer.files.length) { input.files = e.dataTransfer.files; chosen(input.files[0]); }
  });

  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const file = input.files[0];
    if (!file) { status.textContent = "Choose a file first."; return; }
    const body = new FormData();
    body.append("name", name.value || file.name.replace(/\.(onnx|zip|tar)$/i, ""));
    const version = document.getElementById("upload-version").value;
    if (version) body.append("version", version);
    body.append("file", file);  // last: the server reads the fields before the bytes
    const xhr = new XMLHttpRequest();
    xhr.open("POST", form.action);
    xhr.setRequestHeader("X-CSRF-Token", form.dataset.csrf);
    xhr.setRequestHeader("Accept", "application/json");
    bar.hidden = false; bar.value = 0;
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    xhr.upload.addEventListener("progress", (p) => {
      if (p.lengthComputable) { bar.value = (100 * p.loaded) / p.total; status.textContent = `uploading: ${Math.round(bar.value)} %`; }
    });
    xhr.addEventListener("load", () => {
      button.disabled = false;
      let answer = {};
      try { answer = JSON.parse(xhr.responseText); } catch (_) { /* an HTML error page */ }
      if (xhr.status === 200 || xhr.status === 201) {
        status.textContent = xhr.status === 201 ? "Uploaded; opening the model…" : "These bytes were already uploaded; opening the model…";
        window.location.assign(answer.url);
      } else if (xhr.status === 401) {
        window.location.assign("/ui/signin?next=/ui/models");
      } else {
        bar.hidden = true;
        status.textContent = `Refused (${xhr.status}): ${answer.detail || xhr.statusText}`;
      }
    });
    xhr.addEventListener("error", () => { button.disabled = false; status.textContent = "The upload failed: the connection broke."; });
    xhr.send(body);
  });
}

document.addEventListener("DOMContentLoaded", setupUpload);

// "running for N s": N as the server rendered it, counted on here, so the page needs no request to tick;
// data-style="age" writes it as the server's age filter does ("12 s", "3 min", "1.5 h").
function asAge(seconds) {
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function tickElapsed() {
  const now = performance.now();
  document.querySelectorAll("[data-elapsed]").forEach((el) => {
    if (!el.dataset.t0) el.dataset.t0 = String(now);
    const seconds = Number(el.dataset.elapsed) + (now - Number(el.dataset.t0)) / 1000;
    el.textContent = el.dataset.style === "age" ? asAge(seconds) : String(Math.round(seconds));
  });
}

document.addEventListener("DOMContentLoaded", () => setInterval(tickElapsed, 1000));

// The resolver's shapes field suggests the chosen model's own inputs (its datalist option carries them).
function followModelShapes() {
  const model = document.getElementById("r-model");
  const shapes = document.getElementById("r-shapes");
  if (!model || !shapes) return;
  model.addEventListener("input", () => {
    const option = [...document.querySelectorAll("#model-names option")].find((o) => o.value === model.value);
    if (option && option.dataset.shapes) shapes.placeholder = option.dataset.shapes;
  });
}

document.addEventListener("DOMContentLoaded", followModelShapes);
