"""What the gradient attributions cost, as ratios measured in one run (rounds alternating):

- ``chefer`` (vitscope, the model on its default sdpa kernel; gradients of the patterns from vitscope's kernel)
  against the authors' way: a plain autograd forward and backward of a twin with the same weights and eager
  (explicit softmax) attention that keeps every pattern's gradient, then the same rule (issue goal: at most 1.25x);
- ``integrated_gradients`` against captum's ``IntegratedGradients`` on the same model object vitscope runs (its
  default kernel), steps and batch (goal: no slower).

Model: an HF ViT-S/16-sized classifier with random weights at 224 px (``--model vits16``; the twin is built with
``attn_implementation="eager"``) or the zoo's ``tiny-vit-sup`` (``--model tiny``; the twin is a second copy with
``fused_attn`` off, each pattern taken where the explicit path applies its attention dropout).

Run: ``python benchmarks/attribution.py [--model vits16|tiny] [--batch 8] [--steps 16] [--rounds 3]``.
Writes ``benchmarks/results/attribution.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _datasets import RESULTS_DIR, cpu_model


def _models(name: str):
    """(vitscope backbone on the default kernel, the eager twin's forward: pixels -> (logits, every pattern))."""
    import torch

    import vitscope

    if name == "tiny":
        twin = vitscope.load_model("tiny-vit-sup").model  # a second copy: vitscope's own stays on sdpa
        patterns: list[torch.Tensor] = []
        for block in twin.blocks:
            block.attn.fused_attn = False  # timm's explicit path: softmax(q k^T * scale), then attn_drop
            block.attn.attn_drop.register_forward_hook(lambda _m, _i, out: patterns.append(out))

        def tiny_eager(pixels: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
            patterns.clear()
            logits = twin(pixels)
            return logits, tuple(patterns)

        return vitscope.load_model("tiny-vit-sup"), tiny_eager
    import transformers as tf

    config = dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
                  image_size=224, patch_size=16, num_labels=10)
    torch.manual_seed(0)
    model = tf.ViTForImageClassification(tf.ViTConfig(**config)).eval()
    torch.manual_seed(0)
    eager = tf.ViTForImageClassification(tf.ViTConfig(**config, attn_implementation="eager")).eval()
    eager.load_state_dict(model.state_dict())

    def hf_eager(pixels: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        out = eager(pixel_values=pixels, output_attentions=True)
        return out.logits, out.attentions

    return vitscope.wrap(model, name="vit-s16-random"), hf_eager


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("tiny", "vits16"), default="vits16")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=str(RESULTS_DIR / "attribution.json"))
    args = p.parse_args(argv)
    import torch
    from captum.attr import IntegratedGradients

    from vitscope.attribution import attribute

    backbone, eager = _models(args.model)
    x = torch.randn(args.batch, 3, *backbone.spec.image_size, generator=torch.Generator().manual_seed(0))
    target = torch.zeros(args.batch, dtype=torch.long)

    def authors_chefer() -> None:  # eager attention, every pattern's gradient kept, the same rule
        logits, attentions = eager(x)
        grads = torch.autograd.grad(logits.gather(1, target[:, None]).sum(), attentions)
        n = attentions[0].shape[-1]
        r = torch.eye(n).expand(args.batch, n, n)
        for a, g in zip(attentions, grads):
            r = r + (g * a).clamp(min=0).mean(1) @ r

    model = backbone.model  # captum gets the very module (and kernel) vitscope's integrated gradients runs
    hf = args.model == "vits16"

    def logits(inp: torch.Tensor) -> torch.Tensor:
        return model(pixel_values=inp).logits if hf else model(inp)

    def captum_ig() -> None:
        IntegratedGradients(logits).attribute(x, baselines=torch.zeros_like(x), target=target, n_steps=args.steps)

    with torch.no_grad():  # the twin must compute what vitscope's model computes, up to the kernels' rounding
        torch.testing.assert_close(eager(x)[0], logits(x), rtol=1e-4, atol=1e-4)

    runs = {"chefer": lambda: attribute(backbone, x, target, "chefer"), "chefer_eager_autograd": authors_chefer,
            "integrated_gradients": lambda: attribute(backbone, x, target, "integrated_gradients", steps=args.steps),
            "captum_integrated_gradients": captum_ig}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.rounds):
        for name, fn in runs.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    ratio = {"chefer / eager autograd": [a / b for a, b in zip(times["chefer"], times["chefer_eager_autograd"])],
             "integrated_gradients / captum": [a / b for a, b in zip(times["integrated_gradients"],
                                                                      times["captum_integrated_gradients"])]}
    out = {"model": backbone.spec.name, "batch": args.batch, "steps": args.steps, "rounds": args.rounds,
           "seconds": times, "ratios": {k: {"median": statistics.median(v), "spread": [min(v), max(v)]}
                                        for k, v in ratio.items()},
           "machine": {"cpu": cpu_model(), "python": platform.python_version(), "torch": torch.__version__}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    for k, v in out["ratios"].items():
        print(f"{backbone.spec.name}: {k} = {v['median']:.2f} (spread {v['spread'][0]:.2f}-{v['spread'][1]:.2f}, "
              f"{args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
