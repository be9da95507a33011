"""Text made safe for a terminal: what an LLM or a candidate wrote is printed, never interpreted.

Names, rationales, reasons and error messages can carry ANSI escape sequences or other control characters (an
LLM's answer, a candidate's source, a file name); printed raw they recolour, move the cursor, retitle the window
or hide what came before. Every line the CLI prints goes through `clean` (or `one_line` for the single-line
error), which drops C0 and C1 control characters (and DEL), keeping newline and tab.
"""
from __future__ import annotations

import re

# C0 (0x00-0x1f) but tab and newline, DEL, and C1 (0x80-0x9f, which include the one-byte CSI 0x9b).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(text: object) -> str:
    """`text` as a string without control characters other than newline and tab."""
    return _CONTROL.sub("", "" if text is None else str(text))


def one_line(text: object) -> str:
    """`clean(text)` on one line: newlines and tabs become single spaces."""
    return " ".join(clean(text).split())
