"""``vitscope sae train``: a sparse autoencoder trained from the stream of a model's activations (also under
``torchrun``: the processes share every pass); parsing and printing only."""

from __future__ import annotations

from pathlib import Path

import typer

from vitscope.cli.errors import one_line_errors
from vitscope.cli.imports import CommandLine
from vitscope.cli.torchrun import refuse_under_torchrun

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
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, mps [best available]."),
) -> None:
    """Train a sparse autoencoder from passes over the data (no activation written): cfg.json and
    sae_weights.safetensors in --out. Under torchrun the processes share every pass and train one SAE; process 0
    writes it and speaks."""
    from vitscope.models.load import load_model
    from vitscope.sae.training import SAETraining, train
    from vitscope.workflows.launch import role

    config = SAETraining(kind=kind, latents=latents, k=k, tokens=int(tokens), buffer_tokens=buffer_tokens,
                         tokens_of=tokens_of, batch_tokens=batch_tokens, lr=lr, seed=seed)
    with role(lambda s: typer.echo(s, err=True)) as me:
        backbone = load_model(model, device=device)
        sae = train(backbone, hook, data, config, out=out, batch_size=batch_size, device=device, log=me.log,
                    distributed=me.distributed)
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
    tokens_of: str = typer.Option("spatial", "--tokens-of", help="spatial, cls, registers or all."),
    images: int = typer.Option(32, "--images", min=1, help="Images the spliced-in cost is measured on."),
    batch_size: int = typer.Option(32, "--batch-size", "-b", min=1, help="Images per forward pass."),
) -> None:
    """Measure an SAE on held-out images: FVU, cosine, L0, dead and dense latents, and the output's change with the
    hook replaced by the reconstruction, by its mean and by PCA of the same L0 (one JSON object)."""
    from vitscope.models.load import load_model
    from vitscope.sae import evaluate, load
    from vitscope.strict_json import dumps

    found = evaluate(load(sae), load_model(model), data, hook=hook, tokens_of=tokens_of, images=images,
                     batch_size=batch_size)
    typer.echo(dumps(found, indent=1))
