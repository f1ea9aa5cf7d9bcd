"""What feature visualisation maximises: small picklable objectives that compose with ``+``, ``-`` and ``*``.

Every objective maps the recorded activations of a batch to one number per image (``[B]``, larger is
better); the renderer minimises ``-mean(objective) + lambda_tv * TV``. Objectives declare the canonical
hook names they read (``hooks()``) and whether they need the classifier logits (``needs_logits``).

Spatial tokens are those after the prefix tokens (CLS, distillation, registers); a ``token`` is a
row-major spatial index or an ``(row, col)`` pair (docs/methods.md, Shared rules).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping

import torch

from vitscope.errors import VitscopeUsageError, VitscopeValueError
from vitscope.hooks.tokens import site_units
from vitscope.models.spec import ModelSpec

__all__ = [
    "ChannelObjective", "ClassLogit", "Combination", "ConvChannel", "Direction", "FFNChannel", "Key",
    "Objective", "Query", "Value", "parse_objective",
]

Token = int | tuple[int, int] | None


class Objective(ABC):
    """Base class: ``obj(acts, spec, grid) -> [B]``; composes linearly with other objectives."""

    name: str = "objective"
    needs_logits: bool = False

    def hooks(self) -> tuple[str, ...]:
        """Canonical hook names this objective reads."""
        return ()

    @abstractmethod
    def __call__(self, acts: Mapping[str, torch.Tensor], spec: ModelSpec, grid: tuple[int, int]) -> torch.Tensor:
        """The objective per image ``[B]`` from the recorded activations."""

    # -- composition --------------------------------------------------------------------
    def _terms(self) -> tuple[tuple[float, Objective], ...]:
        return ((1.0, self),)

    def __add__(self, other: Objective) -> Combination:
        if not isinstance(other, Objective):
            return NotImplemented
        return Combination(self._terms() + other._terms())

    def __sub__(self, other: Objective) -> Combination:
        if not isinstance(other, Objective):
            return NotImplemented
        return Combination(self._terms() + tuple((-w, o) for w, o in other._terms()))

    def __mul__(self, scale: float) -> Combination:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            return NotImplemented
        return Combination(tuple((w * float(scale), o) for w, o in self._terms()))

    __rmul__ = __mul__

    def __neg__(self) -> Combination:
        return self * -1.0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.__dict__.keys() == self.__dict__.keys() and all(
            _same(a, b) for a, b in zip(self.__dict__.values(), other.__dict__.values()))

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.name))


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


def _fmt_weight(w: float) -> str:
    return f"{w:g}"


class Combination(Objective):
    """A weighted sum of objectives, e.g. ``a - 0.5 * b`` (weights are plain floats)."""

    def __init__(self, terms: tuple[tuple[float, Objective], ...]) -> None:
        if not terms:
            raise VitscopeValueError("a combination needs at least one term")
        self.terms = tuple((float(w), o) for w, o in terms)
        parts = []
        for i, (w, o) in enumerate(self.terms):
            sign = "-" if w < 0 else "+"
            mag = abs(w)
            body = o.name if mag == 1.0 else f"{_fmt_weight(mag)}*{o.name}"
            parts.append((f"-{body}" if sign == "-" else body) if i == 0 else f" {sign} {body}")
        self.name = "".join(parts)
        self.needs_logits = any(o.needs_logits for _, o in self.terms)

    def _terms(self) -> tuple[tuple[float, Objective], ...]:
        return self.terms

    def hooks(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(h for _, o in self.terms for h in o.hooks()))

    def __call__(self, acts: Mapping[str, torch.Tensor], spec: ModelSpec, grid: tuple[int, int]) -> torch.Tensor:
        return sum(w * o(acts, spec, grid) for w, o in self.terms)


def _token_index(token: Token, grid: tuple[int, int]) -> int:
    h, w = grid
    if isinstance(token, tuple):
        r, c = token
        if not (0 <= r < h and 0 <= c < w):
            raise VitscopeUsageError(f"token {token} is outside the {h}x{w} grid")
        return r * w + c
    if not 0 <= int(token) < h * w:
        raise VitscopeUsageError(f"token {token} is outside the {h * w} spatial tokens of the {h}x{w} grid")
    return int(token)


def spatial_channel(x: torch.Tensor, channel: int, spec: ModelSpec, name: str) -> torch.Tensor:
    """One channel of a recorded site over its spatial positions: ``-> [B, K]`` (row-major).

    Accepts tokens ``[B, N, D]`` (prefix tokens dropped), attention tensors ``[B, H, N, Dh]`` (channel
    indexes the concatenated heads, ``head = channel // Dh``) and CNN maps ``[B, C, h, w]``.
    """
    if x.dim() == 3:
        width = x.shape[-1]
        _check_channel(channel, width, name)
        return x[:, spec.num_prefix_tokens:, channel]
    if x.dim() == 4 and spec.is_transformer:
        heads, dh = x.shape[1], x.shape[-1]
        _check_channel(channel, heads * dh, name)
        return x[:, channel // dh, spec.num_prefix_tokens:, channel % dh]
    if x.dim() == 4:
        _check_channel(channel, x.shape[1], name)
        return x[:, channel].flatten(1)
    raise VitscopeValueError(f"{name}: cannot take a channel of a tensor of shape {tuple(x.shape)}")


def _check_channel(channel: int, width: int, name: str) -> None:
    if not 0 <= channel < width:
        raise VitscopeUsageError(f"{name}: channel {channel} is out of range; this site has {width} channels "
                                 f"(0..{width - 1})")


def _site_grid(x: torch.Tensor, spec: ModelSpec, grid: tuple[int, int]) -> tuple[int, int]:
    """A CNN map has its own grid (each stage its resolution); tokens use the model's grid."""
    return (int(x.shape[-2]), int(x.shape[-1])) if x.dim() == 4 and not spec.is_transformer else grid


class ChannelObjective(Objective):
    """One channel of any recorded site, averaged over spatial tokens or taken at one token.

    Args:
        site: canonical hook name, e.g. ``"blocks.5.mlp.post"`` (the paper's default), ``"blocks.2.attn.k"``,
            ``"stages.3"``.
        channel: channel index (attention sites: index into the concatenated heads, ``H * Dh``).
        token: None (mean over spatial tokens), a row-major spatial index, or ``(row, col)``.
    """

    def __init__(self, site: str, channel: int, token: Token = None) -> None:
        self.site = str(site)
        self.channel = int(channel)
        self.token = tuple(int(t) for t in token) if isinstance(token, (tuple, list)) else (
            None if token is None else int(token))
        where = "" if self.token is None else "@" + (
            ",".join(map(str, self.token)) if isinstance(self.token, tuple) else str(self.token))
        self.name = f"{self.site}:{self.channel}{where}"

    def hooks(self) -> tuple[str, ...]:
        return (self.site,)

    def __eq__(self, other: object) -> bool:  # FFNChannel(5, 31) == ChannelObjective("blocks.5.mlp.post", 31)
        return isinstance(other, ChannelObjective) and (self.site, self.channel, self.token) == (
            other.site, other.channel, other.token)

    def __hash__(self) -> int:
        return hash((self.site, self.channel, self.token))

    def __call__(self, acts: Mapping[str, torch.Tensor], spec: ModelSpec, grid: tuple[int, int]) -> torch.Tensor:
        x = acts[self.site]
        values = spatial_channel(x, self.channel, spec, self.name)  # [B, K]
        if self.token is None:
            return values.mean(dim=1)
        return values[:, _token_index(self.token, _site_grid(x, spec, grid))]


class FFNChannel(ChannelObjective):
    """A channel of block ``block``'s FFN hidden activation after GELU (``blocks.{block}.mlp.post``)."""

    def __init__(self, block: int, channel: int, token: Token = None) -> None:
        super().__init__(f"blocks.{int(block)}.mlp.post", channel, token)


class Key(ChannelObjective):
    """A key channel of block ``block`` (``blocks.{block}.attn.k``; the paper's failure case)."""

    def __init__(self, block: int, channel: int, token: Token = None) -> None:
        super().__init__(f"blocks.{int(block)}.attn.k", channel, token)


class Query(ChannelObjective):
    """A query channel of block ``block`` (``blocks.{block}.attn.q``)."""

    def __init__(self, block: int, channel: int, token: Token = None) -> None:
        super().__init__(f"blocks.{int(block)}.attn.q", channel, token)


class Value(ChannelObjective):
    """A value channel of block ``block`` (``blocks.{block}.attn.v``)."""

    def __init__(self, block: int, channel: int, token: Token = None) -> None:
        super().__init__(f"blocks.{int(block)}.attn.v", channel, token)


class ConvChannel(ChannelObjective):
    """A channel of a CNN stage's map (``stages.{stage}``), averaged over positions or at ``(row, col)``."""

    def __init__(self, stage: int, channel: int, token: Token = None) -> None:
        super().__init__(f"stages.{int(stage)}", channel, token)


class ClassLogit(Objective):
    """The logit of class ``index`` from the model's classifier head (``Backbone.head``)."""

    needs_logits = True

    def __init__(self, index: int) -> None:
        self.index = int(index)
        self.name = f"logit:{self.index}"

    def __call__(self, acts: Mapping[str, torch.Tensor], spec: ModelSpec, grid: tuple[int, int]) -> torch.Tensor:
        logits = acts["logits"]
        if not 0 <= self.index < logits.shape[-1]:
            raise VitscopeUsageError(f"{self.name}: the head has {logits.shape[-1]} classes "
                                     f"(0..{logits.shape[-1] - 1})")
        return logits[:, self.index]


class Direction(Objective):
    """Projection of a site's tokens onto a direction of its embedding space (unit-normalised vector).

    Args:
        site: token site ``[B, N, D]`` (e.g. ``"blocks.3.resid_post"``), attention site ``[B, H, N, Dh]``
            (``"blocks.2.attn.k"``: the direction lives in the concatenated heads, ``H * Dh``, the channels of
            :class:`ChannelObjective`) or CNN map ``[B, C, h, w]``.
        vector: ``[C]`` direction (``D``, ``H * Dh`` or ``C``); it is normalised to unit length.
        token: None (mean over spatial tokens), a spatial index or ``(row, col)``.
        label: readable name of the direction (default ``"dir"``).
    """

    def __init__(self, site: str, vector: torch.Tensor, token: Token = None, label: str = "dir") -> None:
        v = torch.as_tensor(vector, dtype=torch.float32).detach().flatten().cpu()
        if v.norm() == 0:
            raise VitscopeValueError("a direction needs a non-zero vector")
        self.site = str(site)
        self.vector = v / v.norm()
        self.token = tuple(token) if isinstance(token, (tuple, list)) else token
        self.name = f"{self.site}.{label}" + ("" if token is None else f"@{token}")

    def hooks(self) -> tuple[str, ...]:
        return (self.site,)

    def __call__(self, acts: Mapping[str, torch.Tensor], spec: ModelSpec, grid: tuple[int, int]) -> torch.Tensor:
        x = acts[self.site]
        grid = _site_grid(x, spec, grid)
        x = site_units(x, spec.num_prefix_tokens, spec.is_transformer, self.name)  # [B, K, C]
        if x.shape[-1] != self.vector.numel():
            raise VitscopeValueError(f"{self.name}: the direction has {self.vector.numel()} entries, the site "
                                     f"{x.shape[-1]} channels")
        proj = x @ self.vector.to(device=x.device, dtype=x.dtype)  # [B, K]
        return proj.mean(dim=1) if self.token is None else proj[:, _token_index(self.token, grid)]


_UNIT = re.compile(r"^(?P<site>[a-z_.0-9]+?):(?P<channel>\d+)(?:@(?P<token>\d+(?:,\d+)?))?$")


def parse_objective(text: str) -> Objective:
    """Parse a unit written as on the command line.

    ``"blocks.5.mlp.post:31"`` (channel, mean over tokens), ``"blocks.5.mlp.post:31@12"`` or ``"...@2,3"``
    (at one token), ``"stages.2:7"`` (CNN channel), ``"logit:3"`` (class logit).

    Raises:
        VitscopeUsageError: with the accepted forms (a ``ValueError``).
    """
    s = text.strip()
    if s.startswith("logit:") and s[6:].isdigit():
        return ClassLogit(int(s[6:]))
    m = _UNIT.match(s)
    if m is None or m["site"] == "logit":
        raise VitscopeUsageError(f"cannot read unit {text!r}; write SITE:CHANNEL[@TOKEN] (e.g. blocks.5.mlp.post:31, "
                                 "blocks.5.mlp.post:31@2,3, stages.2:7) or logit:CLASS")
    token: Token = None
    if m["token"]:
        parts = [int(p) for p in m["token"].split(",")]
        token = (parts[0], parts[1]) if len(parts) == 2 else parts[0]
    return ChannelObjective(m["site"], int(m["channel"]), token)
