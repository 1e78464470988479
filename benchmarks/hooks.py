"""Hook points cost nothing measurable while no hook is on them.

    python benchmarks/hooks.py                    # GPT-2-style LM, d_model 256, 4 layers, T 128
    python benchmarks/hooks.py --decode           # one-token steps with a KV cache

Times a forward of the same model three ways, in one process, interleaved:

- ``plain``: the model as built (every HookPoint is an ``nn.Identity`` called in the forward);
- ``no-points``: the same model with ``HookPoint.__call__`` replaced by a bare identity function
  (the cost of a model without the module calls: the peer);
- ``one hook``: a reading hook on one residual-stream point (no explicit path needed);
- ``pattern hook``: a reading hook on one ``attn.hook_pattern`` (that layer takes the math path).

Prints the median of each and the ratios to ``no-points``; ``plain / no-points`` is the cost of
idle hook points.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from attnlab.config.lm import ModelConfig
from attnlab.inspect import hooks
from attnlab.layers.hook import HookPoint
from attnlab.models.lm import DecoderLM


def _time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--decode", action="store_true", help="time one-token cached steps instead")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    cfg = ModelConfig.preset(
        "tiny", d_model=a.d_model, n_layers=a.layers, n_heads=4, max_seq_len=2 * a.seq + 8
    )
    model = DecoderLM(cfg).eval()
    x = torch.randint(0, cfg.vocab_size, (a.batch, a.seq))

    if a.decode:
        state_tokens = torch.randint(0, cfg.vocab_size, (a.batch, 1))

        def run() -> None:
            caches = model.make_caches(a.batch, 2 * a.seq + 4)
            model(x[:, :8], caches=caches)
            for _ in range(16):
                model(state_tokens, caches=caches)
    else:

        def run() -> None:
            model(x)

    variants = ("plain", "no-points", "one hook", "pattern hook")
    results: dict[str, list[float]] = {k: [] for k in variants}
    original = HookPoint.__call__

    def once(name: str) -> float:
        if name == "no-points":
            HookPoint.__call__ = lambda self, x: x  # the peer: no module call at the points
        try:
            chosen = {
                "one hook": "blocks.1.hook_resid_post",
                "pattern hook": "blocks.1.attn.hook_pattern",
            }
            with hooks(model, [(chosen[name], lambda t, n: None)] if name in chosen else []):
                t0 = time.perf_counter()
                run()
                return time.perf_counter() - t0
        finally:
            HookPoint.__call__ = original

    with torch.no_grad():
        for name in variants:
            once(name)  # warm-up
        for _ in range(a.repeats):  # interleaved, so a busy machine slows every variant alike
            for name in variants:
                results[name].append(once(name))
    n_points = sum(isinstance(m, HookPoint) for m in model.modules())
    point, bare = HookPoint(), lambda t: t
    t = torch.zeros(1)
    idle = min(_time(lambda: [point(t) for _ in range(10_000)], 5) for _ in range(3)) / 10_000
    base = min(_time(lambda: [bare(t) for _ in range(10_000)], 5) for _ in range(3)) / 10_000
    peer = statistics.median(results["no-points"])
    what = "16 cached one-token steps" if a.decode else f"forward B={a.batch} T={a.seq}"
    print(f"DecoderLM d_model={a.d_model} layers={a.layers}, {what}, {a.threads} thread(s)")
    for name, ts in results.items():
        med = statistics.median(ts)
        print(
            f"  {name:13s} {med * 1e3:8.2f} ms (median of {len(ts)})   ratio to no-points {med / peer:.3f}"
        )
    calls = n_points * (17 if a.decode else 1)
    print(
        f"  one idle HookPoint call: {(idle - base) * 1e6:.2f} µs more than a bare function; "
        f"{n_points} points, {calls} calls per timed run: {(idle - base) * calls * 1e3:.3f} ms "
        f"= {(idle - base) * calls / peer:.2%} of the run"
    )


if __name__ == "__main__":
    main()
