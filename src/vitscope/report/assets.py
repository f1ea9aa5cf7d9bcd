"""Scripts the report page carries inline: the pinned chart library and vitscope's own chart code.

Apache ECharts (Apache License 2.0; ``vendor/echarts-LICENSE.txt`` and ``echarts-NOTICE.txt``) is vendored
as its published ``dist/echarts.min.js``, pinned by version and SHA-256: the page loads nothing from the
network and opens from ``file://``. ``make vendor-echarts`` fetches the pinned version again from npm.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources

from vitscope.errors import VitscopeRuntimeError

__all__ = ["ECHARTS_SHA256", "ECHARTS_VERSION", "chart_script", "echarts_script"]

ECHARTS_VERSION = "6.1.0"
ECHARTS_SHA256 = "b66b25aeb4df84e33199dc21694014d336d222cbd9deb0e5a7c14bd6aa0d0fd0"


@cache
def echarts_script() -> str:
    """The vendored ``echarts.min.js``; an altered or truncated file is an error, not a broken page."""
    raw = resources.files("vitscope.report").joinpath("vendor/echarts.min.js").read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != ECHARTS_SHA256:
        raise VitscopeRuntimeError(f"vitscope/report/vendor/echarts.min.js is not ECharts {ECHARTS_VERSION} as pinned "
                                   f"(sha256 {digest[:12]}..., expected {ECHARTS_SHA256[:12]}...): reinstall vitscope "
                                   "or run 'make vendor-echarts'")
    text = raw.decode("utf-8")
    if "</script" in text.lower():  # would end the inline script early
        raise VitscopeRuntimeError("echarts.min.js contains '</script' and cannot be inlined")
    return text


@cache
def chart_script() -> str:
    """vitscope's chart code (``templates/charts.js``): draws every chart of the page from its embedded JSON."""
    return resources.files("vitscope.report").joinpath("templates/charts.js").read_text(encoding="utf-8")
