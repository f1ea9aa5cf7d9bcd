"""The record of ``vitscope sae eval``: what :func:`vitscope.sae.evaluate` measured, with the model's, the data's and
the SAE's identities, written as results.json and report.html by the one writer."""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_sae_eval"]


def write_sae_eval(out: Path, found: dict, config: dict) -> Path:
    """Write what ``vitscope sae eval`` measured (``found``: :func:`vitscope.sae.evaluate`'s numbers with the
    ``models``, ``data`` and ``sae`` identities) as results.json and report.html in ``out``; returns results.json.

    Args:
        out: the folder; found: the measurement; config: the command's options as given.
    """
    import pandas as pd

    from vitscope.analyses.result import SummaryResult
    from vitscope.engine.settings import describe_device
    from vitscope.outputs import RunResult, write_run

    numbers = {key: value for key, value in found.items() if key not in ("models", "data", "sae")}
    table = pd.DataFrame([{"replacement": name, **costs} for name, costs in numbers["spliced"].items()])
    result = SummaryResult("sae_eval", numbers, tables={"sae_eval_spliced": table},
                           intro="The SAE on held-out tokens: reconstruction (FVU, cosine), sparsity (L0, dead and "
                                 "dense latents) and the model's output with the hook replaced by the reconstruction, "
                                 "by the tokens' mean and by PCA of the same L0.")
    sae = found["sae"]
    return write_run(out, RunResult(
        "sae eval", title=f"vitscope sae eval: {sae['kind']} SAE of {numbers['hook']}",
        subtitle=f"{sae['d_sae']} latents, {sae['path']}", config=config, results={"sae_eval": result},
        models=found["models"], data=found["data"], num_images=numbers["num_images"], extra={"sae": sae},
        device=describe_device(None)), progress=False)
