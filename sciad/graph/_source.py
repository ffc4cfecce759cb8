"""Where in the user's program a node was created."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

_SCIAD_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_SKIP_PREFIXES = (_SCIAD_DIR, "<frozen ")


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """A user source location: `file` (full path), `line`, `function`."""

    file: str
    line: int
    function: str = ""

    def __str__(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    def long(self) -> str:
        fn = f" (in {self.function})" if self.function else ""
        return f"{self.file}:{self.line}{fn}"

    def to_json(self) -> dict:
        return {"file": self.file, "line": self.line, "function": self.function}

    @classmethod
    def from_json(cls, data) -> "SourceInfo | None":
        if data is None:
            return None
        return cls(str(data["file"]), int(data["line"]), str(data.get("function", "")))


def _is_internal(filename: str) -> bool:
    return filename.startswith(_SKIP_PREFIXES) or (
        os.sep + "jax" + os.sep in filename and "site-packages" in filename
    )


def user_source(skip: int = 1) -> SourceInfo | None:
    """The innermost stack frame outside sciad (and outside JAX's internals)."""
    frame = sys._getframe(skip)
    while frame is not None:
        code = frame.f_code
        if not _is_internal(code.co_filename):
            return SourceInfo(code.co_filename, frame.f_lineno, code.co_name)
        frame = frame.f_back
    return None


def source_from_traceback(tb) -> SourceInfo | None:
    """The innermost user frame of a traceback (where a user's call failed)."""
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if not _is_internal(code.co_filename):
            found = SourceInfo(code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    return found
