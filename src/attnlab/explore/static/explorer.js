/* attnlab attention explorer: draws the payload embedded in this page (any family).
 *
 * The payload (see attnlab/explore/payload.py) holds views; a view holds per layer and head the
 * attention weights (L, H, Tq, Tk) and the raw scores, as base64 float32. Everything is drawn
 * from those numbers with the DOM, SVG and canvas: no library, no request. In the served page
 * (attnlab explore --serve) the form of explorer_form.js posts new input to the local server and
 * redraws the reply through window.attnExplorer.
 */
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";
  const HEAD_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939"];
  const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  const config = JSON.parse($("attn-config").textContent);
  let payload = JSON.parse($("attn-data").textContent);
  const state = { view: 0, layer: 0, head: 0, query: 0 };
  let image = null; // the payload's image, decoded once per payload

  // -- numbers ------------------------------------------------------------------------------
  function floats(arr) {
    if (!arr) return null;
    if (!arr._f) {
      const bin = atob(arr.data);
      const bytes = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
      arr._f = new Float32Array(bytes.buffer);
    }
    return arr._f;
  }
  const view = () => payload.views[state.view];
  function dims(v) {
    const [L, H, Tq, Tk] = v.weights.shape;
    return { L, H, Tq, Tk };
  }
  /* Row i of layer l, head h (h < 0: the mean over heads) of a (L, H, Tq, Tk) array. */
  function row(v, arr, l, h, i) {
    const { H, Tq, Tk } = dims(v);
    if (h >= 0) {
      const off = ((l * H + h) * Tq + i) * Tk;
      return arr.subarray(off, off + Tk);
    }
    const out = new Float32Array(Tk);
    for (let hh = 0; hh < H; hh++) {
      const off = ((l * H + hh) * Tq + i) * Tk;
      for (let j = 0; j < Tk; j++) out[j] += arr[off + j] / H;
    }
    return out;
  }
  function color(t) {
    t = Math.max(0, Math.min(1, t)) * (VIRIDIS.length - 1);
    const k = Math.min(Math.floor(t), VIRIDIS.length - 2), f = t - k;
    const c = VIRIDIS[k].map((a, n) => Math.round(a + f * (VIRIDIS[k + 1][n] - a)));
    return c;
  }
  const fmt = (x, d) => (x === -Infinity ? "−∞" : Number.isFinite(x) ? x.toFixed(d) : String(x));
  const tick = (x) => (x === 0 ? "0" : x < 0.1 ? x.toPrecision(2) : x.toFixed(2));
  const shown = (tok) => tok.replace(/ /g, "␣").replace(/\n/g, "↵").replace(/\t/g, "⇥") || "∅";

  // -- drawing helpers ----------------------------------------------------------------------
  /* Draw rows (Tq arrays of Tk) into a canvas, one cw × ch block per cell, scaled to the
     largest value (returned, for the colour bar). */
  function heatmap(canvas, rows, Tk, cw, ch, highlight) {
    const Tq = rows.length;
    canvas.width = Tk * cw;
    canvas.height = Tq * ch;
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(Tk * cw, Tq * ch);
    let max = 0;
    for (const r of rows) for (const x of r) if (x > max) max = x;
    const scale = max || 1;
    for (let i = 0; i < Tq; i++) {
      for (let j = 0; j < Tk; j++) {
        const [R, G, B] = color(rows[i][j] / scale);
        for (let a = 0; a < ch; a++) {
          for (let b = 0; b < cw; b++) {
            const p = ((i * ch + a) * Tk * cw + j * cw + b) * 4;
            img.data[p] = R; img.data[p + 1] = G; img.data[p + 2] = B; img.data[p + 3] = 255;
          }
        }
      }
    }
    ctx.putImageData(img, 0, 0);
    if (highlight !== undefined && highlight !== null) {
      ctx.strokeStyle = "#ff2d55";
      ctx.lineWidth = Math.max(1, Math.min(cw, ch) / 4);
      ctx.strokeRect(0.5, highlight * ch + 0.5, Tk * cw - 1, ch - 1);
    }
    return max;
  }
  /* Cell width and height of a Tq × Tk map that should fit about px pixels: each side on its
     own (a 4 × 64 map gets tall rows, not a thin strip), at least MIN_CELL, at most 24. */
  const MIN_CELL = 3;
  function cellDims(Tq, Tk, px) {
    const side = (n) => Math.max(MIN_CELL, Math.min(24, Math.floor(px / Math.max(n, 1))));
    return { cw: side(Tk), ch: side(Tq) };
  }
  function cellSize(n, px) { return Math.max(1, Math.min(24, Math.floor(px / Math.max(n, 1)))); }
  /* Which labels of n cells of size px to write: every step-th, so that they do not overlap. */
  const labelStep = (px, need) => Math.max(1, Math.ceil(need / Math.max(px, 1)));
  /* A labelled heat map: the keys above, the queries on the left (click one to choose it), the
     colour bar on the right (0 to the largest value, which is the brightest colour). */
  function labelledMap(box, opts) {
    const { id, rows, queries, keys, highlight, label, onPick } = opts;
    // as large as the panel allows (room left for the labels and the colour bar)
    const px = Math.max(260, Math.min(600, (box.clientWidth || 0) - 110));
    const Tq = rows.length, Tk = keys.length, { cw, ch } = cellDims(Tq, Tk, px);
    box.replaceChildren();
    const fig = el("div", { class: "mfig" });
    const canvas = el("canvas", { id });
    const max = heatmap(canvas, rows, Tk, cw, ch, highlight);
    canvas.style.width = `${Tk * cw}px`;
    canvas.style.height = `${Tq * ch}px`;
    // column labels: upright when every label is a character or two and the cells are wide
    const xs = el("div", { class: "xlabels" });
    const short = keys.every((k) => shown(k).length <= 2);
    const upright = short && cw >= 7; // a monospaced character is about 6 px wide
    const xstep = labelStep(cw, upright ? 7 : 14);
    xs.classList.toggle("vertical", !upright);
    keys.forEach((k, j) => {
      const text = j % xstep === 0 ? shown(k) : "";
      const sp = el("span", { class: "xl", "data-j": j, title: shown(k) },
        text.length > 14 ? `${text.slice(0, 13)}…` : text);
      sp.style.width = `${cw}px`;
      xs.append(sp);
    });
    const ys = el("div", { class: "ylabels" });
    const ystep = labelStep(ch, 7);
    ys.style.fontSize = `${Math.max(7, Math.min(10, ch + 1))}px`;
    queries.forEach((q, i) => {
      const d = el("div", { class: "yl", "data-i": i }, i % ystep === 0 ? shown(q) : "");
      d.style.height = `${ch}px`;
      d.style.lineHeight = `${ch}px`;
      if (i === highlight) d.classList.add("active");
      d.addEventListener("click", () => onPick(i));
      ys.append(d);
    });
    const bar = el("div", { class: "colorbar", "data-max": String(max) });
    const grad = el("div", { class: "cbar" });
    grad.style.height = `${Math.max(Tq * ch, 90)}px`;
    grad.style.background = `linear-gradient(to top, ${VIRIDIS.map((c) => `rgb(${c})`).join(", ")})`;
    const ticks = el("div", { class: "ticks" });
    ticks.style.height = grad.style.height;
    for (const t of [max, max / 2, 0]) ticks.append(el("span", { class: "tick" }, tick(t)));
    bar.append(grad, ticks, el("div", { class: "cbar-label" }, label));
    fig.append(el("div"), xs, el("div"), ys, canvas, bar);
    box.append(fig);
    canvas.onclick = (ev) => onPick(pickRow(canvas, ev, Tq));
    canvas.onmousemove = (ev) => {
      const r = canvas.getBoundingClientRect();
      const i = pickRow(canvas, ev, Tq);
      const j = Math.min(Tk - 1, Math.max(0, Math.floor(((ev.clientX - r.left) / r.width) * Tk)));
      canvas.title = `${i}: ${shown(queries[i])} → ${j}: ${shown(keys[j])}: ${fmt(rows[i][j], 4)}`;
    };
    return { max, cw, ch };
  }
  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // -- header, tabs and controls --------------------------------------------------------------
  function renderMeta() {
    const m = $("meta");
    m.replaceChildren();
    const line = el("div");
    line.append(el("code", {}, payload.kind), " " + payload.run + " · input: ");
    line.append(el("code", {}, payload.input));
    if (payload.question) line.append(" · question: ", el("code", {}, payload.question));
    m.append(line);
    for (const s of payload.summary || []) m.append(el("div", { class: "summary" }, s));
  }
  function renderTabs() {
    const nav = $("tabs");
    nav.replaceChildren();
    payload.views.forEach((v, k) => {
      const b = el("button", { type: "button", "data-view": v.id }, v.title);
      if (k === state.view) b.classList.add("active");
      b.addEventListener("click", () => selectView(k));
      nav.append(b);
    });
    $("view-note").textContent = view().note || "";
  }
  function renderControls() {
    const v = view(), { L, H } = dims(v);
    const layer = $("layer");
    layer.replaceChildren();
    for (let l = 0; l < L; l++) layer.append(el("option", { value: l }, `${l} · ${v.layers[l]}`));
    layer.value = state.layer;
    const heads = $("heads");
    heads.replaceChildren("Head ");
    const mean = el("button", { type: "button", class: "mean", "data-head": -1 }, "mean");
    heads.append(mean);
    for (let h = 0; h < H; h++) {
      const b = el("button", { type: "button", "data-head": h }, String(h));
      b.style.setProperty("--head", HEAD_COLORS[h % HEAD_COLORS.length]);
      heads.append(b);
    }
    for (const b of heads.querySelectorAll("button")) {
      const on = Number(b.dataset.head) === state.head;
      b.classList.toggle("active", on);
      b.setAttribute("aria-pressed", String(on));
      b.addEventListener("click", () => select({ head: Number(b.dataset.head) }));
    }
    const q = $("query");
    q.replaceChildren();
    v.queries.forEach((t, i) => q.append(el("option", { value: i }, `${i}: ${shown(t)}`)));
    q.value = state.query;
  }

  // -- the panels -----------------------------------------------------------------------------
  function renderHeadView() {
    const v = view(), { H, Tq, Tk } = dims(v), W = floats(v.weights);
    const box = $("headview");
    box.replaceChildren();
    const rowH = 18, width = 460, xl = 150, xr = 310;
    const height = Math.max(Tq, Tk) * rowH + 8;
    const s = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}` });
    const heads = state.head >= 0 ? [state.head] : [...Array(H).keys()];
    const all = Tq * Tk <= 3600; // beyond that, only the focused query's lines
    const lines = svg("g");
    for (let i = 0; i < Tq; i++) {
      if (!all && i !== state.query) continue;
      const focus = i === state.query;
      for (const h of heads) {
        const r = row(v, W, state.layer, h, i);
        let max = 0;
        for (const x of r) if (x > max) max = x;
        for (let j = 0; j < Tk; j++) {
          const a = r[j] / (max || 1); // relative to the row's largest weight
          if (!(a > 0.02)) continue;
          lines.append(svg("line", {
            x1: xl + 4, y1: i * rowH + 13, x2: xr - 4, y2: j * rowH + 13,
            stroke: HEAD_COLORS[h % HEAD_COLORS.length],
            "stroke-width": focus ? 1 + 2 * a : 1,
            // every row's lines visible, the focused query's stronger
            "stroke-opacity": ((focus ? 0.95 : heads.length > 1 ? 0.3 : 0.5) * a).toFixed(3),
            class: focus ? "focus" : "",
            "data-i": i, "data-j": j,
          }));
        }
      }
    }
    s.append(lines);
    const addTokens = (tokens, side) => {
      tokens.forEach((t, i) => {
        const q = side === "query";
        const focus = q && i === state.query;
        const bg = svg("rect", { x: q ? 0 : xr, y: i * rowH + 2, width: xl, height: rowH - 2,
          class: "tokbg" + (focus ? " focus" : "") });
        const txt = svg("text", { x: q ? xl : xr + 2, y: i * rowH + 16, "text-anchor": q ? "end" : "start",
          class: `tok ${side}` + (focus ? " focus" : ""), "data-i": i }, shown(t));
        if (q) {
          for (const e of [bg, txt]) {
            e.addEventListener("mouseenter", () => { if (state.query !== i) select({ query: i }); });
            e.addEventListener("click", () => select({ query: i }));
          }
        }
        s.append(bg, txt);
      });
    };
    addTokens(v.queries, "query");
    addTokens(v.keys, "key");
    box.append(s);
  }

  function renderDetail() {
    const v = view(), { L, H, Tk } = dims(v), l = state.layer, h = state.head, i = state.query;
    const w = row(v, floats(v.weights), l, h, i);
    const sc = v.scores && h >= 0 ? row(v, floats(v.scores), l, h, i) : null;
    const d = v.head_dim;
    const unscaled = sc && d && !v.scores_have_bias;
    let alt = null;
    if (unscaled) { // what the weights would be without the 1/√d: softmax(√d · score)
      let m = -Infinity;
      for (const x of sc) if (x * Math.sqrt(d) > m) m = x * Math.sqrt(d);
      const e = Array.from(sc, (x) => (x === -Infinity ? 0 : Math.exp(x * Math.sqrt(d) - m)));
      const z = e.reduce((a, b) => a + b, 0) || 1;
      alt = e.map((x) => x / z);
    }
    $("unscaled-head").hidden = !unscaled;
    $("score-head").hidden = !v.scores;
    $("score-head").textContent = `score ${v.score_label || "q·k/√d"}`;
    const who = h >= 0 ? `head ${h}` : `mean of ${H} heads`;
    let sum = 0;
    for (const x of w) sum += x;
    $("detail-caption").textContent =
      `layer ${l}/${L - 1} (${v.layers[l]}), ${who}, query ${i}: “${shown(v.queries[i])}”. ` +
      (sc ? (d ? `Head width d = ${d}, √d = ${Math.sqrt(d).toFixed(2)}: ` : "") +
        "the scores" + (v.scores_have_bias ? " (with the position bias)" : "") +
        ` go through softmax into the weights, which sum to ${sum.toFixed(4)}.`
        : (v.scores ? "Raw scores are per head: choose a head to see them. "
          : "This attention reports its weights only. ") + `The weights sum to ${sum.toFixed(4)}.`);
    const body = $("detail").querySelector("tbody");
    body.replaceChildren();
    let max = 0;
    for (const x of w) if (x > max) max = x;
    for (let j = 0; j < Tk; j++) {
      const tr = el("tr", { "data-j": j, "data-weight": String(w[j]) });
      if (sc) tr.setAttribute("data-score", String(sc[j]));
      if (sc && sc[j] === -Infinity) tr.classList.add("masked");
      tr.append(el("td", { class: "key" }, `${j}: ${shown(v.keys[j])}`));
      const st = el("td", { class: "score" }, sc ? fmt(sc[j], 3) : "—");
      st.hidden = !v.scores;
      tr.append(st);
      const u = el("td", { class: "unscaled" }, alt ? fmt(alt[j], 4) : "");
      u.hidden = !unscaled;
      tr.append(u);
      tr.append(el("td", { class: "weight" }, fmt(w[j], 4)));
      const bar = el("td", { class: "bar" });
      const span = el("span");
      span.style.width = `${Math.round((100 * w[j]) / (max || 1))}px`;
      bar.append(span);
      tr.append(bar);
      body.append(tr);
    }
  }

  function matrixRows(v, arr, l, h) {
    const { Tq } = dims(v), rows = [];
    for (let i = 0; i < Tq; i++) rows.push(row(v, arr, l, h, i));
    return rows;
  }
  function pickRow(canvas, ev, n) {
    const r = canvas.getBoundingClientRect();
    return Math.min(n - 1, Math.max(0, Math.floor(((ev.clientY - r.top) / r.height) * n)));
  }
  function renderMatrix() {
    const v = view(), { Tq } = dims(v);
    labelledMap($("matrix-box"), {
      id: "matrix", rows: matrixRows(v, floats(v.weights), state.layer, state.head),
      queries: v.queries, keys: v.keys, highlight: state.query,
      label: "weight",
      onPick: (i) => select({ query: Math.min(i, Tq - 1) }),
    });
  }

  function renderModelView() {
    const v = view(), { L, H, Tq, Tk } = dims(v), W = floats(v.weights);
    const box = $("modelview");
    box.replaceChildren();
    box.style.gridTemplateColumns = `auto repeat(${H}, 76px)`;
    box.append(el("div", { class: "lbl" }, ""));
    for (let h = 0; h < H; h++) {
      const lab = el("div", { class: "lbl hlbl" }, `head ${h}`);
      lab.style.color = HEAD_COLORS[h % HEAD_COLORS.length];
      box.append(lab);
    }
    for (let l = 0; l < L; l++) {
      box.append(el("div", { class: "lbl" }, `layer ${l}`));
      for (let h = 0; h < H; h++) {
        const c = el("canvas", { "data-cell": `${l}-${h}`, title: `layer ${l}, head ${h}` });
        const cs = cellSize(Math.max(Tq, Tk), 72);
        heatmap(c, matrixRows(v, W, l, h), Tk, cs, cs);
        if (l === state.layer && h === state.head) c.classList.add("active");
        c.addEventListener("click", () => select({ layer: l, head: h }));
        box.append(c);
      }
    }
  }

  function renderEntropy() {
    const v = view(), { L, H, Tk } = dims(v), t = $("entropy");
    t.replaceChildren();
    $("entropy-caption").textContent = `Mean over the queries of −Σ a log₂ a (bits): 0 = one key, ` +
      `${Math.log2(Tk).toFixed(2)} = all ${Tk} keys evenly. Click one to open it.`;
    const head = el("tr");
    head.append(el("th", {}, ""));
    for (let h = 0; h < H; h++) head.append(el("th", {}, `h${h}`));
    t.append(head);
    for (let l = 0; l < L; l++) {
      const tr = el("tr");
      tr.append(el("th", {}, `layer ${l}`));
      for (let h = 0; h < H; h++) {
        const e = v.entropy[l][h];
        const td = el("td", { "data-cell": `${l}-${h}` }, e.toFixed(2));
        const [R, G, B] = color(e / Math.max(Math.log2(Tk), 1e-9));
        td.style.background = `rgba(${R},${G},${B},0.45)`;
        if (l === state.layer && h === state.head) td.classList.add("active");
        td.addEventListener("click", () => select({ layer: l, head: h }));
        tr.append(td);
      }
      t.append(tr);
    }
  }

  function renderRollout() {
    const v = view();
    $("rollout-panel").hidden = !v.rollout;
    if (!v.rollout) return;
    const [T, Tk] = v.rollout.shape, R = floats(v.rollout), rows = [];
    for (let i = 0; i < T; i++) rows.push(R.subarray(i * Tk, (i + 1) * Tk));
    labelledMap($("rollout-box"), {
      id: "rollout", rows, queries: v.queries, keys: v.keys, highlight: state.query,
      label: "rollout", onPick: (i) => select({ query: i }),
    });
  }

  /* ACT's steps per position (payload.act): a bar per token, N of the budget. */
  function renderSteps() {
    const act = payload.act;
    $("steps-panel").hidden = !act;
    const t = $("act-steps");
    t.replaceChildren();
    if (!act) return;
    const head = el("tr");
    for (const h of ["token", "steps N", "remainder R", "N + R", ""]) head.append(el("th", {}, h));
    t.append(head);
    act.tokens.forEach((tok, i) => {
      const tr = el("tr", { class: "act-row", "data-query": i, "data-steps": String(act.steps[i]) });
      if (i === state.query) tr.classList.add("active");
      tr.append(el("td", { class: "tok" }, shown(tok)), el("td", {}, String(act.steps[i])));
      tr.append(el("td", {}, fmt(act.remainder[i], 3)), el("td", {}, fmt(act.ponder[i], 3)));
      const bar = el("td", { class: "bar" }), sp = el("span");
      sp.style.width = `${Math.round((100 * act.steps[i]) / act.max_steps)}px`;
      bar.append(sp);
      tr.append(bar);
      tr.addEventListener("click", () => select({ query: i }));
      t.append(tr);
    });
  }

  /* A masked LM's guesses at each [MASK] (payload.predictions): click one to make it the query. */
  function renderPredictions() {
    const preds = (payload.predictions || []).filter((p) => p.view === view().id);
    $("predict-panel").hidden = !payload.predictions;
    const box = $("predictions");
    box.replaceChildren();
    if (!payload.predictions) return;
    if (!preds.length) {
      box.append(el("p", { class: "hint" }, "No [MASK] in the text: write [MASK] where a token is to be predicted."));
      return;
    }
    for (const p of preds) {
      const card = el("div", { class: "mask", "data-query": p.query, "data-mask": p.mask });
      if (p.query === state.query) card.classList.add("active");
      card.append(el("div", { class: "mask-title" }, `[MASK] ${p.mask + 1} · token ${p.query}`));
      const t = el("table");
      for (const c of p.candidates) {
        const tr = el("tr", { class: "cand", "data-token": c.token, "data-p": String(c.p) });
        tr.append(el("td", { class: "tok" }, shown(c.token)), el("td", {}, fmt(c.p, 3)));
        const bar = el("td", { class: "bar" }), sp = el("span");
        sp.style.width = `${Math.round(100 * c.p)}px`;
        bar.append(sp);
        tr.append(bar);
        t.append(tr);
      }
      card.append(t);
      card.addEventListener("click", () => select({ query: p.query }));
      box.append(card);
    }
  }

  /* The query's weights (or rollout row) over the image patches, as a spotlight; the chosen
     query's own patch (when queries are patches too) is outlined. */
  function drawOverImage(canvas, values, outline) {
    const g = view().grid, ctx = canvas.getContext("2d");
    const W = 256, Hh = Math.round((256 * payload.image.height) / payload.image.width);
    canvas.width = W; canvas.height = Hh;
    ctx.imageSmoothingEnabled = false;
    if (image && image.complete) ctx.drawImage(image, 0, 0, W, Hh);
    let max = 0;
    for (let k = 0; k < g.rows * g.cols; k++) max = Math.max(max, values[g.key_offset + k]);
    const cw = W / g.cols, ch = Hh / g.rows;
    for (let r = 0; r < g.rows; r++) {
      for (let c = 0; c < g.cols; c++) {
        const a = values[g.key_offset + r * g.cols + c] / (max || 1);
        const [R, G, B] = color(a);
        ctx.fillStyle = `rgba(${R},${G},${B},${0.25 + 0.45 * a})`;
        ctx.fillRect(c * cw, r * ch, cw, ch);
        ctx.fillStyle = `rgba(0,0,0,${0.55 * (1 - a)})`;
        ctx.fillRect(c * cw, r * ch, cw, ch);
      }
    }
    const q = outline ? state.query - g.query_offset : -1;
    if (q >= 0 && q < g.rows * g.cols) {
      ctx.strokeStyle = "#ff2d55";
      ctx.lineWidth = 2;
      ctx.strokeRect((q % g.cols) * cw + 1, Math.floor(q / g.cols) * ch + 1, cw - 2, ch - 2);
    }
  }
  function patchAt(canvas, ev) {
    const g = view().grid, b = canvas.getBoundingClientRect();
    const c = Math.min(g.cols - 1, Math.floor(((ev.clientX - b.left) / b.width) * g.cols));
    const r = Math.min(g.rows - 1, Math.floor(((ev.clientY - b.top) / b.height) * g.rows));
    return r * g.cols + c;
  }
  function renderImage() {
    const v = view(), on = Boolean(v.grid && payload.image);
    $("image-panel").hidden = !on;
    if (!on) return;
    const g = v.grid, patches = g.query_offset !== null && g.query_offset !== undefined;
    const W = floats(v.weights), l = state.layer, h = state.head;
    const main = $("image-attn");
    drawOverImage(main, row(v, W, l, h, state.query), patches);
    main.onclick = patches ? (ev) => select({ query: g.query_offset + patchAt(main, ev) }) : null;
    const ro = $("image-rollout");
    ro.parentElement.hidden = !v.rollout;
    if (v.rollout) {
      const Tk = v.rollout.shape[1];
      drawOverImage(ro, floats(v.rollout).subarray(state.query * Tk, (state.query + 1) * Tk), patches);
      ro.onclick = main.onclick;
    }
    // words looking at the image (captioning, VQA): one small map per word
    const strip = $("image-strip"), { Tq } = dims(v);
    strip.replaceChildren();
    strip.hidden = patches || Tq > 60;
    if (strip.hidden) return;
    for (let i = 0; i < Tq; i++) {
      const fig = el("figure", { "data-i": i });
      const c = el("canvas");
      drawOverImage(c, row(v, W, l, h, i), false);
      fig.append(c, el("figcaption", {}, shown(v.queries[i])));
      if (i === state.query) fig.classList.add("active");
      fig.addEventListener("click", () => select({ query: i }));
      strip.append(fig);
    }
  }

  // -- state ----------------------------------------------------------------------------------
  function render() {
    const has = Boolean(payload && payload.views && payload.views.length);
    $("app").hidden = !has;
    $("empty-note").hidden = has;
    if (!has) return;
    renderMeta();
    renderTabs();
    renderControls();
    renderPanels();
  }
  function renderPanels() {
    renderHeadView();
    renderDetail();
    renderMatrix();
    renderImage();
    renderModelView();
    renderEntropy();
    renderRollout();
    renderPredictions();
    renderSteps();
  }
  function select(change) {
    const before = { ...state };
    Object.assign(state, change);
    const { L, H, Tq } = dims(view());
    state.layer = Math.min(Math.max(state.layer, 0), L - 1);
    state.head = Math.min(Math.max(state.head, -1), H - 1);
    state.query = Math.min(Math.max(state.query, 0), Tq - 1);
    if (before.layer !== state.layer || before.head !== state.head) renderControls();
    $("query").value = state.query;
    renderPanels();
  }
  function selectView(k) {
    state.view = k;
    state.query = view().query || 0;
    const { L, H } = dims(view());
    state.layer = Math.min(state.layer, L - 1);
    state.head = Math.min(state.head, H - 1);
    render();
  }
  function setPayload(p) {
    payload = p;
    image = null;
    if (payload && payload.image) {
      image = new Image();
      image.onload = () => { if (view()) renderImage(); };
      image.src = payload.image.src;
    }
    if (payload && payload.views && payload.views.length) {
      const same = payload.views.findIndex((v) => v.id === (config._lastView || ""));
      state.view = same >= 0 ? same : 0;
      state.query = view().query || 0;
      const { L, H } = dims(view());
      state.layer = Math.min(state.layer, L - 1);
      state.head = Math.min(state.head, H - 1);
    }
    render();
  }

  $("layer").addEventListener("change", (e) => select({ layer: Number(e.target.value) }));
  $("query").addEventListener("change", (e) => select({ query: Number(e.target.value) }));
  // the page's API (the served page's form in explorer_form.js, and the tests)
  window.attnExplorer = { state, config, payload: () => payload, view, select, selectView, setPayload };
  setPayload(payload);
})();
