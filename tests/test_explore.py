"""The explorer's numbers: the payload holds exactly the model's attention weights and raw scores,
its entropy and rollout follow their formulas, and bad input gets one clear message."""

from __future__ import annotations

import base64
import contextlib
import http.client
import io
import json
import logging
import math
import re
import socket
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.attention import capture_attention
from attnlab.cli import main
from attnlab.data.images import load_digits
from attnlab.data.scenes import SceneConfig, SceneSet
from attnlab.explore import ExploreInput, Explorer, make_server, render_page
from attnlab.explore import server as srv
from attnlab.explore.images import decode_image
from attnlab.explore.payload import entropy_bits, rollout_matrix
from attnlab.explore.text import DEFAULT_TEXT
from attnlab.runs import load
from attnlab.tasks.mlm import fill_mask
from attnlab.viz.vision import attention_rollout
from explore_runs import (
    LM_TEXT,
    _config,
    _save,
    image_file,
    image_run,
    lm_run,
    mlm_run,
    scene_run,
    translation_run,
)


def decode(arr: dict) -> torch.Tensor:
    """A payload array back to a tensor."""
    data = np.frombuffer(base64.b64decode(arr["data"]), dtype="<f4")
    return torch.from_numpy(data.copy()).view(arr["shape"])


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return lm_run(tmp_path_factory.mktemp("explore") / "lm")


