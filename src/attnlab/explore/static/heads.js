// Per-head diagnostics under the explorer, and (served page) ablating heads.
// Reads the payload through window.attnExplorer (explorer.js) and redraws whenever the page does.
(function () {
  const X = window.attnExplorer;
  if (!X) return;
  const config = JSON.parse(document.getElementById("attn-config").textContent || "{}");
  const panels = document.getElementById("panels");
  const section = document.createElement("section");
  section.className = "panel wide";
  section.id = "heads-panel";
  panels.append(section);
  const COLS = [
    ["entropy", "entropy"], ["uniformity", "uniform"], ["previous_token", "prev"],
    ["first_token", "first"], ["diagonal", "diag"], ["causal_leak", "leak"],
  ];
  let chosen = {}; // layer -> Set of heads to ablate
  let result = null; // {summary, ablated} of the last ablation request, or {error}

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function fmt(v) { return v === undefined || v === null ? "–" : Number(v).toFixed(2); }

  function render() {
    const p = X.payload();
    section.replaceChildren();
    if (!p || !p.heads) { section.hidden = true; return; }
    section.hidden = false;
    section.append(el("h2", {}, "Head diagnostics"));
    section.append(el("p", { class: "hint" },
      "Per head on this input: entropy (nats), uniformity (1 = uniform over the keys it may see), " +
      "previous-token, first-token (sink) and diagonal weight, and the largest weight on later " +
      "tokens where the model is causal. Flags mark degenerate heads." +
      (config.serve ? " Tick heads to ablate them (zero their output) and see the prediction change." : "")));
    for (const [id, rows] of Object.entries(p.heads)) {
      const v = (p.views || []).find((x) => x.id === id);
      section.append(el("h3", {}, v ? v.title : id));
      const table = el("table", { class: "heads-table", "data-view": id });
      const head = el("tr");
      for (const t of ["layer", "head", ...COLS.map((c) => c[1]), "flags", ...(config.serve ? ["ablate"] : [])]) head.append(el("th", {}, t));
      table.append(head);
      for (const r of rows) {
        const tr = el("tr", r.flags.length ? { class: "flagged" } : {});
        tr.append(el("td", {}, r.layer), el("td", {}, String(r.head)));
        for (const [k] of COLS) tr.append(el("td", {}, fmt(r[k])));
        tr.append(el("td", {}, r.flags.join("; ")));
        if (config.serve) {
          const td = el("td");
          if (r.ablatable) {
            const box = el("input", { type: "checkbox", "data-layer": r.layer, "data-head": String(r.head) });
            box.checked = Boolean(chosen[r.layer] && chosen[r.layer].has(r.head));
            box.addEventListener("change", () => toggle(r.layer, r.head, box.checked));
            td.append(box);
          }
          tr.append(td);
        }
        table.append(tr);
      }
      section.append(table);
    }
    if (config.serve) {
      const out = el("div", { id: "ablation-result" });
      if (result && result.error) out.append(el("div", { class: "error" }, result.error));
      else if (result) {
        out.append(el("div", {}, "with " + result.label + " ablated:"));
        for (const s of result.summary || []) out.append(el("div", { class: "summary" }, s));
      }
      section.append(out);
    }
  }

  function toggle(layer, head, on) {
    if (!chosen[layer]) chosen[layer] = new Set();
    if (on) chosen[layer].add(head); else chosen[layer].delete(head);
    ablate();
  }

  async function ablate() {
    const p = X.payload();
    const spec = {};
    for (const [k, s] of Object.entries(chosen)) if (s.size) spec[k] = [...s].sort((a, b) => a - b);
    const names = Object.entries(spec).flatMap(([k, hs]) => hs.map((h) => `${k} head ${h}`));
    if (!names.length) { result = null; render(); return; }
    const body = { ablate: spec };
    if (p.image && p.image.src) { body.image = p.image.src; body.image_name = p.input; }
    else body.text = p.input;
    if (p.question) body.question = p.question;
    try {
      const r = await fetch("api/explore", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
      const out = await r.json();
      result = r.ok ? { summary: out.summary, label: names.join(", ") } : { error: out.error || `error ${r.status}` };
    } catch (err) {
      result = { error: `the server did not answer: ${err.message}` };
    }
    render();
  }

  let last = null;
  new MutationObserver(() => {
    const p = X.payload();
    if (p !== last) { last = p; chosen = {}; result = null; render(); }
  }).observe(document.getElementById("meta"), { childList: true });
  last = X.payload();
  render();
})();
