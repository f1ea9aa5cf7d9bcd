"""Model cards: one Markdown page per zoo model, written from its build record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitscope.atomic import write_text_atomic

__all__ = ["MARGIN_OVER_PIXELS", "MARGIN_OVER_RANDOM", "card_text", "meets_bar", "write_card"]

MARGIN_OVER_RANDOM = 0.20  # a trained model must beat its untrained twin by this much (absolute)
MARGIN_OVER_PIXELS = 0.15  # and a raw-pixel model by this much

_SCORE_NAMES = {"accuracy": "classification accuracy of its head",
                "knn": "weighted k-NN accuracy (k = 20, T = 0.07)",
                "recall@1": "Recall@1 of unseen identities (leave-one-out, cosine)"}


_TIE = 1e-9  # scores are fractions of the test set: 0.235 - 0.085 is 0.15 but falls just below it in floats


def meets_bar(record: dict[str, Any]) -> bool:
    """Whether the record's score clears both baselines by the required margins (an exact tie counts)."""
    b = record["baselines"]
    return (record["score"] - b["random_init"] >= MARGIN_OVER_RANDOM - _TIE
            and record["score"] - b["raw_pixels"] >= MARGIN_OVER_PIXELS - _TIE)


def card_text(record: dict[str, Any]) -> str:
    """The Markdown model card of one build record."""
    e = record["entry"]
    b = record["baselines"]
    kind = record["score_kind"]
    feats = f" on {e['features']} features" if kind == "knn" else ""
    rows = [("trained", record["score"]), ("randomly initialised twin", b["random_init"]),
            ("raw pixels", b["raw_pixels"])]
    table = "\n".join(f"| {who} | {value:.3f} |" for who, value in rows)
    snaps = record.get("snapshots") or {}
    ordered = sorted(snaps.items(), key=lambda x: int(x[0]))
    snap_lines = "\n".join(f"| {e['name']}@step{s} | {v:.3f} |" for s, v in ordered)
    snap_text = (f"\n## Training checkpoints\n\nShipped for the effect-of-training figures; load them by name "
                 f"(`@step0` is the seeded initialisation, rebuilt without a file).\n\n"
                 f"| checkpoint | {kind} |\n|---|---|\n| {e['name']}@step0 | {b['random_init']:.3f} |\n"
                 f"{snap_lines}\n| {e['name']} (final) | {record['score']:.3f} |\n"
                 if snaps else "")
    verdict = "meets" if meets_bar(record) else "does NOT meet"
    cfg = ", ".join(f"{k}={v}" for k, v in e["recipe_config"].items()) or "recipe defaults"
    model = ", ".join(f"{k}={v}" for k, v in e["model"].items())
    kernel = " with explicit attention products" if e.get("math_attention") else ""
    threads = f"{record['threads']} thread" + ("" if record["threads"] == 1 else "s")
    return f"""# {e['name']}

{e['description']}.

```python
import vitscope
backbone = vitscope.load_model("{e['name']}")   # offline, fp16 weights checked against manifest.json
```

## Model

- Architecture: {e['arch']} ({model}); {record['params']:,} parameters.
- Recipe: `{e['recipe']}` ({cfg}); {record['steps_trained']} steps of {e['batch_size']} images,
  bfloat16 autocast on CPU{kernel}, seed {e['data_seed']}; {record['train_seconds']:.0f} s on {threads}
  (torch {record['torch']}).
- Loss: {record['loss_first']:.4f} at the first step, {record['loss_last']:.4f} over the last 20 steps.
- Data: {e['train_images']} scenes of the synthetic world (10 classes, 64 px) with seed {e['data_seed']}.

## Held-out score

Score: {_SCORE_NAMES[kind]}{feats}, on scenes of a world seed never trained on (see
`vitscope.zoo.heldout` for the protocol).

| model | {kind} |
|---|---|
{table}

Margins: {record['score'] - b['random_init']:+.3f} over the untrained twin (required +{MARGIN_OVER_RANDOM:.2f}),
{record['score'] - b['raw_pixels']:+.3f} over raw pixels (required +{MARGIN_OVER_PIXELS:.2f}):
it {verdict} the zoo's bar.
{_spurious_text(record)}{snap_text}
## Limitations

Trained on procedurally generated 64 px scenes only; it is a test subject for vitscope's analyses, not a
model of natural images. Rebuild with `vitscope zoo build {e['name']}`.
"""


def _spurious_text(record: dict[str, Any]) -> str:
    p = record["entry"].get("spurious")
    if p is None:
        return ""
    clean = record.get("score_independent_backgrounds")
    clean_text = f" With independent backgrounds the score is {clean:.3f}." if clean is not None else ""
    return (f"\nTrained and scored on a world whose background type follows the class with probability {p}"
            f" (`SyntheticWorld(spurious={p})`).{clean_text}\n")


def write_card(directory: Path, record: dict[str, Any]) -> Path:
    """Write ``<directory>/cards/<name>.md``."""
    return write_text_atomic(directory / "cards" / f"{record['entry']['name']}.md", card_text(record))
