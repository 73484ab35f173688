"""The one check of Python path parameters that take only a local path: a URL ("s3://b/x",
"https://h/x") is refused in one line, never taken for a relative folder named "s3:". The rule
itself lives in C++ (zerowait/storage/url.hpp) and the command line shares it."""

from __future__ import annotations

import os
from typing import Any

from zerowait import _core


def local_path(path: Any, what: str, fix: str = "") -> str:
    """``path`` (str or os.PathLike) as a str; InvalidArgumentError (a ValueError) naming
    ``what`` when it is a URL."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    _core.require_local_path(text, what, fix)
    return text
