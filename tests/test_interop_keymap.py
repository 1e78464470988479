"""The key-map mechanism (attnlab.interop.keymap): every transform is a pair of exact inverses, and
a key map claims every tensor, renames older names, leaves tied copies and ignored names out."""

from __future__ import annotations

import pytest
import torch

from attnlab.errors import UserError
from attnlab.interop.keymap import (
    Chain,
    Concat,
    Identity,
    Inverse,
    KeyMap,
    Rule,
    Stack,
    Transform,
    Transpose,
    ZeroBias,
    check_shapes,
)


def rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def assert_round_trips(t: Transform, ours: list[torch.Tensor], n_theirs: int) -> list:
    """ours -> theirs -> ours and theirs -> ours -> theirs give back the very same values."""
    theirs = t.to_theirs(ours, n_theirs)
    assert len(theirs) == n_theirs
    back = t.to_ours(theirs, len(ours))
    assert len(back) == len(ours) and all(torch.equal(a, b) for a, b in zip(back, ours))
    again = t.to_theirs(back, n_theirs)
    assert all(torch.equal(a, b) for a, b in zip(again, theirs))
    return theirs


def test_identity_and_transpose():
    w = rand(6, 4)
    assert assert_round_trips(Identity(), [w], 1)[0] is w
    (wt,) = assert_round_trips(Transpose(), [w], 1)
    assert wt.shape == (4, 6) and torch.equal(wt, w.t())  # Conv1D's (in, out)
    b = rand(6)
    assert torch.equal(Transpose().to_theirs([b], 1)[0], b)  # a bias is its own transpose


def test_concat_equal_parts_and_grouped_query_sizes():
    qkv = rand(12, 4)
    q, k, v = assert_round_trips(Concat(dim=0), [qkv], 3)
    assert torch.equal(torch.cat([q, k, v]), qkv) and q.shape == (4, 4)
    q, k, v = assert_round_trips(Concat(0, sizes=(8, 2, 2)), [qkv], 3)  # 4 query, 1 kv head
    assert (q.shape[0], k.shape[0], v.shape[0]) == (8, 2, 2)
    assert torch.equal(q, qkv[:8]) and torch.equal(v, qkv[10:])
    with pytest.raises(ValueError, match="into 5 equal parts"):
        Concat(0).to_theirs([qkv], 5)
    with pytest.raises(ValueError, match=r"into \[8, 2, 3\]"):
        Concat(0, sizes=(8, 2, 3)).to_theirs([qkv], 3)


def test_stack_experts_per_expert_layout():
    """Mixtral: w_in (E, 2I, C) = stack over e of [w1_e; w3_e]; w_out (E, C, I) = stack of w2_e."""
    E, I, C = 3, 5, 4
    w_in, w_out = rand(E, 2 * I, C), rand(E, C, I)
    parts = assert_round_trips(Stack(dim=0, n=E, each=Concat(dim=0)), [w_in], 2 * E)
    for e in range(E):
        w1, w3 = parts[2 * e], parts[2 * e + 1]  # theirs: w1_0, w3_0, w1_1, ...
        assert torch.equal(w1, w_in[e, :I]) and torch.equal(w3, w_in[e, I:])
    w2 = assert_round_trips(Stack(dim=0, n=E), [w_out], E)
    assert all(torch.equal(w2[e], w_out[e]) for e in range(E))
    assert_round_trips(Stack(dim=1), [rand(4, 3)], 3)  # another dim, the count from the names
    with pytest.raises(ValueError, match="does not hold 4 groups"):
        Stack(dim=0, n=4).to_theirs([w_out], 4)


def test_zero_bias_both_ways_and_refusal():
    w = rand(6, 4)
    w_back, b = assert_round_trips(ZeroBias(), [w], 2)  # theirs holds a zero (6,) bias
    assert w_back is w and b.shape == (6,) and not b.any()
    # Inverse: ours holds the bias, theirs leaves it out (it must be zero)
    (w_only,) = assert_round_trips(Inverse(ZeroBias()), [w, torch.zeros(6)], 1)
    assert w_only is w
    with pytest.raises(ValueError, match="not zero"):
        Inverse(ZeroBias()).to_theirs([w, torch.ones(6)], 1)
    meta = torch.empty(6, device="meta")  # shapes only: nothing to check
    assert Inverse(ZeroBias()).to_theirs([w.to("meta"), meta], 1)[0].shape == (6, 4)


