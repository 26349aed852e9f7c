"""A CJK font for the plots: Chinese ``data_source`` names end up in metric names and legends.

Matplotlib's default font (DejaVu Sans) has no Chinese glyphs, and its font manager does not scan
the TrueType collections (``.ttc``) that Debian's ``fonts-noto-cjk`` installs (``make`` installs it
where it can). :func:`cjk_fonts` registers the first Noto Sans CJK collection found and is a ``matplotlib.rc_context``
that falls back to it glyph by glyph; with none installed it changes nothing and the labels keep
matplotlib's boxes (and its "Glyph missing" warnings).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import shutil
import subprocess
from typing import Any

FONT_DIRS = ("/usr/share/fonts", "/usr/local/share/fonts", "~/.local/share/fonts", "~/.fonts")
FAMILY = "Noto Sans CJK SC"  # simplified Chinese forms first


def cjk_font_files() -> list[str]:
    """The Noto Sans CJK font files on this machine (fontconfig's list, else the usual folders)."""
    found: list[str] = []
    if shutil.which("fc-list"):
        out = subprocess.run(["fc-list", ":lang=zh", "file"], capture_output=True, text=True, check=False).stdout
        found = [line.split(":")[0].strip() for line in out.splitlines() if "NotoSansCJK" in line]
    if not found:
        from pathlib import Path

        for folder in FONT_DIRS:
            found += glob.glob(str(Path(folder).expanduser() / "**" / "NotoSansCJK*"), recursive=True)
    return sorted(set(found), key=lambda f: ("Regular" not in f, f))


@functools.cache
def cjk_family() -> str | None:
    """The family name of the registered Noto Sans CJK font, or None where none is installed."""
    files = cjk_font_files()
    if not files:
        return None
    from matplotlib import font_manager

    font_manager.fontManager.addfont(files[0])
    families = {f.name for f in font_manager.fontManager.ttflist}
    return FAMILY if FAMILY in families else next((n for n in sorted(families) if "CJK" in n), None)


def cjk_fonts() -> contextlib.AbstractContextManager[Any]:
    """A ``matplotlib.rc_context``: DejaVu Sans, then Noto Sans CJK for the glyphs it lacks (nothing without one)."""
    import matplotlib

    family = cjk_family()
    return matplotlib.rc_context({"font.family": ["DejaVu Sans", family]}) if family else contextlib.nullcontext()