def cli(*args: str) -> subprocess.CompletedProcess:
    """``attnlab ARGS`` in this process (a subprocess would import torch again for each)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())


def test_raw_scores_are_qk_over_sqrt_d_and_their_softmax_is_the_weights(lm):
    """capture_attention(scores=True): the reported scores are Q Kᵀ/√d recomputed from the layer's
    own Q/K projection of its input (causal entries −∞), and softmax(scores) is the weights."""
    model = load(lm).model
    idx = torch.tensor([[1, 5, 3, 7, 2, 9]])
    inputs = {}
    attn = model.blocks[1].attn
    hook = attn.register_forward_pre_hook(lambda m, args: inputs.setdefault("x", args[0]))
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        model(idx)
    hook.remove()
    scores, weights = maps.scores("blocks.1.attn"), maps["blocks.1.attn"]
    B, T, C = inputs["x"].shape
    H, D = attn.n_heads, attn.head_dim
    q, k, _ = attn.qkv(inputs["x"]).split(C, dim=-1)
    q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    k = k.view(B, T, H, D).transpose(1, 2)
    expected = (q @ k.transpose(-2, -1)) / math.sqrt(D)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    torch.testing.assert_close(scores[..., causal], expected[..., causal])
    assert torch.isinf(scores[..., ~causal]).all() and (scores[..., ~causal] < 0).all()
    torch.testing.assert_close(scores.softmax(-1), weights)
    with torch.no_grad(), capture_attention(model) as plain:  # scores only when asked
        model(idx)
    assert plain.scores("blocks.1.attn") is None


def test_lm_payload_holds_the_models_weights_and_scores(lm):
    payload = Explorer(lm).explain(ExploreInput(text="the cat sat"))
    (view,) = payload["views"]
    model = load(lm).model
    ids = load(lm).tokenizer.encode("the cat sat")
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        model(torch.tensor([ids]))
    assert view["queries"] == list("the cat sat") and view["keys"] == view["queries"]
    assert view["layers"] == ["blocks.0.attn", "blocks.1.attn"]
    w, s = decode(view["weights"]), decode(view["scores"])
    assert w.shape == (2, 4, 11, 11)
    for layer, name in enumerate(view["layers"]):
        assert torch.equal(w[layer], maps[name][0])  # the same float32 numbers
        assert torch.equal(s[layer], maps.scores(name)[0])
    assert view["head_dim"] == 16 and view["query"] == len(ids) - 1
    assert payload["summary"][1].startswith("next token:")
    json.dumps(payload, allow_nan=False)  # plain JSON: −∞ only inside the float32 data


def test_entropy_is_mean_row_entropy_in_bits():
    w = torch.tensor([[[[1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.0, 0.0, 0.0, 0.0]]]])
    # rows: one key (0 bits), four keys evenly (2 bits), a fully masked row (left out)
    assert entropy_bits(w).item() == pytest.approx(1.0)


def test_rollout_matches_the_vision_rollout_and_is_row_stochastic():
    """Row 0 of the rollout matrix is the class token's rollout of attnlab.viz.vision (a live
    reference), and every row of it is a distribution."""
    torch.manual_seed(0)
    w = torch.rand(3, 2, 5, 5).softmax(-1)  # (L, H, T, T)
    r = rollout_matrix(w)
    reference = attention_rollout([layer[None] for layer in w], n_prefix=1)[0]  # (T - 1,)
    torch.testing.assert_close(r[0, 1:], reference)
    torch.testing.assert_close(r.sum(-1), torch.ones(5))


def test_page_is_self_contained(lm, tmp_path):
    """One file: inline script and style, the data embedded, a policy that forbids requests, no
    URL of anywhere else, and no way for the data to close its script element."""
    payload = Explorer(lm).explain(ExploreInput(text="the cat sat"))
    payload["input"] = "</script><script>alert(1)</script>"
    page = render_page(payload)
    assert "connect-src 'none'" in page and "default-src 'none'" in page
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", page)
    assert "<link" not in page and "@import" not in page and "url(" not in page
    assert page.count("</script>") == 3  # config, data, the explorer
    data = page.split('<script id="attn-data" type="application/json">')[1].split("</script>")[0]
    assert json.loads(data)["input"] == payload["input"]


def test_cli_writes_the_page(lm, tmp_path):
    out = tmp_path / "page.html"
    r = cli("explore", str(lm), "--input", "a dog ran", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 10_000 and "wrote" in r.stdout


@pytest.fixture(scope="module")
def lstm(tmp_path_factory):
    run = tmp_path_factory.mktemp("explore") / "lstm"
    _save(run, "lstm_lm", load_config("lstm_lm"))
    return run


def load_config(kind):
    return _config(kind)


def _one_line_error(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnlab: error:"), r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_bad_input_is_one_clear_message(lm, lstm, tmp_path):
    png = image_file(tmp_path / "digit.png")
    out = str(tmp_path / "p.html")
    _one_line_error(
        cli("explore", str(lstm), "--input", "x", "--out", out), "lstm_lm", "no attention"
    )
    _one_line_error(
        cli("explore", str(lm), "--input", str(png), "--out", out), "reads text", "image"
    )
    _one_line_error(
        cli("explore", str(lm), "--input", LM_TEXT * 2, "--out", out), "tokens", "context is 32"
    )
    _one_line_error(cli("explore", str(lm), "--out", out), "--input")
    _one_line_error(
        cli("explore", str(lm), "--input", "a", "--question", "why?", "--out", out), "question"
    )
    _one_line_error(cli("explore", str(lm), "--input", "a €", "--out", out), "€")
    _one_line_error(cli("explore", str(lm), "--serve", "--question", "why?"), "no question")
    assert not Path(out).exists()


def test_text_for_an_image_model_is_refused(tmp_path):
    run = image_run(tmp_path / "vit")
    r = cli("explore", str(run), "--input", "not an image", "--out", str(tmp_path / "p.html"))
    _one_line_error(r, "reads an image file")


def test_port_in_use_is_one_clear_message(lm):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = cli("explore", str(lm), "--serve", "--port", str(port))
    _one_line_error(r, f"port {port}", "in use")


def test_swin_windows_are_put_back_on_the_grid(tmp_path):
    """Each Swin block's window attention, put back on the token grid, is non-zero exactly
    between tokens that share a window of the (rolled) map and, in shifted blocks, a region of
    the shift mask — the layout of Liu et al. §3.2 written out per token — and sums to 1."""
    run = image_run(tmp_path / "swin", "swin")
    data = image_file(tmp_path / "x.png").read_bytes()
    payload = Explorer(run).explain(ExploreInput(image=data, image_name="x.png"))
    cfg = load(run).model.config
    assert [v["id"] for v in payload["views"]] == ["stage0", "stage1"]
    for stage, view in enumerate(payload["views"]):
        R = cfg.image_size // cfg.patch_size // 2**stage
        w = min(cfg.window_size, R)
        w_ = decode(view["weights"])  # (L, H, N, N)
        for block in range(w_.shape[0]):
            s = cfg.window_size // 2 if block % 2 and R > cfg.window_size else 0
            r, c = torch.arange(R).repeat_interleave(R), torch.arange(R).repeat(R)  # (N,)
            rr, cc = (r - s) % R, (c - s) % R  # where each token sits in the rolled map
            window = (rr // w) * (R // w) + cc // w

            def region(i, R=R, w=w, s=s):  # the shift mask's strips: 0, 1, 2 along an axis
                return (i >= R - w).long() + (i >= R - s).long() if s else torch.zeros_like(i)

            label = window * 9 + region(rr) * 3 + region(cc)
            allowed = label[:, None] == label[None, :]  # (N, N)
            assert torch.equal(w_[block] > 0, allowed.expand_as(w_[block])), (stage, block)
            torch.testing.assert_close(w_[block].sum(-1), torch.ones(w_.shape[1:3]))


def test_translation_payload_has_the_three_alignments(tmp_path):
    for kind, views in (("transformer", ["cross", "encoder", "decoder"]), ("rnn-attn", ["cross"])):
        run = translation_run(tmp_path / kind, kind)
        payload = Explorer(run).explain(ExploreInput(text="Two hundred and three"))
        assert [v["id"] for v in payload["views"]] == views
        cross = payload["views"][0]
        assert cross["keys"] == ["two", "hundred", "and", "three"]
        L, H, T, S = cross["weights"]["shape"]
        assert S == 4 and T == len(cross["queries"]) >= 1
        torch.testing.assert_close(decode(cross["weights"]).sum(-1), torch.ones(L, H, T))
    _one_line_error(
        cli("explore", str(run), "--input", "two zillion", "--out", str(tmp_path / "p.html")),
        "zillion",
    )


def test_server_answers_json_and_refuses_foreign_hosts_and_large_bodies(lm):
    server = make_server(Explorer(lm), port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    def post(body: bytes, host: str = f"127.0.0.1:{port}", headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/api/explore", body, {"Host": host, **(headers or {})})
        r = conn.getresponse()
        out = (r.status, json.loads(r.read()))
        conn.close()
        return out

    try:
        status, payload = post(json.dumps({"text": "a cat"}).encode())
        assert status == 200 and payload["views"][0]["queries"] == list("a cat")
        assert post(b"{not json")[0] == 400
        status, err = post(json.dumps({"text": 3}).encode())
        assert status == 400 and "text must be a string" in err["error"]
        status, err = post(json.dumps({"image": "data:image/png;base64,AAAA"}).encode())
        assert status == 400 and "reads text" in err["error"]
        assert post(json.dumps({"text": "a"}).encode(), host="evil.example:80")[0] == 403
        big = {"Content-Length": str(10**9)}
        assert post(b"{}", headers=big)[0] == 413
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/")
        page = conn.getresponse().read().decode()
        assert "connect-src 'self'" in page and '"serve":{"input":"text"' in page
    finally:
        server.shutdown()
        server.server_close()


def test_caption_and_vqa_payloads_put_the_words_over_the_image(tmp_path):
    """Captioning: one row per generated word (its cross-attention over the image-token grid,
    the numbers of a teacher-forced pass over the caption); VQA: one row per question word."""
    data = image_file(tmp_path / "scene.png", size=32, channels=3).read_bytes()

    x = decode_image(data, size=(32, 32), channels=3)[None]
    run = scene_run(tmp_path / "cap", "caption_transformer")
    payload = Explorer(run).explain(ExploreInput(image=data, image_name="scene.png"))
    cross = payload["views"][0]
    model, vocab = load(run)
    words = cross["queries"]
    assert payload["summary"] == [f"caption: {vocab.decode([vocab.stoi[w] for w in words])}"]
    tokens = [vocab.START] + [vocab.stoi[w] for w in words[:-1]]
    with torch.no_grad(), capture_attention(model) as maps:
        model(x, torch.tensor([tokens]))
    expected = torch.stack([w[0] for w in maps.select("cross_attn")])  # (L, H, T, N)
    assert torch.equal(decode(cross["weights"]), expected)
    assert cross["grid"]["rows"] * cross["grid"]["cols"] == expected.shape[-1]

    run = scene_run(tmp_path / "vqa", "vqa_transformer")
    question = "what colour is the circle ?"
    payload = Explorer(run).explain(
        ExploreInput(image=data, image_name="scene.png", question=question)
    )
    cross = payload["views"][0]
    assert cross["queries"] == question.split()
    model, vocab = load(run)
    ids = [vocab.stoi[w] for w in question.split()]
    with torch.no_grad(), capture_attention(model) as maps:
        logits = model(x, torch.tensor([ids]), torch.tensor([len(ids)]))
    expected = torch.stack([w[0] for w in maps.select("cross_attn")])
    assert torch.equal(decode(cross["weights"]), expected)
    best = vocab.answers[int(logits[0].argmax())]
    assert payload["summary"][0].startswith(f"answer: {best} ")
    with pytest.raises(ValueError, match="question"):
        Explorer(run).explain(ExploreInput(image=data, image_name="scene.png"))


def _raw_request(port: int, data: bytes, *, half_close: bool = True) -> tuple[int, dict]:
    """Send ``data`` as it is on a fresh connection; the status and JSON body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"application/json" in head, head
    return status, json.loads(body)


