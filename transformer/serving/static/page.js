// The page of `tfm serve`: translate one sentence through POST /attention and draw its encoder-decoder attention
// (rows: tokens produced, columns: source tokens) for the chosen layer and head. No libraries, no network but the
// server that sent the page.
"use strict";

const $ = (id) => document.getElementById(id);
// matplotlib's viridis at 0, 0.1, ..., 1 (what `tfm attention` draws with), interpolated in between
const VIRIDIS = [[68, 1, 84], [72, 35, 116], [64, 67, 135], [52, 94, 141], [41, 120, 142], [33, 145, 140],
  [34, 168, 132], [68, 190, 112], [121, 209, 81], [189, 223, 38], [253, 231, 37]];
let shown = null; // the last /attention answer, redrawn when the head changes

function viridis(x) {
  const t = Math.min(Math.max(x, 0), 1) * (VIRIDIS.length - 1);
  const i = Math.min(Math.floor(t), VIRIDIS.length - 2);
  const f = t - i;
  const c = VIRIDIS[i].map((v, k) => Math.round(v + f * (VIRIDIS[i + 1][k] - v)));
  return `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
}

function options(select, count, chosen) {
  select.replaceChildren();
  for (let n = 1; n <= count; n++) {
    select.add(new Option(String(n), String(n), false, n === chosen));
  }
}

async function call(path, body) {
  const response = await fetch(path, body === undefined ? {} : {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
  });
  const answer = await response.json();
  if (!response.ok) {
    throw new Error(answer.error || `HTTP ${response.status}`);
  }
  return answer;
}

function draw() {
  const head = Number($("head").value) - 1;
  const weights = shown.weights[head];
  const top = Math.max(...weights.flat());
  $("title").textContent = `Encoder-decoder attention, layer ${shown.layer}, head ${head + 1}`;
  const table = $("heatmap");
  table.replaceChildren();
  const header = table.createTHead().insertRow();
  header.appendChild(document.createElement("th"));
  for (const token of shown.source) {
    const th = document.createElement("th");
    th.textContent = token;
    header.appendChild(th);
  }
  const body = table.createTBody();
  shown.output.forEach((token, r) => {
    const row = body.insertRow();
    const th = document.createElement("th");
    th.textContent = token;
    row.appendChild(th);
    weights[r].forEach((w, c) => {
      const cell = row.insertCell();
      cell.className = "cell";
      cell.style.background = viridis(top > 0 ? w / top : 0);
      cell.title = `${token} → ${shown.source[c]}: ${w.toFixed(3)}`;
      cell.onmouseenter = () => header.cells[c + 1].classList.add("on");
      cell.onmouseleave = () => header.cells[c + 1].classList.remove("on");
    });
  });
}

async function translate(event) {
  event.preventDefault();
  const text = $("source").value;
  $("status").textContent = "translating…";
  $("go").disabled = true;
  try {
    const asked = {text: text, layer: Number($("layer").value)};
    if (!$("to-label").hidden) {
      asked.to = $("to").value;
    }
    shown = await call("attention", asked);
    $("translation").textContent = shown.translation;
    $("result").hidden = false;
    $("status").textContent = "";
    draw();
  } catch (error) {
    $("status").textContent = error.message;
  } finally {
    $("go").disabled = false;
  }
}

async function start() {
  try {
    const info = await call("info");
    const model = info.config.model;
    const served = info.ensemble.length > 1
      ? `an ensemble of ${info.ensemble.length}: ${info.ensemble.map((m) => m.checkpoint).join(" + ")}`
      : `${info.checkpoint} · step ${info.step}`;
    const directions = info.directions.length > 1 ? info.directions.join(", ") : `${info.source} → ${info.target}`;
    $("model").textContent = `${directions} · ${served} · ${model.encoder_layers || model.N}+${model.decoder_layers || model.N} layers, ${model.h} heads`;
    if (info.targets.length > 1) {  // a model of several target languages: the page asks which
      info.targets.forEach((t) => $("to").add(new Option(t, t)));
      $("to-label").hidden = false;
    }
    const layers = model.decoder_layers || model.N;  // encoder-decoder attention: the decoder's layers
    options($("layer"), layers, layers);
    options($("head"), model.h, 1);
  } catch (error) {
    $("status").textContent = `cannot read /info: ${error.message}`;
    return;
  }
  $("form").onsubmit = translate;
  $("source").onkeydown = (event) => {
    if (event.key === "Enter" && !event.shiftKey) {
      translate(event);
    }
  };
  $("head").onchange = () => shown && draw();
  $("layer").onchange = (event) => shown && translate(event);
  $("to").onchange = (event) => shown && translate(event);
}

start();
