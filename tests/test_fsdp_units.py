"""FSDP in one process (a torchrun-like group of one, gloo): which modules become units, tied
weights, the mixed-precision policy, sharded checkpoints written atomically (a failure in the
middle of the DCP write keeps the previous checkpoint, which resumes exactly), resharding into a
whole model, and the refusals (fsdp outside torchrun, a sharded checkpoint of another model).

The two-process tests through the command line are in ``test_fsdp.py``.
"""

from __future__ import annotations

import errno
import json
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch import nn

from attnlab import runs
from attnlab.config import ModelConfig
from attnlab.errors import RunDirError, UserError
from attnlab.layers.block import TransformerBlock
from attnlab.models.lm import DecoderLM
from attnlab.train import RunWriteError, TrainConfig, train
from attnlab.train import fsdp as fsdp_mod
from attnlab.train.distributed import setup, share_of
from test_train import ToyConfig, ToyModel, ToyTask, base_cfg, make_model

TESTS_DIR = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def group_of_one(monkeypatch):
    """The environment torchrun gives a single process; the group is destroyed afterwards."""
    env = dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    for k, v in {**env, "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(k, v)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def _tiny_lm(**kw) -> DecoderLM:
    torch.manual_seed(0)
    return DecoderLM(ModelConfig.preset("tiny", vocab_size=11, max_seq_len=16, **kw))


# ---------------------------------------------------------------------------------------------
# units, policy, reductions (no group needed)


def test_units_are_the_blocks_and_repeated_layers_innermost_first():
    model = _tiny_lm()
    names = [name for name, _ in fsdp_mod.fsdp_units(model)]
    assert names == [f"blocks.{i}" for i in range(model.config.n_layers)]

    class Stack(nn.Module):  # a ModuleList of repeated non-Transformer layers, and a nested one
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
            self.stages = nn.ModuleList(
                nn.Sequential(nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])) for _ in range(2)
            )
            self.head = nn.Linear(4, 2)

    names = [name for name, _ in fsdp_mod.fsdp_units(Stack())]
    assert set(names) == {"layers.0", "layers.1", "layers.2", "stages.0", "stages.1"} | {
        f"stages.{i}.0.{j}" for i in range(2) for j in range(2)
    }
    depth = [n.count(".") for n in names]
    assert depth == sorted(depth, reverse=True)  # inner units are wrapped before outer ones


def test_a_unit_sharing_a_parameter_with_the_outside_is_not_wrapped_alone():
    model = _tiny_lm()
    model.blocks[1].attn.qkv.weight = model.blocks[0].attn.qkv.weight  # tied across two blocks
    assert fsdp_mod.fsdp_units(model) == []
    # an LM's tied embedding / head is outside every block: the blocks stay units
    tied = _tiny_lm(tie_embeddings=True)
    assert tied.lm_head.weight is tied.tok_emb.weight
    assert len(fsdp_mod.fsdp_units(tied)) == 2