def test_server_answers_every_bad_request_with_a_4xx_json_error_and_keeps_serving(
    lm, tmp_path, monkeypatch, caplog, capfd
):
    """Malformed JSON, wrong types, unknown or missing fields, oversized, short or stalled
    bodies, unknown paths and methods, a broken request line, empty text, text outside the
    vocabulary: each is a 4xx with ``{"error": ...}``, nothing reaches the log as a traceback,
    and the next good request is answered."""
    monkeypatch.setattr(srv._Handler, "timeout", 1.0)  # the stalled client below
    caplog.set_level(logging.DEBUG, logger="attnlab")
    server = make_server(Explorer(lm), port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    host = f"Host: 127.0.0.1:{port}\r\n".encode()

    def post(body: bytes, *, length: int | None = None, path: str = "/api/explore") -> bytes:
        n = len(body) if length is None else length
        return (
            b"POST "
            + path.encode()
            + b" HTTP/1.1\r\n"
            + host
            + b"Content-Length: %d\r\n\r\n" % n
            + body
        )

    deep = b"[" * 100_000 + b"]" * 100_000
    bad = {
        "not JSON": (post(b"{not json"), 400, "not JSON"),
        "not UTF-8": (post(b'{"text": "\xff\xfe"}'), 400, "UTF-8"),
        "nested": (post(deep), 400, "nested too deeply"),
        "a list": (post(b'["the cat"]'), 400, "JSON object"),
        "empty body": (post(b""), 400, "empty"),
        "wrong type": (post(b'{"text": 3}'), 400, "text must be a string"),
        "null text": (post(b'{"text": null}'), 400, "reads text"),
        "unknown field": (post(b'{"txt": "a cat"}'), 400, "unknown field 'txt'"),
        "lone surrogate": (post(b'{"text": "a \\ud800"}'), 400, "surrogate"),
        "long integer": (post(b'{"text": ' + b"1" * 5000 + b"}"), 400, ""),
        "empty text": (post(b'{"text": ""}'), 400, "give some"),
        "blank text": (post(b'{"text": "   "}'), 400, "give some"),
        "not in the vocabulary": (post(b'{"text": "a \\u20ac"}'), 400, "€"),
        "too long": (post(json.dumps({"text": "a" * 40}).encode()), 400, "context is 32"),
        "image for text": (post(b'{"image": "data:image/png;base64,AAAA"}'), 400, "reads text"),
        "question": (post(b'{"text": "a", "question": "why?"}'), 400, "question"),
        "oversized": (post(b"{}", length=10**9), 413, "larger than"),
        "negative length": (post(b"{}", length=-5), 400, "negative"),
        "short body": (post(b'{"text": "a"}', length=500), 400, "shorter than"),
        "no length": (b"POST /api/explore HTTP/1.1\r\n" + host + b"\r\n", 411, "Content-Length"),
        "chunked": (
            b"POST /api/explore HTTP/1.1\r\n"
            + host
            + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            411,
            "Content-Length",
        ),
        "unknown path": (post(b'{"text": "a"}', path="/api/other"), 404, "not found"),
        "unknown GET": (b"GET /etc/passwd HTTP/1.1\r\n" + host + b"\r\n", 404, "not found"),
        "PUT": (b"PUT /api/explore HTTP/1.1\r\n" + host + b"Content-Length: 0\r\n\r\n", 405, "PUT"),
        "made-up method": (b"BREW / HTTP/1.1\r\n" + host + b"\r\n", 405, "BREW"),
        "broken request line": (b"GARBAGE\r\n\r\n", 400, ""),
        "foreign host": (
            b"POST /api/explore HTTP/1.1\r\nHost: evil.example\r\nContent-Length: 2\r\n\r\n{}",
            403,
            "forbidden host",
        ),
    }
    try:
        for what, (request, status, words) in bad.items():
            got, body = _raw_request(port, request)
            assert got == status and words in body["error"], (what, got, body)
        # a client that stops sending mid-body: the server gives up on it after its timeout
        got, body = _raw_request(port, post(b'{"text"', length=100), half_close=False)
        assert got == 408 and "did not arrive" in body["error"]
        # a client that hangs up before the answer is only a debug line
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(post(json.dumps({"text": "the cat"}).encode()))
        got, payload = _raw_request(port, post(json.dumps({"text": "the mat"}).encode()))
        assert got == 200 and payload["views"][0]["queries"] == list("the mat")
    finally:
        server.shutdown()
        server.server_close()
    assert "Traceback" not in caplog.text and "Traceback" not in capfd.readouterr().err
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_mlm_payload_is_bidirectional_and_predicts_the_masks_as_fill_mask_does(tmp_path):
    """An encoder_mlm run: one view over ``[CLS] text [SEP]`` holding the model's own weights
    (every query attends to keys on both sides), and per [MASK] the candidates and
    probabilities of :func:`attnlab.tasks.mlm.fill_mask`; the CLI writes its page."""
    run = mlm_run(tmp_path / "mlm")
    text = "the [MASK]at sat on [MASK]he mat"
    payload = Explorer(run).explain(ExploreInput(text=text))
    (view,) = payload["views"]
    model, tok = load(run)
    seq = [tok.cls_id, *tok.encode(text), tok.sep_id]
    assert (
        view["queries"]
        == view["keys"]
        == ["[CLS]", *"the ", "[MASK]", *"at sat on ", "[MASK]", *"he mat", "[SEP]"]
    )
    with torch.no_grad(), capture_attention(model, scores=True) as maps:
        model(torch.tensor([seq]))
    torch.testing.assert_close(decode(view["weights"]), torch.stack([w[0] for w in maps.values()]))
    assert (decode(view["weights"]) > 0).all()  # no causal mask: later keys get weight too
    expected = fill_mask(model, tok, text, top_k=5)
    preds = payload["predictions"]
    assert [p["query"] for p in preds] == [i for i, t in enumerate(seq) if t == tok.mask_id]
    assert view["query"] == preds[0]["query"] == 5
    for p, e in zip(preds, expected, strict=True):
        assert [c["token"] for c in p["candidates"]] == [t for t, _ in e.candidates]
        assert [c["p"] for c in p["candidates"]] == pytest.approx([q for _, q in e.candidates])
    # without [MASK]: the attention, and a line saying how to ask for predictions
    plain = Explorer(run).explain(ExploreInput(text="the cat"))
    assert plain["predictions"] == [] and "no [MASK]" in plain["summary"][-1]
    out = tmp_path / "mlm.html"
    r = cli("explore", str(run), "--input", text, "--out", str(out))
    assert r.returncode == 0 and out.exists(), r.stderr
    _one_line_error(
        cli("explore", str(run), "--input", "a" * 31, "--out", str(out)), "[CLS] and [SEP]", "32"
    )


def test_served_page_opens_with_an_example_input_for_every_family(lm, tmp_path):
    """Without --input the served page shows an example the run can read: a sentence in its
    vocabulary, the first test digit of a digits classifier, a generated scene (with its first
    question for VQA); a classifier of files on disk opens with the bare form."""

    def first_payload(run):
        server = make_server(Explorer(run), port=0)
        server.server_close()
        return server.payload

    alphabet = set(LM_TEXT + "ehlowrdbq")  # lm_run's characters; its context is 32
    readable = "".join(c for c in DEFAULT_TEXT if c in alphabet)
    assert len(readable) > 32 and first_payload(lm)["input"] == readable[:33].rsplit(" ", 1)[0]
    assert "[MASK]" in first_payload(mlm_run(tmp_path / "mlm"))["input"]
    # the test vocabulary has no "forty": its first four words instead
    assert first_payload(translation_run(tmp_path / "de"))["views"][0]["keys"] == [
        "one", "two", "three", "four"
    ]  # fmt: skip
    vit = image_run(tmp_path / "vit")
    assert first_payload(vit) is None  # no data source recorded: the page asks for a file
    config = json.loads((vit / "config.json").read_text())
    (vit / "config.json").write_text(json.dumps({**config, "task": {"data": "digits"}}))
    shown = Explorer(vit).default_input()
    digit = load_digits(seed=0).test[0][0]  # (1, 8, 8)
    torch.testing.assert_close(
        decode_image(shown.image, size=(8, 8), channels=1), digit, atol=1 / 255, rtol=0
    )
    assert first_payload(vit)["summary"][0].startswith("prediction:")
    scene = SceneSet(SceneConfig(image_size=32), "val", 1, 0)
    vqa = Explorer(scene_run(tmp_path / "vqa", "vqa_transformer")).default_input()
    expected = torch.from_numpy(scene.images[0]).permute(2, 0, 1).float() / 255
    assert torch.equal(decode_image(vqa.image, size=(32, 32), channels=3), expected)
    assert vqa.question == scene.questions[0][0].question
    cap = first_payload(scene_run(tmp_path / "cap", "caption_transformer"))
    assert cap["input"] == "scene_0.png" and cap["image"]["width"] == 32
