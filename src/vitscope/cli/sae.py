"""``vitscope sae train|eval|benchmark``: sparse autoencoders trained from the stream of a model's activations (also
under ``torchrun``: the processes share every pass), measured, and scored against the synthetic world's concepts;
parsing and printing only."""

from __future__ import annotations

from pathlib import Path

import typer

from vitscope.cli.errors import one_line_errors, require_choice, require_finite
from vitscope.cli.help_text import DEVICE_HELP
from vitscope.cli.imports import CommandLine
from vitscope.cli.paths import writable_folder
from vitscope.cli.terminal import say
from vitscope.cli.torchrun import refuse_under_torchrun

#: the benchmark's default models (vitscope.sae.benchmark.ZOO_MODELS, named here so that --help imports no torch)
_ZOO_VITS = ("tiny-vit-sup", "tiny-vit-distill", "tiny-vit-mae", "tiny-vit-sup-spurious")


def _k_within_latents(k: int, latents: int) -> None:
    """Refuse more active latents than the dictionary has, naming the two options.

    Raises:
        VitscopeUsageError: ``k`` exceeds ``latents``.
    """
    from vitscope.errors import VitscopeUsageError

    if k > latents:
        raise VitscopeUsageError(f"--k {k} exceeds --latents {latents}: a token cannot have more active latents than "
                                 "the dictionary has; lower --k or raise --latents")


sae_app = CommandLine(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                      help="Sparse autoencoders of a model's activations.")


@sae_app.callback()
def sae_group(ctx: typer.Context) -> None:
    """Sparse autoencoders of a model's activations."""
    refuse_under_torchrun(f"sae {ctx.invoked_subcommand}")


