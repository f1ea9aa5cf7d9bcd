"""What ``head_importance`` costs: its pass over a few images against a plain forward pass over the same images,
and against the count of forwards it makes (one staged forward of blocks ``i..L-1`` per block ``i``, head and
control, each batched over the batch's images).

Model: the zoo's ``tiny-vit-sup`` (6 blocks, 4 heads) or a ViT-S/16-sized HF ViT with random weights at 224 px
(``--model vits16``). The ratio ``head_importance / forward`` is measured in one run, rounds alternating, and set
beside the forward count it predicts: ``controls * heads * sum_i (L - i) / L`` block-forwards per image, plus the
pass's own forward.

Run: ``python benchmarks/head_importance.py [--model tiny|vits16] [--images 32] [--batch-size 16] [--rounds 3]``.
Writes ``benchmarks/results/head_importance.json``.
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

from _datasets import RESULTS_DIR, cpu_model, synthetic_image


def _model(name: str):
    import vitscope

    if name == "tiny":
        return vitscope.load_model("tiny-vit-sup")
    import torch
    import transformers as tf

    torch.manual_seed(0)
    config = tf.ViTConfig(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
                          image_size=224, patch_size=16, num_labels=10)
    return vitscope.wrap(tf.ViTForImageClassification(config).eval(), name="vit-s16-random")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("tiny", "vits16"), default="tiny")
    p.add_argument("--images", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=str(RESULTS_DIR / "head_importance.json"))
    args = p.parse_args(argv)
    import torch

    import vitscope
    from vitscope.analyses import ANALYSES

    backbone = _model(args.model)
    spec = backbone.spec
    images = [synthetic_image(i, size=max(spec.image_size)) for i in range(args.images)]
    pixels = backbone.preprocess(images)

    def forward() -> None:
        with torch.no_grad():
            for i in range(0, len(pixels), args.batch_size):
                backbone(pixels[i:i + args.batch_size])

    def ablations() -> None:
        vitscope.run(backbone, images, [ANALYSES["head_importance"](reference_images=8)],
                     batch_size=args.batch_size, progress=False, workers=0)

    times: dict[str, list[float]] = {"forward": [], "head_importance": []}
    for _ in range(args.rounds):
        for name, fn in (("forward", forward), ("head_importance", ablations)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    ratios = [h / f for h, f in zip(times["head_importance"], times["forward"])]
    blocks, heads = spec.num_blocks, spec.num_heads
    predicted = 3 * heads * sum(blocks - i for i in range(blocks)) / blocks + 1  # in full forwards per image
    out = {"model": spec.name, "blocks": blocks, "heads": heads, "images": args.images, "batch_size": args.batch_size,
           "rounds": args.rounds, "seconds": times, "ratio_median": statistics.median(ratios),
           "ratio_spread": [min(ratios), max(ratios)], "predicted_forwards": predicted,
           "machine": {"cpu": cpu_model(), "python": platform.python_version(), "torch": torch.__version__}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"{spec.name}: head_importance pass = {out['ratio_median']:.1f}x a plain forward "
          f"(spread {min(ratios):.1f}-{max(ratios):.1f}, {args.rounds} rounds); the staged ablations predict "
          f"{predicted:.1f} forwards (3 controls x {heads} heads x blocks i..{blocks - 1} per block, + the pass)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