def test_a_model_can_name_its_units():
    class Named(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Linear(3, 3)
            self.dec = nn.Linear(3, 3)

        def fsdp_units(self):
            return [self.dec]

    assert [n for n, _ in fsdp_mod.fsdp_units(Named())] == ["dec"]


def test_mixed_precision_policy_follows_amp_unless_told():
    mp = fsdp_mod.mixed_precision
    cfg = TrainConfig(steps=1, strategy="fsdp")
    assert mp(cfg).param_dtype is None and mp(cfg).reduce_dtype == torch.float32
    bf16 = TrainConfig(steps=1, strategy="fsdp", amp="bf16")
    assert mp(bf16).param_dtype == torch.bfloat16 and mp(bf16).reduce_dtype == torch.float32
    forced = bf16.replace(fsdp_param_dtype="float32", fsdp_reduce_dtype="bfloat16")
    assert mp(forced).param_dtype is None and mp(forced).reduce_dtype == torch.bfloat16


def test_one_process_shares_are_one():
    assert share_of(17, torch.device("cpu")) == 1.0


def test_fsdp_outside_torchrun_is_refused_clearly(tmp_path, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(UserError, match=r"torchrun --nproc_per_node=N"):
        train(make_model(), ToyTask(), base_cfg(strategy="fsdp"), tmp_path / "run")
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------
# a group of one: real FSDP, real DCP


def test_sharded_lm_keeps_tied_weights_and_gathers_them_once(group_of_one):
    setup("cpu", group=True)
    model = _tiny_lm(tie_embeddings=True)
    whole = {k: v.clone() for k, v in model.state_dict().items()}
    units = fsdp_mod.shard_model(model, TrainConfig(steps=1, strategy="fsdp"), torch.device("cpu"))
    assert units == ["blocks.0", "blocks.1"] and fsdp_mod.is_sharded(model)
    assert isinstance(model.blocks[0], TransformerBlock)  # still the block (and its attributes)
    assert model.lm_head.weight is model.tok_emb.weight  # one sharded tensor for both names
    full = fsdp_mod.full_state_dict(model)
    assert "lm_head.weight" in full and "tok_emb.weight" not in full  # as safetensors keeps it
    for k, v in full.items():
        torch.testing.assert_close(v, whole[k], rtol=0, atol=0)
    idx = torch.randint(0, 11, (2, 8))
    with fsdp_mod.whole_root(model):  # start_decoding / decode_step use the root's parameters
        state = model.start_decoding(2, 8)
        logits, _ = model.decode_step(idx, state)
    assert logits.shape == (2, 11)


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_failed_sharded_save_keeps_the_previous_checkpoint_which_resumes_exactly(
    tmp_path, group_of_one, monkeypatch
):
    """ENOSPC in the middle of the DCP write of step 4: one RunWriteError line naming the kept
    checkpoint (step 2); nothing of step 4 is published; the resume equals an unbroken run."""
    # heavy (torch.distributed.checkpoint, ~1.5 s): this test only
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    cfg = base_cfg(strategy="fsdp", steps=4, eval_every=2, schedule="constant", warmup_steps=1)
    whole = train(make_model(), ToyTask(), cfg.replace(strategy="ddp"), tmp_path / "one")
    assert fsdp_mod.under_torchrun()
    real_write = FileSystemWriter.write_data
    calls = []

    def full_disk_on_second_save(self, plan, planner):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", "shard")
        return real_write(self, plan, planner)

    monkeypatch.setattr(FileSystemWriter, "write_data", full_disk_on_second_save)
    run = tmp_path / "sharded"
    with pytest.raises(
        RunWriteError, match=r"No space left on device \(the previous checkpoint, step 2, is kept\)"
    ):
        train(make_model(), ToyTask(), cfg, run)
    monkeypatch.setattr(FileSystemWriter, "write_data", real_write)
    assert [s for s, _ in runs.sharded_checkpoints(run)] == [2]
    assert (run / "checkpoints" / ".step-00000004.tmp").exists()  # the unfinished one
    assert not (run / "state.pt").exists() and not (run / "model.safetensors").exists()

    res = train(make_model(), ToyTask(), cfg, run, resume=True)
    assert not (run / "checkpoints" / ".step-00000004.tmp").exists()  # cleaned under the lock
    assert [s for s, _ in runs.sharded_checkpoints(run)] == [4]
    assert res.final_train_loss == pytest.approx(whole.final_train_loss, rel=1e-6)
    losses = lambda recs: [r["loss"] for r in recs if "loss" in r]  # noqa: E731
    assert losses(_records(run)) == pytest.approx(losses(whole.history), rel=1e-6)
    # the end of the session gathered a model.safetensors equal to the one-process weights

    a, b = load_file(run / "model.safetensors"), load_file(tmp_path / "one" / "model.safetensors")
    assert sorted(a) == sorted(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_sharded_checkpoint_of_another_model_is_refused_by_name(tmp_path, group_of_one):
    cfg = base_cfg(strategy="fsdp", steps=2, eval_every=2)
    torch.manual_seed(0)
    train(ToyModel(ToyConfig()), ToyTask(), cfg, tmp_path / "a")
    torch.manual_seed(0)
    train(ToyModel(ToyConfig(d_hidden=24)), ToyTask(), cfg, tmp_path / "b")
    # b's sharded checkpoint copied into a: refused by its checkpoint.json (another config) ...
    (tmp_path / "a" / "checkpoints" / "step-00000002").rename(tmp_path / "a-ckpt")
    (tmp_path / "b" / "checkpoints" / "step-00000002").rename(
        tmp_path / "a" / "checkpoints" / "step-00000002"
    )
    (tmp_path / "a" / "model.safetensors").unlink()  # the sharded checkpoint is the newest
    with pytest.raises(RunDirError, match=r"is from another model .*d_hidden"):
        train(ToyModel(ToyConfig()), ToyTask(), cfg.replace(steps=3), tmp_path / "a", resume=True)
    # ... and, with a checkpoint.json claiming a's model, by the shapes of its tensors
    meta_path = tmp_path / "a" / "checkpoints" / "step-00000002" / "checkpoint.json"
    meta = json.loads(meta_path.read_text())
    meta["model"]["d_hidden"] = 16
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(
        RunDirError, match=r"does not fit the model: fc1.weight has shape \(24, 8\)"
    ):
        train(ToyModel(ToyConfig()), ToyTask(), cfg.replace(steps=3), tmp_path / "a", resume=True)
