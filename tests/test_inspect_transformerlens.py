"""attnlab.inspect against TransformerLens: one GPT-2 with random weights, saved as a local
Hugging Face folder, opened by both (TransformerLens 4's TransformerBridge, offline)."""

from __future__ import annotations

import os

import pytest
import torch

from attnlab.inspect import patch_heads, patch_positions, run_with_cache
from attnlab.interop import from_hf

pytestmark = pytest.mark.slow  # importing TransformerLens takes seconds


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    # imported here, not at collection: TransformerLens took ~2 s in every test worker (and in
    # `-m "not slow"` runs, which deselect this file)
    tl = pytest.importorskip(
        "transformer_lens", reason="transformer-lens (the test extra) is missing"
    )
    T = pytest.importorskip("transformers")
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.manual_seed(0)
    cfg = T.GPT2Config(
        n_layer=3,
        n_embd=48,
        n_head=4,
        n_positions=64,
        vocab_size=300,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    hf = T.GPT2LMHeadModel(cfg).eval()
    path = tmp_path_factory.mktemp("gpt2")
    hf.save_pretrained(path)
    ours = from_hf(path).eval()
    bridge = tl.TransformerBridge.boot_transformers(str(path), hf_model=hf, device="cpu")
    # the classic hook names, on the unprocessed weights (folding LayerNorms would move the
    # residual stream away from Hugging Face's)
    bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
    return ours, bridge


def test_every_shared_hook_name_agrees(pair):
    ours, bridge = pair
    ids = torch.randint(0, 300, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs_logits, theirs = bridge.run_with_cache(ids)
        our_logits, cache = run_with_cache(ours, ids)
    torch.testing.assert_close(our_logits, theirs_logits, atol=1e-4, rtol=0)
    shared = [n for n in cache if n in theirs.keys()]
    # every name of the reference table (docs/inspect.md) is shared: 2 + 17 per block + 2
    assert len(shared) == 2 + 17 * 3 + 2, sorted(set(cache) - set(theirs.keys()))
    for name in shared:
        a, b = cache[name], theirs[name]
        assert a.shape == b.shape, name
        if name.endswith("hook_attn_scores"):  # masked entries: -inf here, very negative there
            allowed = torch.isfinite(a)
            assert (b[~allowed] < -1e4).all(), name
            a, b = a[allowed], b[allowed]
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0, msg=name)


def _logit_diff(out):
    return out[:, -1, 5].mean() - out[:, -1, 7].mean()


def _their_sweep(bridge, clean, corrupted, names, index, n):
    _, cache = bridge.run_with_cache(clean)
    result = torch.empty(len(names), n)
    for layer, name in enumerate(names):
        for i in range(n):

            def hook(act, hook, i=i, name=name):
                act = act.clone()
                act[index(i)] = cache[name][index(i)]
                return act

            out = bridge.run_with_hooks(corrupted, fwd_hooks=[(name, hook)])
            result[layer, i] = _logit_diff(out)
    return result


def test_patching_sweeps_give_the_same_tensor(pair):
    ours, bridge = pair
    g = torch.Generator().manual_seed(2)
    clean = torch.randint(0, 300, (2, 7), generator=g)
    corrupted = clean.clone()
    corrupted[:, 2] = torch.randint(0, 300, (2,), generator=g)
    with torch.no_grad():
        mine = patch_positions(ours, clean, corrupted, _logit_diff)
        names = [f"blocks.{i}.hook_resid_pre" for i in range(3)]
        theirs = _their_sweep(bridge, clean, corrupted, names, lambda p: (slice(None), p), 7)
        torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=0)
        assert mine.abs().max() > 0  # the sweep measured something
        mine = patch_heads(ours, clean, corrupted, _logit_diff)
        names = [f"blocks.{i}.attn.hook_z" for i in range(3)]
        index = lambda h: (slice(None), slice(None), h)  # noqa: E731
        theirs = _their_sweep(bridge, clean, corrupted, names, index, 4)
    torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=0)
