"""The candidate file's API: ``@candidate("RmsNorm")`` registers a callable for a kernel type.

A candidate file is plain Python; importing it runs its decorators, which record each callable
under the kernel type (database CSV name) it stands in for.  A candidate takes the same
arguments as the kernel type's replay ``run`` (what the replay's ``make_inputs`` built) and
returns the same outputs, so the judge can call the replay and the candidate on the same inputs.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

Function = TypeVar("Function", bound=Callable[..., Any])

# Filled while a candidate file is imported (load_candidates); None otherwise, when the
# decorator only marks the function (a file imported by its own tests keeps working).
_LOADING: dict[str, Callable[..., Any]] | None = None


class CandidateFileError(Exception):
    """A candidate file that cannot be loaded: the message names the file and the cause."""


def candidate(kernel_type: str) -> Callable[[Function], Function]:
    """Register the decorated callable as the candidate for ``kernel_type``."""
    if not isinstance(kernel_type, str) or not kernel_type:
        raise TypeError(f"candidate() needs a kernel type name, got {kernel_type!r}")

    def register(function: Function) -> Function:
        if not callable(function):
            raise TypeError(f"@candidate({kernel_type!r}) decorates {function!r}, which is not callable")
        if _LOADING is not None:
            if kernel_type in _LOADING:
                raise CandidateFileError(f"two candidates registered for kernel type {kernel_type}")
            _LOADING[kernel_type] = function
        setattr(function, "__perf_candidate__", kernel_type)
        return function

    return register


def load_candidates(path: str | Path) -> dict[str, Callable[..., Any]]:
    """Import the candidate file and return its callables by kernel type.

    Raises CandidateFileError (naming the file, and the line of the error where Python knows
    it) for a missing file or an import that raises.
    """
    global _LOADING
    file = Path(path)
    if not file.is_file():
        raise CandidateFileError(f"{file}: candidate file not found")
    name = f"perf_candidate_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise CandidateFileError(f"{file}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    registered: dict[str, Callable[..., Any]] = {}
    previous, _LOADING = _LOADING, registered
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except CandidateFileError as exc:
        sys.modules.pop(name, None)
        raise CandidateFileError(f"{file}: {exc}") from None
    except Exception as exc:  # the user's code: any error becomes one line naming where
        sys.modules.pop(name, None)
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == file.resolve() or f.filename == str(file)]
        where = f" (line {frames[-1].lineno})" if frames else ""
        raise CandidateFileError(f"{file}{where}: importing it raised {type(exc).__name__}: {exc}") from None
    finally:
        _LOADING = previous
    # A file may register nothing on purpose (a Triton candidate on a machine without Triton):
    # the caller says so instead of failing the run.
    return registered


__all__ = ("CandidateFileError", "candidate", "load_candidates")
