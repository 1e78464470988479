/* attnlab attention explorer: the served page's form (attnlab explore --serve).
 *
 * Posts the typed text (or the chosen image, and a question for VQA) to the local server's
 * /api/explore and hands the reply to the explorer (window.attnExplorer, explorer.js); a refusal
 * is shown on the page. Enter submits, Shift+Enter starts a new line. Inert in a written file.
 */
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const ex = window.attnExplorer;
  const config = ex.config;

  function showError(msg) {
    $("error").hidden = !msg;
    $("error").textContent = msg || "";
  }
  function readFile(file) {
    return new Promise((resolve, reject) => {
      const r = new FileReader();
      r.onload = () => resolve(r.result);
      r.onerror = () => reject(new Error(`cannot read ${file.name}`));
      r.readAsDataURL(file);
    });
  }
  async function submit(ev) {
    ev.preventDefault();
    const s = config.serve, body = {};
    try {
      if (s.input === "text") {
        body.text = $("input-text").value;
        if (body.text.length > s.max_chars) throw new Error(`the text is longer than ${s.max_chars} characters`);
      } else {
        const file = $("input-image").files[0];
        if (file) {
          if (file.size > s.max_image_bytes) throw new Error(`${file.name} is larger than ${s.max_image_bytes} bytes`);
          body.image = await readFile(file);
          body.image_name = file.name;
        } else if (ex.payload() && ex.payload().image) {
          body.image = ex.payload().image.src; // the image shown (e.g. a new question about it)
          body.image_name = ex.payload().input;
        } else {
          throw new Error("choose an image file");
        }
      }
      if (s.question) body.question = $("input-question").value;
    } catch (err) {
      showError(err.message);
      return;
    }
    $("busy").hidden = false;
    try {
      const r = await fetch("api/explore", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
      const out = await r.json();
      if (!r.ok) { showError(out.error || `error ${r.status}`); return; }
      showError("");
      const shown = ex.payload();
      config._lastView = shown && shown.views ? ex.view().id : "";
      ex.setPayload(out);
    } catch (err) {
      showError(`the server did not answer: ${err.message}`);
    } finally {
      $("busy").hidden = true;
    }
  }
  function setUpForm() {
    const s = config.serve;
    if (!s) return;
    $("input-form").hidden = false;
    $("text-label").hidden = s.input !== "text";
    $("image-label").hidden = s.input !== "image";
    $("question-label").hidden = !s.question;
    $("form-hint").hidden = s.input !== "text";
    const payload = ex.payload();
    if (payload && s.input === "text") $("input-text").value = payload.input || "";
    if (payload && s.question) $("input-question").value = payload.question || "";
    if (s.placeholder) $("input-text").placeholder = s.placeholder;
    $("input-form").addEventListener("submit", submit);
    // Enter explains (as in the question box); Shift+Enter writes a new line
    $("input-text").addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
        ev.preventDefault();
        $("input-form").requestSubmit();
      }
    });
  }

  setUpForm();
})();
