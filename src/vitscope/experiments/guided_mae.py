"""Random-mask vs guided-mask MAE twins on the synthetic world (paper 003 section 5.2, figure 9).

Two tiny ViTs with the same initial weights, data, batch order, crops and flips, and MAE hyper-parameters
are pretrained, one with MAE's uniform random masks and one with SIFT-guided masks whose keypoint share
``rho`` climbs a curriculum (:class:`~vitscope.train.guided_masking.GuidedMAERecipe`). The masks draw from
a generator of their own (``MAEConfig.mask_seed``): the two mask functions use different amounts of
randomness, and sharing the crops' generator would give the twins different crops from the second step
on. Weights are snapshotted at evenly spaced steps and scored by the zoo's MAE probe (k-NN accuracy of the
mean spatial token, a bank of training scenes against held-out scenes); the curves say which twin
converges faster. The training length is a parameter: the published comparison needs long runs, tests use
a few steps.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from vitscope.errors import VitscopeValueError
from vitscope.outputs.folder import check_output
from vitscope.outputs.lock import releasing_outputs
from vitscope.train import evaluate as ev
from vitscope.train.data import synthetic_split
from vitscope.train.guided_masking import DEFAULT_LEVELS, GuidedMAERecipe
from vitscope.train.loop import LoopConfig, fit
from vitscope.train.mae import MAEConfig, MAERecipe

__all__ = ["GuidedMAEConfig", "convergence_summary", "rho_staircase", "run_guided_mae"]

TWINS: tuple[str, ...] = ("random", "guided")


@dataclass(frozen=True)
class GuidedMAEConfig:
    """Settings of the guided-MAE experiment.

    Attributes:
        steps: optimisation steps per twin.
        batch_size: images per step.
        train_images: training scenes rendered (``steps_per_epoch = train_images // batch_size``).
        eval_points: number of evaluations after step 0 (evenly spaced, the last at ``steps``).
        bank_images, test_images: k-NN probe bank (training scenes) and held-out test scenes.
        image_size, patch_size, embed_dim, depth, num_heads: the tiny ViT.
        mask_ratio: MAE mask ratio.
        every_epochs: epochs per curriculum level; levels: the ``rho`` values climbed.
        seed: world, initial weights, batch order, crops and masks (both twins share it).
        autocast: ``"bf16"`` or None (float32), passed to the training loop.
    """

    steps: int = 1200
    batch_size: int = 128
    train_images: int = 4000
    eval_points: int = 6
    bank_images: int = 1000
    test_images: int = 500
    image_size: int = 64
    patch_size: int = 8
    embed_dim: int = 128
    depth: int = 6
    num_heads: int = 4
    mask_ratio: float = 0.75
    every_epochs: int = 2
    levels: tuple[float, ...] = field(default_factory=lambda: DEFAULT_LEVELS)
    seed: int = 0
    autocast: str | None = None

    def __post_init__(self) -> None:
        if self.steps < 1 or self.eval_points < 1 or self.batch_size < 1:
            raise VitscopeValueError("steps, eval_points and batch_size must be at least 1")
        if not 0.0 < self.mask_ratio < 1.0:
            raise VitscopeValueError(f"mask_ratio must be in (0, 1), got {self.mask_ratio}")
        if self.embed_dim % self.num_heads:
            raise VitscopeValueError(f"embed_dim ({self.embed_dim}) must be a multiple of num_heads "
                                     f"({self.num_heads})")
        if self.train_images < self.batch_size:
            raise VitscopeValueError(f"train_images ({self.train_images}) must hold at least one batch "
                                     f"({self.batch_size})")

    @property
    def steps_per_epoch(self) -> int:
        return self.train_images // self.batch_size

    def eval_steps(self) -> list[int]:
        """Steps after which the twins are scored (step 0 = the shared initial weights)."""
        points = {round(self.steps * (i + 1) / self.eval_points) for i in range(self.eval_points)}
        return [0, *sorted(p for p in points if p > 0)]


def _model(cfg: GuidedMAEConfig):
    from vitscope.models.tiny import TinyViT, TinyViTConfig
    from vitscope.models.wrap import wrap_tiny_vit

    arch = TinyViTConfig(image_size=cfg.image_size, patch_size=cfg.patch_size, embed_dim=cfg.embed_dim,
                         depth=cfg.depth, num_heads=cfg.num_heads, num_classes=0, seed=cfg.seed)
    model = TinyViT(arch)
    return model, wrap_tiny_vit(model, "mae-twin")


def _twin_recipe(twin: str, backbone, cfg: GuidedMAEConfig) -> MAERecipe:
    """The MAE recipe of one twin; both draw their masks from a generator of their own (``mask_seed``)."""
    mae = MAEConfig(mask_ratio=cfg.mask_ratio, seed=cfg.seed, mask_seed=cfg.seed)
    if twin == "random":
        return MAERecipe(backbone, mae)
    return GuidedMAERecipe(backbone, mae, cfg.steps_per_epoch, cfg.every_epochs, cfg.levels)


def rho_staircase(recipe: GuidedMAERecipe, steps: int) -> tuple[list[float], list[float]]:
    """The curriculum's ``rho`` over training as the vertices of a staircase, in epochs.

    Joined by straight lines the vertices draw ``rho`` exactly: every level change is a vertical step at the
    epoch it starts, so levels that hold between evaluation points are drawn too.

    Args:
        recipe: the guided recipe (its curriculum and steps per epoch).
        steps: optimisation steps trained.

    Returns:
        ``(epochs, rho)``, equally long: from epoch 0 to ``steps / steps_per_epoch``.
    """
    per_epoch = recipe.steps_per_epoch
    epochs, rho = [0.0], [recipe.rho_at(0)]
    for step in range(1, steps):
        level = recipe.rho_at(step)
        if level != rho[-1]:  # the old level up to the change, the new one from it
            epochs += [step / per_epoch, step / per_epoch]
            rho += [rho[-1], level]
    return epochs + [steps / per_epoch], rho + [rho[-1]]


def _knn(model, cfg: GuidedMAEConfig, bank, test) -> float:
    from vitscope.models.wrap import wrap_tiny_vit

    backbone = wrap_tiny_vit(model.eval(), "mae-twin")
    return ev.knn_accuracy(ev.extract(backbone, bank.images, "mean"), bank.labels,
                           ev.extract(backbone, test.images, "mean"), test.labels)


def convergence_summary(steps: list[int], curves: dict[str, list[float]], fraction: float = 0.95) -> dict[str, Any]:
    """Which twin reaches ``fraction`` of the best accuracy either reached, first (and the mean over points).

    Returns:
        ``{"target", "first_step": {twin: step or None}, "mean_accuracy": {twin: float}, "faster": name or
        "tie" or "neither"}``.
    """
    best = max(max(c) for c in curves.values())
    target = fraction * best
    # no accuracy above zero: both "reach" 0 at the first step, which says nothing about speed
    first = {n: next((s for s, a in zip(steps, c) if a >= target), None) if best > 0 else None
             for n, c in curves.items()}
    reached = {n: s for n, s in first.items() if s is not None}
    if not reached:
        faster = "neither"
    else:
        earliest = min(reached.values())
        winners = [n for n, s in reached.items() if s == earliest]
        faster = winners[0] if len(winners) == 1 else "tie"
    return {"target": target, "first_step": first, "faster": faster,
            "mean_accuracy": {n: sum(c) / len(c) for n, c in curves.items()}}


@releasing_outputs
def run_guided_mae(cfg: GuidedMAEConfig, out: str | Path, progress: bool | None = None,
                   figure_files: bool = False) -> dict[str, Any]:
    """Train both twins, score their snapshots; write ``results.json``, ``tables/guided_mae.csv``, figure 9 and
    ``report.html``.

    Args:
        cfg: the experiment's settings.
        out: output folder.
        progress: training progress bars (default: when stderr is a terminal).
        figure_files: also write the curves as PNG and SVG (the report draws them in the browser).

    Returns:
        The ``results.json`` document.
    """
    check_output(out)  # before any work: a wrong --out costs nothing
    import pandas as pd

    from vitscope.analyses.result import Figure, SummaryResult
    from vitscope.outputs import RunResult, prepare_output, write_run
    from vitscope.viz import charts
    from vitscope.viz.ranges import quantity_range

    out = prepare_output(out)
    data = synthetic_split(cfg.train_images, cfg.seed, size=cfg.image_size)
    bank = data.subset(torch.arange(min(cfg.bank_images, len(data))))
    test = synthetic_split(cfg.test_images, cfg.seed + 10_000, size=cfg.image_size)
    steps = cfg.eval_steps()
    loop = LoopConfig(steps=cfg.steps, batch_size=cfg.batch_size, seed=cfg.seed, progress=progress,
                      snapshot_steps=tuple(s for s in steps if s > 0), autocast=cfg.autocast)
    curves: dict[str, list[float]] = {}
    losses: dict[str, list[float]] = {}
    initial = None
    for twin in TWINS:
        model, backbone = _model(cfg)
        initial = initial if initial is not None else _knn(model, cfg, bank, test)
        result = fit(_twin_recipe(twin, backbone, cfg), data, loop)
        curve = [initial]
        for step in steps[1:]:
            snap, _ = _model(cfg)
            snap.load_state_dict(result.snapshots[step])
            curve.append(_knn(snap, cfg, bank, test))
        curves[twin], losses[twin] = curve, result.losses
    guide = GuidedMAERecipe(_model(cfg)[1], MAEConfig(), cfg.steps_per_epoch, cfg.every_epochs, cfg.levels)
    epochs = [s / cfg.steps_per_epoch for s in steps]
    rho = [guide.rho_at(max(s - 1, 0)) for s in steps]  # the rho of the last step trained before each point
    curriculum = rho_staircase(guide, cfg.steps)

    def draw(path: Path) -> list[Path]:
        from vitscope.viz.masking_figures import guided_mae_figure

        return guided_mae_figure(epochs, curves, "k-NN accuracy (mean token)", path, curriculum)

    table = pd.DataFrame({"step": steps, "epoch": epochs, "rho": rho, **{t: curves[t] for t in TWINS}})
    summary = {"steps": steps, "epochs": epochs, "rho": rho, "accuracy": curves,
               "curriculum": {"epochs": curriculum[0], "rho": curriculum[1]},
               "final_loss": {t: sum(v[-10:]) / len(v[-10:]) for t, v in losses.items()},
               "convergence": convergence_summary(steps, curves)}
    result = SummaryResult("guided_mae", summary, tables={"guided_mae": table}, figures=[Figure(
        "guided_mae", draw, "Guided MAE", "k-NN accuracy of the mean token during pretraining, SIFT-guided masks "
        "against random masks (rho: the share of SIFT keypoint patches among the masked patches).",
        "paper 003, fig. 9", chart=charts.Chart(
            charts.value_lines_chart([charts.curve(f"{t} masks", curves[t], t, x=epochs) for t in TWINS], "epoch",
                                     "k-NN accuracy (mean token)", "Random against guided (SIFT keypoint) masks",
                                     y_range=quantity_range("accuracy")).panels
            + charts.value_lines_chart([charts.curve("rho (guided)", curriculum[1], "", "dotted",
                                                                     curriculum[0])], "epoch", "rho",
                                       "Share of keypoint patches among the masked", y_range=(0.0, 1.0)).panels))],
        intro="MAE pretraining with masks guided by SIFT keypoints (a share rho of the masked patches holds "
              "keypoints, raised by a curriculum) against random masks.")
    path = write_run(out, RunResult(
        "experiment guided-mae", title="vitscope experiment guided-mae", config=asdict(cfg),
        results={"guided_mae": result},
        models=[{"name": f"tiny-vit ({t} masks)", "family": "tiny-vit", "num_blocks": cfg.depth,
                 "num_heads": cfg.num_heads} for t in TWINS],
        data={"name": "synthetic world", "source": f"seed {cfg.seed}, {cfg.train_images} training scenes, "
              f"k-NN bank {len(bank)}, held-out test {len(test)}"}, extra={"experiment": "guided-mae"}),
        progress=progress, figure_files=figure_files)
    doc = json.loads(path.read_text())
    return doc
