// heatformer's interactive teaching page (explore.html): draws the numbers that
// heatformer.lab.demo.explore.explorer_data computed in Python (embedded as JSON in the page).
// No libraries, no network. The exact curves are the library's; only the step-by-step
// approximations (Euler steps, series terms) are computed here, from P.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("demo-data").textContent);
  const N = D.labels.length;
  const SCALE = Math.pow(10, D.digits);
  const T = D.times.length;
  const SVGNS = "http://www.w3.org/2000/svg";
  const EDGE_MIN = 0.01; // edges lighter than this are not drawn (they still diffuse)
  const OPS = {
    attention: "attention P",
    laplacian: "Laplacian L = I − P",
    heat: "heat exp(−tL)",
    ppr: "PPR α (I − (1−α) P)⁻¹",
  };
  const METHODS = { exact: "exact (heatformer, precomputed)", euler: "Euler steps", series: "series terms" };
  const state = {
    layer: D.layer,
    head: D.head,
    op: "heat",
    source: D.source,
    ti: Math.max(0, D.times.indexOf(1)),
    method: "exact",
    steps: 8,
    eig: Math.min(1, N - 1),
  };

  // ---- small helpers -------------------------------------------------------------------
  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function svg(tag, attrs) {
    const node = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    return node;
  }
  function fmt(v, digits) {
    const d = digits === undefined ? 4 : digits;
    const s = v.toFixed(d);
    return Number(s) === 0 ? (0).toFixed(d) : s; // no "-0.0000"
  }
  function label(i) {
    return D.labels[i];
  }
  function head() {
    return D.heads[state.layer][state.head];
  }
  function matrix(op) {
    const h = head();
    if (op === "attention") return h.attention;
    if (op === "heat") return h.heat[state.ti].map((row) => row.map((v) => v / SCALE));
    return h[op].map((row) => row.map((v) => v / SCALE));
  }
  // column j (influence: M e_j) or row j (mass: M^T e_j) of a matrix
  function view(M, which, j) {
    return which === "influence" ? M.map((row) => row[j]) : M[j].slice();
  }
  // A x with A = P (influence) or P^T (mass)
  function step(x, which) {
    const P = head().attention;
    const y = new Array(N).fill(0);
    for (let i = 0; i < N; i++) {
      for (let k = 0; k < N; k++) {
        if (which === "influence") y[i] += P[i][k] * x[k];
        else y[k] += P[i][k] * x[i];
      }
    }
    return y;
  }
  function onehot(j) {
    const x = new Array(N).fill(0);
    x[j] = 1;
    return x;
  }
  function approximate(which) {
    // the heat flow or PPR from token j after state.steps Euler steps or series terms
    const t = D.times[state.ti];
    const K = state.steps;
    let x = onehot(state.source);
    if (state.op === "heat" && state.method === "euler") {
      const h = t / K; // u <- u - h L u = (1 - h) u + h P u
      for (let s = 0; s < K; s++) {
        const px = step(x, which);
        x = x.map((v, i) => (1 - h) * v + h * px[i]);
      }
      return x;
    }
    const sum = x.slice();
    let term = x;
    for (let k = 1; k < K; k++) {
      const pk = step(term, which);
      const c = state.op === "heat" ? t / k : 1 - D.alpha;
      term = pk.map((v) => c * v);
      for (let i = 0; i < N; i++) sum[i] += term[i];
    }
    const c0 = state.op === "heat" ? Math.exp(-t) : D.alpha;
    return sum.map((v) => c0 * v);
  }
  function usesSteps() {
    return state.method !== "exact" && (state.op === "heat" || state.op === "ppr");
  }
  function values(which) {
    const exact = view(matrix(state.op), which, state.source);
    if (!usesSteps()) return { values: exact, exact: exact, total: exactTotal(which) };
    const approx = approximate(which);
    return { values: approx, exact: exact, total: approx.reduce((a, b) => a + b, 0) };
  }
  function exactTotal(which) {
    const totals = head().totals[state.op][which];
    return state.op === "heat" ? totals[state.ti][state.source] : totals[state.source];
  }

  // ---- colours ---------------------------------------------------------------------------
  function mix(a, b, s) {
    return a.map((v, i) => Math.round(v + (b[i] - v) * s));
  }
  const WHITE = [255, 255, 255];
  const HOT = [[255, 255, 204], [253, 141, 60], [189, 0, 38]];
  const BLUE = [33, 102, 172];
  const RED = [178, 24, 43];
  // colour ∝ √value (signed: ±√|value|), so that faint values show; the colour bar says so
  const SCALE_NOTE = { unsigned: "colour ∝ √value", signed: "colour ∝ ±√|value|" };
  function rgb(v, scale) {
    if (scale.signed) {
      const r = Math.max(-1, Math.min(1, v / scale.max));
      const s = Math.sign(r) * Math.sqrt(Math.abs(r));
      return s < 0 ? mix(WHITE, BLUE, -s) : mix(WHITE, RED, s);
    }
    const s = Math.sqrt(Math.max(0, Math.min(1, v / scale.max)));
    return s < 0.5 ? mix(HOT[0], HOT[1], 2 * s) : mix(HOT[1], HOT[2], 2 * s - 1);
  }
  function css(c) {
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }
  function colour(v, scale) {
    return css(rgb(v, scale));
  }
  // WCAG 2 relative luminance and contrast ratio of sRGB colours (channels 0 to 255)
  function luminance(c) {
    const lin = c.map((v) => (v / 255 <= 0.04045 ? v / 255 / 12.92 : Math.pow((v / 255 + 0.055) / 1.055, 2.4)));
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2];
  }
  function contrast(a, b) {
    const la = luminance(a), lb = luminance(b);
    return (Math.max(la, lb) + 0.05) / (Math.min(la, lb) + 0.05);
  }
  // black or white, whichever contrasts more with the background (always at least 4.58)
  function textOn(c) {
    return contrast(WHITE, c) > contrast([0, 0, 0], c) ? "#fff" : "#000";
  }
  function scaleOf(vectors) {
    let lo = 0, hi = 0;
    for (const vec of vectors) for (const v of vec) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    const signed = lo < -1e-9;
    const max = Math.max(signed ? Math.max(-lo, hi) : hi, 1e-12);
    return { signed: signed, max: max };
  }

  // ---- the graph drawing -----------------------------------------------------------------
  const W = Math.max(900, 24 * N + 60);
  const DX = (W - 60) / Math.max(1, N - 1);
  const R = Math.max(6, Math.min(11, DX * 0.42));
  function xOf(i) {
    return 30 + i * DX;
  }
  function edges() {
    const P = head().attention;
    const out = [];
    for (let i = 0; i < N; i++) for (let j = 0; j < N; j++) if (P[i][j] >= EDGE_MIN) out.push([i, j, P[i][j]]);
    return out;
  }
  // sizes (optional): each node's radius as a share of RANK_R (TokenRank: area ∝ π)
  const RANK_R = 2 * R;
  function drawGraph(target, vec, scale, name, clickable, sizes) {
    const list = edges();
    const forward = list.some(([i, j]) => j > i);
    const arcMax = Math.min(0.3 * (N - 1) * DX, 150);
    const base = forward ? arcMax + 30 : arcMax + 24;
    const height = base + (forward ? arcMax : 0) + 50;
    const root = svg("svg", { viewBox: `0 0 ${W + 90} ${height}`, id: `graph-${name}` });
    const g = svg("g", { class: "edges" });
    for (const [i, j, w] of list) {
      const x1 = xOf(i), x2 = xOf(j);
      let d;
      if (i === j) {
        d = `M ${x1 - 4} ${base - R} C ${x1 - 14} ${base - R - 22}, ${x1 + 14} ${base - R - 22}, ${x1 + 4} ${base - R}`;
      } else {
        const h = Math.min(0.3 * Math.abs(i - j) * DX, arcMax) * (j < i ? 1 : -1);
        const y = base - (j < i ? R : -R);
        d = `M ${x1} ${y} Q ${(x1 + x2) / 2} ${y - 2 * h} ${x2} ${y}`;
      }
      const path = svg("path", {
        d: d, fill: "none", stroke: "rgb(40,70,140)", "stroke-opacity": (0.15 + 0.85 * w).toFixed(3),
        "stroke-width": (0.6 + 4 * w).toFixed(2), "marker-end": `url(#arrow-${name})`, class: "edge",
        "data-i": i, "data-j": j, "data-w": w,
      });
      path.addEventListener("mousemove", (e) =>
        tip(e, `P[${i}, ${j}] = ${fmt(w)}: query ${i} ‘${label(i)}’ reads key ${j} ‘${label(j)}’`));
      path.addEventListener("mouseleave", hideTip);
      g.appendChild(path);
    }
    const defs = svg("defs");
    const marker = svg("marker", { id: `arrow-${name}`, viewBox: "0 0 10 10", refX: "9", refY: "5",
      markerWidth: "4", markerHeight: "4", orient: "auto-start-reverse" });
    marker.appendChild(svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "rgb(40,70,140)" }));
    defs.appendChild(marker);
    root.appendChild(defs);
    root.appendChild(g);
    const nodes = svg("g", { class: "nodes" });
    for (let i = 0; i < N; i++) {
      const node = svg("g", { class: "node", "data-i": i, "data-value": vec[i] });
      const fill = rgb(vec[i], scale);
      const circle = svg("circle", {
        cx: xOf(i), cy: base, r: sizes ? RANK_R * sizes[i] : R, fill: css(fill),
        stroke: i === state.source && clickable ? "#000" : "#555",
        "stroke-width": i === state.source && clickable ? 2.5 : 0.8,
      });
      // the label reads on its node: black or white, on a halo of the node's colour where the
      // label is wider than the node
      const text = svg("text", { x: xOf(i), y: base + 4, "text-anchor": "middle", "font-size": Math.min(12, R + 1),
        fill: textOn(fill), stroke: css(fill), "stroke-width": 3, "stroke-linejoin": "round",
        "paint-order": "stroke" });
      text.textContent = label(i);
      node.appendChild(circle);
      node.appendChild(text);
      node.addEventListener("mousemove", (e) => tip(e, `token ${i} ‘${label(i)}’: ${fmt(vec[i])}`));
      node.addEventListener("mouseleave", hideTip);
      if (clickable) {
        node.style.cursor = "pointer";
        node.addEventListener("click", () => { state.source = i; hideTip(); render(); });
      }
      nodes.appendChild(node);
    }
    root.appendChild(nodes);
    // colour bar
    const bar = svg("g", { class: "colourbar" });
    const steps = 40, x0 = W + 20, top = 12, bottom = height - 20;
    for (let s = 0; s < steps; s++) {
      const f = 1 - s / steps;
      const v = scale.signed ? (2 * f - 1) * scale.max : f * scale.max;
      bar.appendChild(svg("rect", { x: x0, y: top + (s * (bottom - top)) / steps, width: 14,
        height: (bottom - top) / steps + 0.5, fill: colour(v, scale) }));
    }
    const hi = svg("text", { x: x0 + 18, y: top + 8, "font-size": 10 });
    hi.textContent = fmt(scale.max, 3);
    const lo = svg("text", { x: x0 + 18, y: bottom, "font-size": 10 });
    lo.textContent = fmt(scale.signed ? -scale.max : 0, 3);
    bar.appendChild(hi);
    bar.appendChild(lo);
    const mid = (top + bottom) / 2, xn = x0 + 62;
    const note = svg("text", { x: xn, y: mid, "font-size": 10, "text-anchor": "middle",
      transform: `rotate(-90 ${xn} ${mid})`, class: "colourbar-note" });
    note.textContent = scale.signed ? SCALE_NOTE.signed : SCALE_NOTE.unsigned;
    bar.appendChild(note);
    root.appendChild(bar);
    target.replaceChildren(root);
  }

  // ---- tooltip ---------------------------------------------------------------------------
  const tipBox = document.getElementById("tip");
  function tip(e, text) {
    tipBox.textContent = text;
    tipBox.style.display = "block";
    tipBox.style.left = `${e.clientX + 12}px`;
    tipBox.style.top = `${e.clientY + 12}px`;
  }
  function hideTip() {
    tipBox.style.display = "none";
  }

  // ---- the energy chart ------------------------------------------------------------------
  function drawEnergy(target) {
    const e = head().energy;
    const series = { influence: e.influence.map((r) => r[state.source]), mass: e.mass.map((r) => r[state.source]) };
    const ymax = Math.max(1e-12, ...series.influence, ...series.mass) * 1.08;
    const w = 560, h = 260, l = 56, b = 40, tmax = D.times[T - 1];
    const X = (t) => l + ((w - l - 12) * t) / tmax;
    const Y = (v) => h - b - ((h - b - 14) * v) / ymax;
    const root = svg("svg", { viewBox: `0 0 ${w} ${h}`, id: "energy-chart", style: "max-width:640px" });
    root.appendChild(svg("line", { x1: l, y1: h - b, x2: w - 8, y2: h - b, stroke: "#888" }));
    root.appendChild(svg("line", { x1: l, y1: 10, x2: l, y2: h - b, stroke: "#888" }));
    for (let k = 0; k <= 4; k++) {
      const t = (tmax * k) / 4;
      const tx = svg("text", { x: X(t), y: h - b + 16, "text-anchor": "middle", "font-size": 11 });
      tx.textContent = String(t);
      root.appendChild(tx);
      const v = (ymax * k) / 4;
      const ty = svg("text", { x: l - 6, y: Y(v) + 4, "text-anchor": "end", "font-size": 11 });
      ty.textContent = fmt(v, 2);
      root.appendChild(ty);
    }
    const xl = svg("text", { x: (l + w) / 2, y: h - 6, "text-anchor": "middle", "font-size": 12 });
    xl.textContent = "diffusion time t";
    root.appendChild(xl);
    const yl = svg("text", { x: 14, y: (h - b) / 2, "font-size": 12, transform: `rotate(-90 14 ${(h - b) / 2})`, "text-anchor": "middle" });
    yl.textContent = "Dirichlet energy xᵀ L_s x";
    root.appendChild(yl);
    const colours = { influence: "rgb(214,96,77)", mass: "rgb(67,147,195)" };
    for (const [name, ys] of Object.entries(series)) {
      const pts = ys.map((v, k) => `${X(D.times[k]).toFixed(1)},${Y(v).toFixed(1)}`).join(" ");
      root.appendChild(svg("polyline", { points: pts, fill: "none", stroke: colours[name], "stroke-width": 2, class: `energy-${name}` }));
      root.appendChild(svg("circle", { cx: X(D.times[state.ti]), cy: Y(ys[state.ti]), r: 4.5, fill: colours[name] }));
      const key = svg("text", { x: w - 150, y: name === "influence" ? 24 : 40, fill: colours[name], "font-size": 12 });
      key.textContent = name === "influence" ? "influence u(t)" : "mass m(t)";
      root.appendChild(key);
    }
    target.replaceChildren(root);
    return series;
  }

  // ---- the page --------------------------------------------------------------------------
  const app = document.getElementById("app");
  app.appendChild(el("h1", {}, "Heat flow on an attention graph: play with it"));
  const intro = el("p", { class: "note" });
  intro.innerHTML = "Sentence <code></code>: one node per token. Every number here was computed by " +
    "heatformer's own operators in Python (float64) and embedded in this file; only the Euler " +
    "steps and series terms are computed in your browser, from <code>P</code>. The static page " +
    "with the explanations is <a href=\"index.html\">index.html</a>.";
  intro.querySelector("code").textContent = D.text;
  app.appendChild(intro);

  const controls = el("div", { id: "controls" });
  function picker(id, text, options, value, onChange) {
    const wrap = el("label", {}, text + " ");
    const select = el("select", { id: id });
    for (const [v, t] of options) select.appendChild(el("option", { value: String(v) }, t));
    select.value = String(value);
    select.addEventListener("change", () => { onChange(select.value); render(); });
    wrap.appendChild(select);
    controls.appendChild(wrap);
    return select;
  }
  function slider(id, text, min, max, value, onInput) {
    const wrap = el("label", {}, text + " ");
    const input = el("input", { id: id, type: "range", min: String(min), max: String(max), step: "1" });
    input.value = String(value);
    const out = el("output", { id: `${id}-value` });
    input.addEventListener("input", () => { onInput(Number(input.value)); render(); });
    wrap.appendChild(input);
    wrap.appendChild(out);
    controls.appendChild(wrap);
    return { input: input, out: out };
  }
  picker("layer", "layer", D.heads.map((_, l) => [l, String(l)]), state.layer, (v) => { state.layer = Number(v); });
  const headPick = picker("head", "head", [], state.head, (v) => { state.head = Number(v); });
  picker("op", "operator", Object.entries(OPS), state.op, (v) => { state.op = v; });
  const sourcePick = picker("source", "source token j", D.labels.map((t, i) => [i, `${i} ‘${t}’`]), state.source,
    (v) => { state.source = Number(v); });
  const tSlider = slider("t", "t", 0, T - 1, state.ti, (v) => { state.ti = v; });
  const methodPick = picker("method", "method", Object.entries(METHODS), state.method, (v) => { state.method = v; });
  const stepSlider = slider("steps", "steps / terms K", 1, 40, state.steps, (v) => { state.steps = v; });
  app.appendChild(controls);

  function panel(id, title, note) {
    const box = el("div", { class: "panel", id: `panel-${id}` });
    box.appendChild(el("h2", { id: `title-${id}` }, title));
    if (note) box.appendChild(el("p", { class: "note", id: `note-${id}` }, note));
    const holder = el("div", { id: `holder-${id}` });
    box.appendChild(holder);
    const total = el("p", { class: "total", id: `total-${id}` });
    box.appendChild(total);
    return { box: box, holder: holder, total: total };
  }
  const views = el("div", { class: "views" });
  // what each view of each operator is (the panels' notes follow the operator picked)
  const NOTES = {
    influence: {
      heat: "What every output takes from token j's value: a heat head's output (time t) for the " +
        "input e_j. It moves against the arrows: from key j to the queries that read it.",
      attention: "An attention head's output for the input e_j: query i takes P[i, j] of token j's " +
        "value, one step against the arrows.",
      laplacian: "A Laplacian head's output for the input e_j: e_j − P e_j, token j's own value " +
        "minus what every query takes from it (P[i, j]).",
      ppr: "What every output takes from token j's value under personalized PageRank: a walk " +
        "against the arrows, weighted α (1 − α)^k after k steps.",
    },
    mass: {
      heat: "A unit of mass on token j, moved along the arrows (query → key) for a time t, towards " +
        "the keys read most (the sinks; on a causal graph, back to earlier tokens).",
      attention: "A unit of mass on token j after one step along the arrows: key k gets P[j, k].",
      laplacian: "Lᵀ e_j = −dm/dt at t = 0 for a unit of mass on token j: positive where the mass " +
        "leaves (token j), negative where it arrives (the keys j reads).",
      ppr: "A unit of mass on token j, spread where a walk from j along the arrows ends if it " +
        "stops with probability α before each step.",
    },
  };
  const infl = panel("influence", "Influence view: op e_j", NOTES.influence.heat);
  const mass = panel("mass", "Mass view: opᵀ e_j", NOTES.mass.heat);
  views.appendChild(infl.box);
  views.appendChild(mass.box);
  app.appendChild(views);
  const stepInfo = el("p", { id: "step-info", class: "note" });
  app.appendChild(stepInfo);

  const table = el("table", { id: "values" });
  const tableBox = el("details", { open: "" });
  tableBox.appendChild(el("summary", {}, "node values"));
  tableBox.appendChild(table);
  app.appendChild(tableBox);

  const energy = panel("energy", "Dirichlet energy of the heat flow from token j against t",
    "E(x) = xᵀ L_s x = ½ Σ W_s[i,k] (x_i − x_k)², with W_s = (P + Pᵀ)/2 and L_s = D_s − W_s: " +
    "how rough the signal is on the graph. The influence view is smoothed towards a constant, " +
    "so its energy falls; the mass view piles up on the sinks, so its energy need not.");
  app.appendChild(energy.box);

  const eigen = panel("eigen", "Eigenvectors of L_s: low and high frequencies on the graph",
    "Eigenvector k of L_s coloured on the nodes (its energy is its eigenvalue λ_k). k = 0 is " +
    "the constant (λ = 0); small k vary slowly along strong edges, large k flip sign between neighbours.");
  const eigSlider = slider("eig", "eigenvector k", 0, N - 1, state.eig, (v) => { state.eig = v; });
  eigen.box.insertBefore(eigSlider.input.parentNode, eigen.holder);
  app.appendChild(eigen.box);

  // the random walk on P: TokenRank π as node area, v₂ as node colour (words from Python)
  const rank = panel("tokenrank", "TokenRank: where the random walk on P spends its time (node area ∝ π)", " ");
  app.appendChild(rank.box);
  const walk = panel("walk", "The second eigenvector v₂ of P (P v₂ = λ₂ v₂) on the graph", " ");
  app.appendChild(walk.box);
  function complex(z) {
    if (z[1] === 0) return fmt(z[0]);
    return `${fmt(z[0])} ${z[1] < 0 ? "−" : "+"} ${fmt(Math.abs(z[1]))}i`;
  }
  function drawWalk() {
    const w = head().walk;
    document.getElementById("note-tokenrank").textContent = w.pi_text;
    document.getElementById("note-walk").textContent = w.vector_text;
    if (w.pi) {
      const top = Math.max(...w.pi);
      const best = w.pi.indexOf(top);
      drawGraph(rank.holder, w.pi, scaleOf([w.pi]), "tokenrank", false, w.pi.map((v) => Math.sqrt(v / top)));
      rank.total.textContent = `Σᵢ πᵢ = ${fmt(w.pi.reduce((a, b) => a + b, 0), 6)}; largest π = ${fmt(top)}, ` +
        `on token ${best} ‘${label(best)}’ (uniform: 1/N = ${fmt(1 / N)})`;
    } else {
      rank.holder.replaceChildren();
      rank.total.textContent = "no TokenRank for this head (see above)";
    }
    if (w.vector) {
      const modulus = Math.hypot(w.lambda2[0], w.lambda2[1]);
      const diverging = { signed: true, max: Math.max(1e-12, ...w.vector.map(Math.abs)) }; // white at 0
      drawGraph(walk.holder, w.vector, diverging, "walk", false);
      walk.total.textContent = `λ₂ = ${complex(w.lambda2)}, |λ₂| = ${fmt(modulus)}, ` +
        `spectral gap 1 − |λ₂| = ${fmt(1 - modulus)}; largest entry of v₂ on token ${w.peak} ‘${label(w.peak)}’`;
    } else {
      walk.holder.replaceChildren();
      walk.total.textContent = "no λ₂ for this head (see above)";
    }
  }

  function conservation(which, total) {
    if (Math.abs(total - 1) < 1e-6) return "conserved: the starting total is 1";
    if (which === "mass" && usesSteps() && state.method === "series")
      return state.op === "heat"
        ? "not yet 1: the tail e^(−t) Σ_{k≥K} t^k/k! of the series is still missing"
        : "not yet 1: the tail (1−α)^K of the series is still missing";
    if (state.op === "laplacian" && which === "mass" && Math.abs(total) < 1e-6)
      return "0: Lᵀ only moves mass (it is −dm/dt of the heat flow at t = 0)";
    if (state.op === "laplacian" && which === "influence")
      return "not conserved: 1 − Σᵢ P[i, j], token j's value minus what the queries take from it";
    return which === "influence"
      ? "not conserved: it counts how many outputs listen to token j, not an amount of heat"
      : "not conserved";
  }

  function render() {
    // keep the pickers in step with the state
    headPick.replaceChildren(...D.operators[state.layer].map((name, h) => el("option", { value: String(h) }, `${h} (${name})`)));
    headPick.value = String(state.head);
    sourcePick.value = String(state.source);
    const stepping = state.op === "heat" || state.op === "ppr";
    methodPick.disabled = !stepping;
    for (const option of methodPick.options) option.disabled = option.value === "euler" && state.op !== "heat";
    if (state.op === "ppr" && state.method === "euler") state.method = "series";
    methodPick.value = state.method;
    stepSlider.input.disabled = !usesSteps();
    tSlider.out.textContent = ` ${D.times[state.ti]}`;
    stepSlider.out.textContent = ` ${state.steps}`;
    eigSlider.out.textContent = ` ${state.eig}`;
    const t = D.times[state.ti];
    const opName = state.op === "heat" ? `exp(−${t}·L)` : { attention: "P", laplacian: "(I − P)", ppr: "PPR" }[state.op];
    document.getElementById("title-influence").textContent = `Influence view: u = ${opName} e_${state.source}`;
    document.getElementById("title-mass").textContent = `Mass view: m = (${opName})ᵀ e_${state.source}`;
    document.getElementById("note-influence").textContent =
      `${NOTES.influence[state.op]} Click a node to move the source.`;
    document.getElementById("note-mass").textContent = NOTES.mass[state.op];
    const result = { influence: values("influence"), mass: values("mass") };
    let scaleVectors = [result.influence.values, result.mass.values];
    if (state.op === "heat") { // one scale for every t, so the slider shows the decay
      const heat = head().heat;
      scaleVectors = scaleVectors.concat(heat.map((M) => view(M, "influence", state.source).map((v) => v / SCALE)),
        heat.map((M) => view(M, "mass", state.source).map((v) => v / SCALE)));
    }
    const scale = scaleOf(scaleVectors);
    for (const [which, box] of [["influence", infl], ["mass", mass]]) {
      const r = result[which];
      drawGraph(box.holder, r.values, scale, which, true);
      box.total.textContent = `total Σᵢ ${which === "influence" ? "uᵢ" : "mᵢ"} = ${fmt(r.total, 6)}: ${conservation(which, r.total)}`;
      box.total.dataset.value = String(r.total);
    }
    if (usesSteps()) {
      const err = Math.max(...result.influence.values.map((v, i) => Math.abs(v - result.influence.exact[i])),
        ...result.mass.values.map((v, i) => Math.abs(v - result.mass.exact[i])));
      const what = state.method === "euler"
        ? `${state.steps} Euler steps u ← u − (t/K) L u`
        : state.op === "heat"
          ? `the first ${state.steps} terms of e^(−t) Σ t^k/k! P^k`
          : `the first ${state.steps} terms of α Σ (1−α)^k P^k`;
      stepInfo.textContent = `Showing ${what}; largest difference from heatformer's exact answer: ${err.toExponential(2)}.`;
      stepInfo.dataset.error = String(err);
    } else {
      stepInfo.textContent = state.op === "heat" || state.op === "ppr"
        ? "Showing heatformer's exact answer; pick Euler steps or series terms to watch it being built up."
        : "One propagation: no steps to take.";
      delete stepInfo.dataset.error;
    }
    const rows = [el("tr", {})];
    for (const h of ["i", "token", "influence uᵢ", "mass mᵢ"]) rows[0].appendChild(el("th", {}, h));
    for (let i = 0; i < N; i++) {
      const tr = el("tr", { "data-i": String(i) });
      tr.appendChild(el("td", {}, String(i)));
      tr.appendChild(el("td", {}, label(i)));
      for (const which of ["influence", "mass"]) {
        const v = result[which].values[i];
        tr.appendChild(el("td", { class: which, "data-value": String(v) }, fmt(v)));
      }
      rows.push(tr);
    }
    table.replaceChildren(...rows);
    const series = drawEnergy(energy.holder);
    energy.total.textContent = `t = ${t}: E(u) = ${fmt(series.influence[state.ti])}, E(m) = ${fmt(series.mass[state.ti])}`;
    const vec = head().eigenvectors[state.eig].map((v) => v / SCALE);
    drawGraph(eigen.holder, vec, scaleOf([vec]), "eigen", false);
    eigen.total.textContent = `λ_${state.eig} = ${fmt(head().eigenvalues[state.eig])} (of ${fmt(head().eigenvalues[N - 1])} at most)`;
    drawWalk();
    document.body.dataset.ready = "1";
  }
  render();
})();
