"""Text a command did not write (file and model names, messages built from them) reaches the terminal with its
control characters as escapes, and every other character as it is."""

from __future__ import annotations

import pytest

from vitscope.cli.terminal import printable


@pytest.mark.parametrize(("given", "shown"), [
    ("clear\x1b[2J", r"clear\x1b[2J"),  # an escape sequence: ESC
    ("title\x1b]0;T\x07", r"title\x1b]0;T\x07"),  # a window title: OSC ... BEL
    ("del\x7f and c1 \x9b", r"del\x7f and c1 \x9b"),
    ("evil\u202egnp.exe", r"evil\u202egnp.exe"),  # a right-to-left override hides the real extension
    ("two\u2028lines", r"two\u2028lines"),
])
def test_control_and_reordering_characters_are_escaped(given: str, shown: str) -> None:
    assert printable(given) == shown


@pytest.mark.parametrize("name", ["Bézier café.png", "猫の写真.jpg", "می\u200cخواهم.png", "👩\u200d💻 and 🏳️\u200d🌈",
                                  "a\u00a0b\u202fc", "e\u0301", "plain name.png"])
def test_names_of_every_script_are_shown_as_they_are(name: str) -> None:
    """Joiners (Persian, Indic, emoji sequences), no-break spaces and combining accents are text, not control."""
    assert printable(name) == name