@sae_app.command("train")
@one_line_errors
def train_command(
    model: str = typer.Option(..., "--model", "-m", help="Registered name, hf:<id or dir>, or a directory."),
    hook: str = typer.Option(..., "--hook", help="One canonical hook, e.g. blocks.8.resid_post."),
    data: str = typer.Option(..., "--data", "-d", help="Images: a folder or ROOT::FORMAT."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder of the SAE (SAELens's layout)."),
    kind: str = typer.Option("topk", "--kind", help="relu, topk, batchtopk or matryoshka."),
    latents: int = typer.Option(4096, "--latents", min=1, help="Dictionary size."),
    k: int = typer.Option(32, "--k", min=1, help="Active latents per token (topk; on average: batchtopk)."),
    tokens: float = typer.Option(2e6, "--tokens", min=1, help="Tokens to train on (passes repeat until seen)."),
    buffer_tokens: int | None = typer.Option(None, "--buffer-tokens", min=2, help="Shuffle buffer [from free "
                                                                                    "memory]."),
    tokens_of: str = typer.Option("spatial", "--tokens-of", help="spatial, cls, registers or all."),
    batch_tokens: int = typer.Option(4096, "--batch-tokens", min=1, help="SAE minibatch."),
    lr: float = typer.Option(2e-4, "--lr", min=0, help="Adam's peak learning rate."),
    seed: int = typer.Option(0, "--seed", help="Weights, data order and shuffles."),
    batch_size: int = typer.Option(32, "--batch-size", "-b", min=1, help="Images per forward pass."),
    device: str | None = typer.Option(None, "--device", help=DEVICE_HELP),
) -> None:
    """Train a sparse autoencoder from passes over the data (no activation written): cfg.json and
    sae_weights.safetensors in --out, cfg.json saying what it was trained on (the model's identity, the data's
    fingerprint, the settings, the versions). Under torchrun the processes share every pass and train one SAE; process 0
    writes it and speaks."""
    from vitscope.autoencoders.model import KINDS
    from vitscope.autoencoders.tokens import TOKENS_OF
    from vitscope.engine.provenance import model_identity
    from vitscope.engine.settings import resolve_device
    from vitscope.models.input_size import describe_input
    from vitscope.models.load import load_model
    from vitscope.outputs.writer import environment
    from vitscope.sae.training import SAETraining, train
    from vitscope.workflows.launch import role

    require_choice("--kind", kind, KINDS)
    require_choice("--tokens-of", tokens_of, TOKENS_OF)
    _k_within_latents(k, latents)
    require_finite("--tokens", tokens)
    require_finite("--lr", lr)
    resolve_device(device)  # an unknown or absent device is one line, before the model loads
    writable_folder("--out", out, keep=False)  # the SAE is saved only after training: a wrong --out fails now
    config = SAETraining(kind=kind, latents=latents, k=k, tokens=int(tokens), buffer_tokens=buffer_tokens,
                         tokens_of=tokens_of, batch_tokens=batch_tokens, lr=lr, seed=seed)
    with role(say) as me:
        backbone = load_model(model, device=device)
        if me.log:
            me.log(describe_input(backbone.spec))
        made_of = {"models": [model_identity(model, backbone)], "environment": environment()}
        sae = train(backbone, hook, data, config, out=out, batch_size=batch_size, device=device, log=me.log,
                    distributed=me.distributed, record=made_of)
    if not me.main:  # another process of a torchrun launch: process 0 reports
        return
    last = sae.training_log[-1] if sae.training_log else {}
    typer.echo(f"{kind} SAE of {hook}: {latents} latents, FVU {last.get('fvu', float('nan')):.3f}, L0 "
               f"{last.get('l0', float('nan')):.1f}, dead {last.get('dead', 0)} -> {out}")


@sae_app.command("eval")
@one_line_errors
def eval_command(
    sae: Path = typer.Option(..., "--sae", help="Folder of an SAE in SAELens's layout."),
    model: str = typer.Option(..., "--model", "-m", help="The model it reads."),
    data: str = typer.Option(..., "--data", "-d", help="Held-out images: a folder or ROOT::FORMAT."),
    hook: str | None = typer.Option(None, "--hook", help="Where [the SAE's own hook]."),
    tokens_of: str | None = typer.Option(None, "--tokens-of", help="spatial, cls, registers or all [those the SAE "
                                         "was trained on, else spatial]."),
    images: int = typer.Option(32, "--images", min=1, help="Images the spliced-in cost is measured on."),
    batch_size: int = typer.Option(32, "--batch-size", "-b", min=1, help="Images per forward pass."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Folder for results.json and report.html, the record "
                                                              "of this measurement [none: printed only]."),
) -> None:
    """Measure an SAE on held-out images: FVU, cosine, L0, dead and dense latents, and the output's change with the
    hook replaced by the reconstruction, by its mean and by PCA of the same L0 (one JSON object, with the model's,
    the data's and the SAE's identities; --out also writes them as results.json)."""
    from vitscope.autoencoders.tokens import TOKENS_OF
    from vitscope.engine.provenance import model_identity
    from vitscope.models.input_size import describe_input
    from vitscope.models.load import load_model
    from vitscope.sae import evaluate, load
    from vitscope.sae.provenance import sae_identity
    from vitscope.strict_json import dumps

    if tokens_of is not None:
        require_choice("--tokens-of", tokens_of, TOKENS_OF)
    if out is not None:
        writable_folder("--out", out, keep=False)  # written after the passes: a wrong --out fails now
    autoencoder = load(sae)  # a file that is no SAE fails before the model loads
    backbone = load_model(model)
    say(describe_input(backbone.spec))  # stdout holds the JSON alone
    found = evaluate(autoencoder, backbone, data, hook=hook, tokens_of=tokens_of, images=images,
                     batch_size=batch_size)
    found.update(models=[model_identity(model, backbone)], sae=sae_identity(autoencoder, sae))
    typer.echo(dumps(found, indent=1))
    if out is not None:
        config = {"command": "sae eval", "sae": str(sae), "model": model, "data": data, "hook": hook,
                  "tokens_of": tokens_of, "images": images, "batch_size": batch_size, "out": str(out)}
        from vitscope.workflows.sae_eval import write_sae_eval

        typer.echo(f"-> {write_sae_eval(out, found, config)}", err=True)


@sae_app.command("benchmark")
@one_line_errors
def benchmark_command(
    models: str = typer.Option(",".join(_ZOO_VITS), "--models", "-M", help="Comma-separated ViTs."),
    hook: str = typer.Option("blocks.3.resid_post", "--hook", help="The tokens read (blocks.N.<name>); the neurons "
                                                                   "are blocks.N.mlp.post."),
    out: Path = typer.Option(Path("sae_benchmark"), "--out", "-o", help="Output folder."),
    images: int = typer.Option(1000, "--images", min=1, help="Fitting scenes."),
    heldout: int = typer.Option(500, "--heldout", min=1, help="Held-out scenes."),
    latents: int = typer.Option(512, "--latents", min=1, help="SAE latents (and k-means centroids, random "
                                                               "directions, PCA and ICA components up to the width)."),
    k: int = typer.Option(16, "--k", min=1, help="Active latents per token."),
    kind: str = typer.Option("topk", "--kind", help="relu, topk, batchtopk or matryoshka."),
    tokens: float = typer.Option(2**18, "--tokens", min=1, help="SAE training tokens."),
    batch_tokens: int = typer.Option(1024, "--batch-tokens", min=1, help="SAE minibatch."),
    lr: float = typer.Option(1e-3, "--lr", min=0, help="SAE's peak learning rate."),
    fit_tokens: int = typer.Option(20_000, "--fit-tokens", min=1, help="Fitting sample: fits the baselines, ranks "
                                                                        "units, sets thresholds, fits read-outs."),
    cap: int = typer.Option(32, "--cap", min=1, help="Most units a read-out may use."),
    min_tokens: int = typer.Option(20, "--min-tokens", min=1, help="Positive tokens a concept needs in each set."),
    seed: int = typer.Option(0, "--seed", help="SAE, baselines and fitting sample."),
    world_seed: int = typer.Option(20_000, "--world-seed", min=0, help="Seed of the synthetic world."),
    batch_size: int = typer.Option(64, "--batch-size", "-b", min=1, help="Images per forward pass."),
    device: str | None = typer.Option(None, "--device", help=DEVICE_HELP),
) -> None:
    """Score SAE latents, PCA, ICA, k-means, random directions and the MLP neurons as detectors of the synthetic
    world's concepts (class, part, background type, object or background, colour) on held-out tokens:
    benchmark.json, benchmark.md, auroc.png."""
    from vitscope.autoencoders.model import KINDS
    from vitscope.sae.benchmark import SAEBenchmark, benchmark

    require_choice("--kind", kind, KINDS)
    _k_within_latents(k, latents)
    require_finite("--tokens", tokens)
    require_finite("--lr", lr)
    config = SAEBenchmark(hook=hook, images=images, heldout=heldout, kind=kind, latents=latents, k=k,
                          tokens=int(tokens), batch_tokens=batch_tokens, lr=lr, fit_tokens=fit_tokens, cap=cap,
                          min_tokens=min_tokens, seed=seed, world_seed=world_seed, batch_size=batch_size)
    doc = benchmark([m.strip() for m in models.split(",") if m.strip()], config, out=out, device=device,
                    log=say)
    for model, found in doc["models"].items():
        means = ", ".join(f"{m} {found['methods'][m]['mean_auroc']:.2f}" for m in found["methods"])
        typer.echo(f"{model}: mean held-out AUROC of the best unit per concept: {means}")
    typer.echo(f"{len(doc['models'])} model(s), {doc['seconds']:.0f} s -> {out / 'benchmark.md'}")
