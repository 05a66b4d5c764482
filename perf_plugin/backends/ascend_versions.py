"""The versions an Ascend database directory is named by, read from what is installed.

The directory is ``vllm{V}_torch{T}_cann{C}`` (``vllm0.18.0_torch2.9.0_cann8.5``): V is the
vLLM-Ascend release, T the torch release torch_npu is built for, C CANN's major.minor.  Options
given on the command line win; what they leave out is detected here, and each detected value
says where it came from, so that a reader of the run's header can check it.

Nothing is imported (importing torch_npu initialises the device runtime): package versions come
from the installed distributions' metadata, CANN's from the toolkit's own files, in the formats a
CANN toolkit installs:

* ``<toolkit>/<arch>-linux/ascend_toolkit_install.info``: ``version=8.2.RC1`` (the product
  release), beside ``package_name=``, ``innerversion=``, ``arch=``, ``path=`` lines;
* ``<toolkit>/{toolkit,compiler,opp,runtime}/version.info``: ``Version=8.2.0.0.201`` (a
  component version: CANN 8.0.0 writes ``Version=7.6.0.1.220`` there) and
  ``version_dir=8.2.RC1`` (the product release; CANN 9 writes ``version_dir=cann``), so
  ``version_dir`` is read first and either only where it is a version.

``<toolkit>`` is ``ASCEND_TOOLKIT_HOME`` or ``ASCEND_HOME_PATH`` as the toolkit's ``set_env.sh``
exports them; only when neither is set, the default install locations.  A toolkit named by the
environment is never second-guessed by another one found on disk.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from perf_plugin.database.errors import DatabaseError

TOOLKIT_HOME_VARS = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")
# Before CANN 8.5 the toolkit installs under ascend-toolkit/; from 8.5 under cann/ (cann-<version>).
DEFAULT_TOOLKIT_HOMES = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann")
INSTALL_INFO = "ascend_toolkit_install.info"
COMPONENT_VERSION_FILES = ("toolkit/version.info", "compiler/version.info", "opp/version.info", "runtime/version.info")

VLLM_ASCEND_DISTRIBUTIONS = ("vllm-ascend", "vllm_ascend")
TORCH_NPU_DISTRIBUTIONS = ("torch-npu", "torch_npu")

_MAJOR_MINOR = re.compile(r"^(\d+)\.(\d+)")
_RELEASE = re.compile(r"^\d+\.\d+\.\d+")


@dataclass(frozen=True)
class Detected:
    """A version and where it was read."""

    value: str
    source: str


@dataclass(frozen=True)
class AscendStack:
    """The three parts of an Ascend version directory, and what was detected for them."""

    vllm: str
    torch: str
    cann: str
    detected: tuple[str, ...] = ()


# ----------------------------------------------------------------------------- CANN
def read_info(path: Path) -> dict[str, str]:
    """``key=value`` lines of an Ascend info file (empty when it cannot be read)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and key.strip() not in values:
            values[key.strip()] = value.strip().strip('"')
    return values


def toolkit_homes(environ: Mapping[str, str]) -> list[Path]:
    """Where to look for the toolkit: the environment's, else the default install locations."""
    named = [environ[var] for var in TOOLKIT_HOME_VARS if environ.get(var)]
    return [Path(p) for p in dict.fromkeys(named or DEFAULT_TOOLKIT_HOMES)]


def _install_info_files(home: Path, machine: str) -> list[Path]:
    preferred = home / f"{machine}-linux" / INSTALL_INFO
    others = sorted(p for p in home.glob(f"*-linux/{INSTALL_INFO}") if p != preferred)
    return [preferred, *others]


def _component_release(values: Mapping[str, str]) -> str | None:
    for key in ("version_dir", "Version"):
        value = values.get(key, "")
        if _MAJOR_MINOR.match(value):
            return value
    return None


def find_cann_version(environ: Mapping[str, str] | None = None, machine: str | None = None) -> Detected | None:
    """CANN's product release (``8.2.RC1``, ``8.5.0``) and the file it came from, or None."""
    environ = os.environ if environ is None else environ
    machine = machine or platform.machine()
    for home in toolkit_homes(environ):
        for info in _install_info_files(home, machine):
            version = read_info(info).get("version")
            if version:
                return Detected(version, str(info))
        for name in COMPONENT_VERSION_FILES:
            path = home / name
            release = _component_release(read_info(path))
            if release:
                return Detected(release, str(path))
    return None


