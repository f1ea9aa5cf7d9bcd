"""The options of ``analyze``, ``compare`` and ``probe``: one frozen dataclass per command, resolved from a YAML
file, the command line and defaults.

Each command's options are declared once, as the fields of its dataclass (:class:`AnalyzeOptions`,
:class:`CompareOptions`, :class:`ProbeOptions`; the options every pass takes are :class:`PassOptions`); the option
tables (:data:`ANALYZE_OPTIONS`...) are read from those fields. The CLI (``--config`` and its flags), the demo and
the library calls (``vitscope.analyze``, ``vitscope.compare_models``) build the same object, and the workflow
receives it whole.

Precedence: an option given on the command line > the same key in the YAML file > the default. Keys are the
long option names with ``_`` or ``-`` (``batch_size`` or ``batch-size``); an unknown key is an error naming
the closest known key. Example ``analyze.yaml``::

    model: tiny-vit-sup
    data: synth_coco::coco
    out: runs/sup
    analyses: [attention, clustering]   # or "attention,clustering"
    batch_size: 32
    limit: 500
    params:                             # analysis parameters (as --param clustering.k=10)
      clustering: {k: 10}
    import: my_lab.token_norm           # modules of analyses (as --import), a name or a list

``compare`` takes ``models`` as a list (``[tiny-vit-sup, dino=hf:facebook/dinov2-small]``) or a mapping of
display names to models (``{sup: tiny-vit-sup, dino: hf:facebook/dinov2-small}``); ``probe`` takes ``blocks``
as a list of integers, ``"0,3,-1"`` or ``all``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from vitscope.workflows.option_values import ConfigError, Option, load_config, resolve_options

if TYPE_CHECKING:  # pragma: no cover - names for the annotations only (importing them costs torch)
    from vitscope.analyses.base import Analysis
    from vitscope.models.backbone import Backbone

__all__ = ["ANALYZE_OPTIONS", "COMPARE_OPTIONS", "PROBE_OPTIONS", "AnalyzeOptions", "CompareOptions", "ConfigError",
           "Option", "PassOptions", "ProbeOptions", "load_config", "option", "option_fields", "option_table",
           "resolve", "resolve_options"]


_OPTION = "vitscope.option"  # the dataclass field metadata that makes a field an option


def option(kind: str, default: Any = dataclasses.MISSING, *, required: bool = False, minimum: float | None = None,
           maximum: float | None = None, key: str | None = None) -> Any:
    """A field of a command's options that is also an option of the command (flag, YAML key and table row).

    Args:
        kind: the option's type, as :class:`Option` names it.
        default: the value when given nowhere; left out, the field defaults to None, or (``required``) must be
            passed to the dataclass.
        required: the command line or the YAML file must give it.
        minimum, maximum: bounds of a number.
        key: the YAML key and option name when it is not the field's name (a Python keyword).
    """
    meta = {_OPTION: {"kind": kind, "required": required, "minimum": minimum, "maximum": maximum, "key": key}}
    if default is dataclasses.MISSING and not required:
        default = None
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class PassOptions:
    """What every command that makes passes over a dataset takes (``config_file``: the YAML file read, if any)."""

    data: Any = option("str", required=True)
    out: Path | None = option("path", None, required=True)
    limit: int | None = option("int", minimum=1)
    batch_size: int = option("int", 16, minimum=1)
    device: str | None = option("str")
    dtype: str | None = option("str")
    strict: bool = option("bool", False)
    resume: bool = option("bool", True)
    checkpoint_seconds: float = option("float", 60.0, minimum=0)
    figure_files: bool = option("bool", False)
    image_size: int | tuple[int, int] | None = option("int", minimum=1)  # None: the model's own preprocessing
    keep_aspect: bool = option("bool", False)  # each image at its own aspect ratio and token grid
    workers: int | None = option("int", minimum=0)  # None: chosen from the CPUs (engine.settings.loader_workers)
    jpeg_draft: bool = option("bool", False)  # JPEGs decoded at reduced DCT scales (engine.decoding)
    config_file: str | None = None

    def check_placement(self) -> None:
        """The device and the dtype exist and are available, checked before any model or data loads.

        Raises:
            VitscopeUsageError: an unknown device or dtype (exit status 2 on the command line).
            VitscopeValueError: a device this machine does not have.
        """
        from vitscope.engine.settings import resolve_device, resolve_dtype

        resolve_device(self.device)
        resolve_dtype(self.dtype)

    def record(self, **resolved: Any) -> dict[str, Any]:
        """The options as results.json keeps them: in the table's order, paths as text, the device and dtype
        made explicit (``auto``, ``fp32``), the analysis parameters typed as the analyses took them,
        ``config_file`` when a file was read, then ``resolved`` (choices made while running: the analyses chosen,
        the probe's task...) over them."""
        from vitscope.engine.settings import dtype_name

        values = ((o.name, getattr(self, attribute)) for attribute, o in _declared(type(self)))
        record = {name: str(v) if isinstance(v, Path) else v for name, v in values}
        if self.config_file is not None:
            record["config_file"] = self.config_file
        if record.get("params"):  # typed as the analyses took them, from the command line as from a file
            from vitscope.analyses.params import typed_params

            record["params"] = typed_params(record["params"])
        record["device"] = record.get("device") or "auto"
        record["dtype"] = dtype_name(record.get("dtype"))  # one name per precision: bfloat16 is bf16
        record.update(resolved)
        return record


@dataclass(frozen=True, kw_only=True)
class AnalyzeOptions(PassOptions):
    """``vitscope analyze`` and ``vitscope.analyze``: the model (a name or, from Python, a Backbone), the data
    (from Python: anything :func:`vitscope.data.as_source` opens) and the analyses (names, groups, ``NAME@TAG``
    or, from Python, Analysis instances; None: the defaults) with their parameters."""

    model: str | Backbone = option("str", required=True)
    analyses: str | Sequence[str | Analysis] | None = option("list")
    params: Mapping[str, Mapping[str, Any]] | None = option("params")
    compile_stats: bool = option("bool", False)  # the shared attention statistics through torch.compile


@dataclass(frozen=True, kw_only=True)
class CompareOptions(PassOptions):
    """``vitscope compare`` and ``vitscope.compare_models``: the models (entries ``MODEL`` or ``NAME=MODEL``, or
    a mapping name -> model) and what each runs besides the pooled features."""

    models: list[str] | dict[str, str] = option("models", required=True)
    analyses: Sequence[str] | None = option("list")
    params: Mapping[str, Mapping[str, Any]] | None = option("params")
    compile_stats: bool = option("bool", False)
    cka_estimator: str = option("str", "full_unbiased")  # CKA between models (comparison.curves.CKA_ESTIMATORS)


@dataclass(frozen=True, kw_only=True)
class ProbeOptions(PassOptions):
    """``vitscope probe``: the model, the benchmark's probes and their split; ``blocks`` is a tuple, None or
    ``"all"`` (every block), checked against the model when it is loaded."""

    model: str = option("str", required=True)
    test_data: str | None = option("str")
    test_fraction: float = option("float", 0.2, minimum=0.01, maximum=0.99)
    tiling: float = option("float", 0.0, minimum=0)
    blocks: tuple[int, ...] | str | None = option("blocks")
    site: str = option("str", "resid_post")
    seed: int = option("int", 0)
    cache: Path | None = option("path")
    davis_void: str = option("str", "background")

    def __post_init__(self) -> None:
        if self.tiling != 0 and not self.tiling >= 1:
            raise ConfigError(f"--tiling must be 0 (off) or a scale >= 1, got {self.tiling:g}")


@functools.cache
def _declared(kind: type[PassOptions]) -> tuple[tuple[str, Option], ...]:
    """``(field name, Option)`` of every option field of ``kind``: the command's own options first, then those
    of every pass, each in the order declared."""
    fields = {f.name: f for f in dataclasses.fields(kind) if _OPTION in f.metadata}
    order = dict.fromkeys(name for klass in kind.__mro__ for name in vars(klass).get("__annotations__", {})
                          if name in fields)
    declared = []
    for name in order:
        f, meta = fields[name], fields[name].metadata[_OPTION]
        default = None if f.default is dataclasses.MISSING else f.default
        declared.append((name, Option(meta["key"] or name, meta["kind"], default, meta["required"], meta["minimum"],
                                      meta["maximum"])))
    return tuple(declared)


def option_table(kind: type[PassOptions]) -> tuple[Option, ...]:
    """The options of a command, read from its dataclass (its own first, then those of every pass)."""
    return tuple(o for _, o in _declared(kind))


def option_fields(kind: type[PassOptions]) -> tuple[str, ...]:
    """The field names of a command's options (as :func:`resolve` takes them, and as the CLI names its
    parameters), in :func:`option_table`'s order."""
    return tuple(attribute for attribute, _ in _declared(kind))


#: Options of ``vitscope analyze`` (names as in the YAML file and as keyword arguments).
ANALYZE_OPTIONS: tuple[Option, ...] = option_table(AnalyzeOptions)

#: Options of ``vitscope compare``.
COMPARE_OPTIONS: tuple[Option, ...] = option_table(CompareOptions)

#: Options of ``vitscope probe``.
PROBE_OPTIONS: tuple[Option, ...] = option_table(ProbeOptions)

Options = TypeVar("Options", bound=PassOptions)


def resolve(kind: type[Options], given: Mapping[str, Any], config_file: str | Path | None = None) -> Options:
    """A command's options object from the command line (or a library call) and an optional YAML file.

    Args:
        kind: the command's dataclass (:class:`AnalyzeOptions`...).
        given: values by field name; None means "not given".
        config_file: optional YAML file.

    Raises:
        ConfigError: a bad file or value, or a required option given nowhere.
    """
    declared = _declared(kind)
    unknown = sorted(set(given) - set(option_fields(kind)))
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)}")
    values = resolve_options(tuple(o for _, o in declared),
                             {o.name: given[attribute] for attribute, o in declared if attribute in given}, config_file)
    return kind(**{attribute: values[o.name] for attribute, o in declared}, config_file=values.get("config_file"))