def test_chain_applies_steps_in_order_and_back_in_reverse():
    """A bias-free attnlab Conv1D-shaped layer: zero bias added, then the weight transposed."""
    w = rand(12, 4)
    wt, b = assert_round_trips(Chain(ZeroBias(), Transpose()), [w], 2)
    assert torch.equal(wt, w.t()) and b.shape == (12,)
    # Llama group without biases: drop the (zero) bias, then split Q|K|V with GQA sizes
    q, k, v = assert_round_trips(
        Chain(Inverse(ZeroBias()), Concat(0, sizes=(8, 2, 2))), [w, torch.zeros(12)], 3
    )
    assert torch.equal(torch.cat([q, k, v]), w)


# ---- KeyMap ---------------------------------------------------------------------------------


def test_a_key_map_converts_both_ways_with_ties_ignores_and_renames():
    km = KeyMap(
        [
            Rule("emb.weight", "wte.weight"),
            Rule("blocks.{i}.qkv.{w}", tuple(f"h.{{i}}.{p}.{{w}}" for p in "qkv"), Concat(0)),
            Rule("blocks.{i}.fc.weight", "h.{i}.fc.weight", Transpose()),
        ],
        tied_ours={"head.weight": "emb.weight"},
        tied_theirs={"lm_head.weight": "wte.weight"},
        ignore_theirs=[r"\.inv_freq\Z"],
        renames={"h.{i}.query.{w}": "h.{i}.q.{w}"},
    )
    ours = {
        "emb.weight": rand(5, 4),
        "head.weight": None,
        "blocks.0.qkv.weight": rand(6, 4),
        "blocks.0.qkv.bias": rand(6),
        "blocks.0.fc.weight": rand(3, 4),
    }
    ours["head.weight"] = ours["emb.weight"]
    theirs = km.to_theirs(ours)
    assert "lm_head.weight" not in theirs and torch.equal(
        theirs["h.0.fc.weight"].t(), ours["blocks.0.fc.weight"]
    )
    back = km.to_ours({**theirs, "lm_head.weight": theirs["wte.weight"], "rope.inv_freq": rand(2)})
    assert set(back) == set(ours) and all(torch.equal(back[n], t) for n, t in ours.items())
    # an older spelling reads the same
    old = {("h.0.query.weight" if n == "h.0.q.weight" else n): t for n, t in theirs.items()}
    assert torch.equal(km.to_ours(old)["blocks.0.qkv.weight"], ours["blocks.0.qkv.weight"])
    assert km.canonical(old)["h.0.q.weight"] == "h.0.query.weight"
    with pytest.raises(UserError, match="'h.0.q.weight' and 'h.0.query.weight' are both"):
        km.canonical([*theirs, "h.0.query.weight"])


def test_a_key_map_refuses_unclaimed_tensors_incomplete_rules_and_bad_values():
    km = KeyMap([Rule("w.{i}", ("a.{i}", "b.{i}"), Chain(Inverse(ZeroBias()), Concat(0)))])
    with pytest.raises(UserError, match=r"no rule maps them: c\.0"):
        km.to_ours({"a.0": rand(2), "b.0": rand(2), "c.0": rand(2)})
    with pytest.raises(UserError, match=r"missing tensors: b\.0"):
        km.to_ours({"a.0": rand(2)})
    km = KeyMap(
        [Rule(("w.{i}", "bias.{i}"), ("a.{i}", "b.{i}"), Chain(Inverse(ZeroBias()), Concat(0)))]
    )
    with pytest.raises(
        UserError, match=r"cannot convert w\.0, bias\.0 into a\.0, b\.0: .*not zero"
    ):
        km.to_theirs({"w.0": rand(4, 2), "bias.0": torch.ones(4)})
    with pytest.raises(ValueError, match="same placeholders"):
        KeyMap([Rule("a.{i}", "b.{j}")])
    with pytest.raises(ValueError, match="same placeholders"):
        KeyMap([], renames={"old.{i}": "new"})


def test_check_shapes_names_the_tensor_both_shapes_missing_and_extra():
    with pytest.raises(UserError) as e:
        check_shapes(
            {"a": (2, 3), "b": (4,)},
            {"a": (3, 2), "c": (1,)},
            given_names={"a": "old.a", "c": "old.c"},
            what="the weights in 'x'",
            source="the file",
        )
    msg = str(e.value)
    assert "old.a has shape [3, 2] in the file but the config implies [2, 3]" in msg
    assert "missing tensors (1): b [4]" in msg and "unexpected tensors (1): old.c" in msg
    assert msg.startswith("the weights in 'x' do not match the config, nothing was loaded")
    check_shapes({"a": (2,), "b": (1,)}, {"a": (2,)}, optional={"b"})  # no error
