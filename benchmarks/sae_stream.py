"""Training an SAE from the stream against dump-then-train, and the SAE's own update rate beside the model's forward.

Both ways train the same SAE (TopK, ``--latents`` latents, ``--k``) on one epoch of a ViT-S-sized model's
``blocks.8.resid_post`` spatial tokens (384-d, random weights) over ``--images`` synthetic images:

- **stream**: :func:`vitscope.sae.train`, tokens through the in-memory shuffle buffer (``--buffer-tokens``);
- **dump-then-train**: one pass that writes every token to a float32 file on disk, then the same training reading
  the file (shuffled in buffer-sized chunks, the same minibatches and steps).

Each way runs in a child process (its peak RSS is its own); wall time, bytes written to disk and peak RSS are
printed, with the ratio stream / dump. Then, in this process: the SAE's update rate (tokens/s of minibatch steps
from a full buffer) beside the model's forward rate (tokens/s of the hook), so that one sees which bounds a run.
The issue's setting is 20,000 images at 224 px; ``--images`` and ``--size`` scale it to the machine.

Run: ``python benchmarks/sae_stream.py [--images 20000] [--size 224] [--latents 4096] [--k 32]``.
Writes ``benchmarks/results/sae_stream.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _datasets import RESULTS_DIR, cpu_model

HOOK = "blocks.8.resid_post"


def _model(root: Path, size: int) -> Path:
    import torch
    import transformers

    torch.manual_seed(0)
    model = root / "vit-s"
    if not model.exists():
        config = transformers.ViTConfig(hidden_size=384, num_hidden_layers=12, num_attention_heads=6,
                                        intermediate_size=1536, image_size=size, patch_size=16)
        transformers.ViTModel(config, add_pooling_layer=False).save_pretrained(model)
        (model / "preprocessor_config.json").write_text(json.dumps({
            "image_processor_type": "ViTImageProcessor", "do_resize": True, "size": {"height": size, "width": size},
            "do_normalize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "do_rescale": True,
            "rescale_factor": 1 / 255, "resample": 2}))
    return model


def _disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def child(way: str, root: Path, args: argparse.Namespace) -> dict:
    """One way, in this (child) process: wall time, bytes it wrote under its folder, peak RSS."""
    import numpy as np
    import torch

    import vitscope
    from vitscope.analyses.base import Analysis
    from vitscope.autoencoders.tokens import selected_tokens
    from vitscope.sae import SAETraining, train
    from vitscope.sae.trainer import Trainer

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    backbone = vitscope.load_model(str(root / "vit-s"))
    data = str(root / "images")
    per_image = (args.size // 16) ** 2
    tokens = args.images * per_image
    config = SAETraining(kind="topk", latents=args.latents, k=args.k, tokens=tokens, buffer_tokens=args.buffer_tokens,
                         batch_tokens=args.batch_tokens, max_epochs=1)
    work = root / f"work-{way}"
    work.mkdir(exist_ok=True)
    start = time.perf_counter()
    if way == "stream":
        train(backbone, HOOK, data, config, out=work / "sae", batch_size=32)
    else:
        dump = np.lib.format.open_memmap(work / "tokens.npy", mode="w+", dtype=np.float32, shape=(tokens, 384))
        filled = [0]

        class Dump(Analysis):
            name = "dump"

            def required_hooks(self, spec):
                return [HOOK]

            def update(self, record, batch):
                x = selected_tokens(record[HOOK].float(), tuple(batch.spec.prefix_kinds), "spatial").cpu().numpy()
                dump[filled[0] : filled[0] + len(x)] = x
                filled[0] += len(x)

            def compute(self):
                return {}

        vitscope.run(backbone, data, [Dump()], batch_size=32, progress=False, workers=0)
        dump.flush()
        stored = np.load(work / "tokens.npy", mmap_mode="r")
        with torch.inference_mode(False):
            trainer = Trainer(384, config, torch.device("cpu"), args.buffer_tokens)
            for s in range(0, len(stored), args.buffer_tokens // 2):
                trainer.push(torch.from_numpy(np.array(stored[s : s + args.buffer_tokens // 2])))
            trainer.finish()
    seconds = time.perf_counter() - start
    written = _disk_bytes(work)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"way": way, "seconds": seconds, "written_bytes": written, "peak_rss_bytes": peak, "tokens": tokens}


def rates(root: Path, args: argparse.Namespace) -> dict:
    """The SAE's minibatch steps from a full buffer and the model's forward, both in tokens per second."""
    import torch

    import vitscope
    from vitscope.sae import SAETraining
    from vitscope.sae.trainer import Trainer

    backbone = vitscope.load_model(str(root / "vit-s"))
    config = SAETraining(kind="topk", latents=args.latents, k=args.k, tokens=10**9, batch_tokens=args.batch_tokens)
    with torch.inference_mode(False):
        trainer = Trainer(384, config, torch.device("cpu"), args.buffer_tokens)
        buffer = torch.randn(args.buffer_tokens, 384)
        trainer._start(buffer)
        steps = max(4, 8192 // args.batch_tokens)
        start = time.perf_counter()
        for s in range(steps):
            trainer._step(buffer[(s * args.batch_tokens) % (args.buffer_tokens - args.batch_tokens):][
                : args.batch_tokens], args.batch_tokens)
        sae_rate = steps * args.batch_tokens / (time.perf_counter() - start)
    pixels = torch.randn(32, 3, args.size, args.size)
    with torch.no_grad(), backbone.record([HOOK]):
        backbone(pixels)
        start = time.perf_counter()
        for _ in range(3):
            backbone(pixels)
        forward_rate = 3 * 32 * (args.size // 16) ** 2 / (time.perf_counter() - start)
    return {"sae_tokens_per_s": sae_rate, "forward_tokens_per_s": forward_rate}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=20000)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--latents", type=int, default=4096)
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--buffer-tokens", type=int, default=2**16)
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--child", default=None)
    p.add_argument("--root", default=None)
    p.add_argument("--out", default=str(RESULTS_DIR / "sae_stream.json"))
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, Path(args.root), args)))
        return 0
    from _datasets import synthetic_image

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _model(root, args.size)
        (root / "images").mkdir()
        for i in range(args.images):
            synthetic_image(i, size=args.size).save(root / "images" / f"{i:06d}.png")
        ways = {}
        for way in ("stream", "dump"):
            forwarded = [str(v) for name in ("images", "size", "latents", "k", "buffer_tokens", "batch_tokens")
                         for v in (f"--{name.replace('_', '-')}", getattr(args, name))]
            proc = subprocess.run([sys.executable, __file__, *forwarded, "--child", way, "--root", str(root)],
                                  capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(f"the {way} child failed:\n{proc.stderr[-3000:]}")
            ways[way] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"{way:7s} {ways[way]['seconds']:7.1f} s, wrote {ways[way]['written_bytes'] / 2**20:8.1f} MiB, "
                  f"peak RSS {ways[way]['peak_rss_bytes'] / 2**20:7.0f} MiB", flush=True)
        measured = rates(root, args)
    ratio = ways["stream"]["seconds"] / ways["dump"]["seconds"]
    print(f"\n{cpu_model()}, {len(os.sched_getaffinity(0))} CPUs; {args.images} images at {args.size} px, "
          f"{ways['stream']['tokens']} tokens of 384 channels, TopK {args.latents} latents k={args.k}")
    print(f"  stream / dump-then-train time: x{ratio:.2f}; activations written: stream "
          f"{ways['stream']['written_bytes'] / 2**20:.1f} MiB (the SAE file), dump "
          f"{ways['dump']['written_bytes'] / 2**20:.1f} MiB")
    print(f"  SAE update {measured['sae_tokens_per_s']:.0f} tokens/s, model forward "
          f"{measured['forward_tokens_per_s']:.0f} tokens/s of {HOOK}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"cpu": cpu_model(), "cpus": len(os.sched_getaffinity(0)),
                               "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
                               "settings": vars(args), "ways": ways, "ratio_stream_to_dump": ratio, **measured},
                              indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