def cann_directory_version(release: str) -> str | None:
    """The ``cann{C}`` part: major.minor of the release (``8.3.RC2`` -> ``8.3``), or None."""
    match = _MAJOR_MINOR.match(release)
    return f"{match.group(1)}.{match.group(2)}" if match else None


# ----------------------------------------------------------------------------- packages
def installed_version(names: Sequence[str]) -> Detected | None:
    """The version of the first installed distribution of ``names``, from its metadata."""
    for name in names:
        try:
            distribution = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        label = distribution.metadata["Name"] or name
        return Detected(distribution.version, f"the installed {label} package")
    return None


def public_version(version: str) -> str:
    """Without the local label (``2.9.0+cpu`` -> ``2.9.0``)."""
    return version.split("+", 1)[0]


def torch_release(version: str) -> str | None:
    """The torch release a version names (torch_npu ``2.5.1.post1`` -> ``2.5.1``), or None."""
    match = _RELEASE.match(version)
    return match.group(0) if match else None


# ----------------------------------------------------------------------------- resolution
@dataclass(frozen=True)
class _Part:
    value: str | None
    problem: str = ""
    detected: str = ""


def _vllm_part(given: str | None) -> _Part:
    if given:
        return _Part(given)
    found = installed_version(VLLM_ASCEND_DISTRIBUTIONS)
    if found is None:
        return _Part(None, f"the vLLM-Ascend version: no vllm-ascend package is installed for {sys.executable}")
    if "dev" in found.value:
        return _Part(None, f"the vLLM-Ascend version: {found.source} is a development build ({found.value}), "
                           "which names no release")
    version = public_version(found.value)
    return _Part(version, detected=f"vLLM-Ascend {version} from {found.source}")


def _cann_part(given: str | None, environ: Mapping[str, str]) -> _Part:
    if given:
        return _Part(given)
    found = find_cann_version(environ)
    if found is None:
        homes = " or ".join(str(p) for p in toolkit_homes(environ))
        named = [f"{var}={environ[var]}" for var in TOOLKIT_HOME_VARS if environ.get(var)]
        where = f" ({', '.join(named)})" if named else f" ({' and '.join(TOOLKIT_HOME_VARS)} are not set: source the toolkit's set_env.sh)"
        return _Part(None, f"the CANN version: no {INSTALL_INFO} or version.info under {homes}{where}")
    version = cann_directory_version(found.value)
    if version is None:
        return _Part(None, f"the CANN version: {found.source} says {found.value!r}, which has no major.minor")
    return _Part(version, detected=f"CANN {version} from {found.source} ({found.value})")


def _torch_part(given: str | None, running_torch: Callable[[], str]) -> _Part:
    if given:
        return _Part(given)
    torch = public_version(running_torch())
    found = installed_version(TORCH_NPU_DISTRIBUTIONS)
    if found is None:  # not an NPU host: the running torch, as on the other backends
        return _Part(torch)
    built_for = torch_release(found.value)
    if built_for is None:
        return _Part(None, f"the torch version: {found.source} has version {found.value!r}, which names no torch release")
    if torch_release(torch) != built_for:
        return _Part(None, f"the torch version: {found.source} ({found.value}) is built for torch {built_for}, "
                           f"but torch {torch} is installed")
    return _Part(built_for, detected=f"torch {built_for} from {found.source} ({found.value})")


def resolve_ascend_stack(
    vllm: str | None,
    torch: str | None,
    cann: str | None,
    running_torch: Callable[[], str],
    environ: Mapping[str, str] | None = None,
) -> AscendStack:
    """The version directory's parts: the given ones, the rest detected.

    Raises DatabaseError naming every part that could not be detected, why, and the option
    that gives it.
    """
    environ = os.environ if environ is None else environ
    parts = {
        "vllm-version": _vllm_part(vllm),
        "torch-version": _torch_part(torch, running_torch),
        "cann-version": _cann_part(cann, environ),
    }
    missing = {option: part for option, part in parts.items() if part.value is None}
    if missing:
        problems = "; ".join(part.problem for part in missing.values())
        options = " and ".join(f"--perf-{option}" for option in missing)
        aliases = " and ".join(f"--{option}" for option in missing)
        raise DatabaseError(
            f"cannot name the Ascend database directory vllm_ascend/vllm<V>_torch<T>_cann<C>, not detected: "
            f"{problems}. Give {options} (or {aliases}), or --perf-database-path"
        )
    return AscendStack(
        vllm=parts["vllm-version"].value or "",
        torch=parts["torch-version"].value or "",
        cann=parts["cann-version"].value or "",
        detected=tuple(part.detected for part in parts.values() if part.detected),
    )
