"""Before an NPU run: the environment vLLM-Ascend's custom operators need.

Five kernel types run operators that vLLM-Ascend builds itself and installs as a CANN custom
operator package inside its Python package::

    <site-packages>/vllm_ascend/_cann_ops_custom/vendors/vllm-ascend/
        op_api/lib/libcust_opapi.so      (the aclnn entry points)
        op_impl/ ...  op_proto/ ...      (kernels and their registration)

CANN finds such a package only through ``ASCEND_CUSTOM_OPP_PATH`` (the vendor directory) and
the dynamic loader its ``op_api/lib`` only through ``LD_LIBRARY_PATH``.  Without them the
operators are missing from the run or, worse, CANN's built-in operator of the same name runs in
their place, so the check happens before msprof is launched, with the exact lines to type.

The vendor directory is found without importing vLLM-Ascend (``importlib.util.find_spec``
locates the package without running it; importing it would initialise the device runtime).
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

# The seed's list of kernel types whose replays need the custom operator package.
CUSTOM_OPP_KERNEL_TYPES = (
    "AddRmsNormBias",
    "DispatchFFNCombine",
    "KvRmsNormRopeCache",
    "RINGMLAPrefillBF16Kernel",
    "split_qkv_rmsnorm_rope_kernel",
)
CUSTOM_OPP_VAR = "ASCEND_CUSTOM_OPP_PATH"
LIBRARY_VAR = "LD_LIBRARY_PATH"
PACKAGE = "vllm_ascend"
VENDORS = ("_cann_ops_custom", "vendors")
VENDOR = "vllm-ascend"
OP_API_LIB = ("op_api", "lib")
PLACEHOLDER_VENDOR_DIR = Path("/path/to/vllm_ascend/_cann_ops_custom/vendors/vllm-ascend")

_SHELL_SAFE = re.compile(r"^[A-Za-z0-9_./+,@%=-]+$")


def needs_custom_opp(kernel_types: Collection[str]) -> list[str]:
    """The selected kernel types that run vLLM-Ascend's custom operators, in the seed's order."""
    return [kernel_type for kernel_type in CUSTOM_OPP_KERNEL_TYPES if kernel_type in kernel_types]


def _package_dir() -> Path | None:
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def installed_vendor_dir(package_dir: Callable[[], Path | None] = _package_dir) -> Path | None:
    """The custom operator package installed with vLLM-Ascend, or None.

    ``vendors/vllm-ascend`` where it exists; otherwise the one vendor directory there is
    (a build that kept CANN's default vendor name, ``customize``).
    """
    package = package_dir()
    if package is None:
        return None
    vendors = package.joinpath(*VENDORS)
    if vendors.joinpath(VENDOR, *OP_API_LIB).is_dir():
        return vendors / VENDOR
    found = sorted(p.parent.parent for p in vendors.glob("*/" + "/".join(OP_API_LIB)) if p.is_dir())
    return found[0] if len(found) == 1 else None


def _entries(environ: Mapping[str, str], variable: str) -> list[str]:
    return [entry for entry in environ.get(variable, "").split(os.pathsep) if entry]


def _same(a: str | Path, b: str | Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _is_vendor_dir(path: str) -> bool:
    return Path(path).joinpath(*OP_API_LIB).is_dir()


def custom_opp_problems(environ: Mapping[str, str], vendor_dir: Path | None) -> list[str]:
    """What is wrong with the two variables for ``vendor_dir`` (any custom operator package
    when vLLM-Ascend's was not found); empty when nothing is."""
    named = _entries(environ, CUSTOM_OPP_VAR)
    if vendor_dir is not None:
        packages = [entry for entry in named if _same(entry, vendor_dir)]
        what = str(vendor_dir)
    else:
        packages = [entry for entry in named if _is_vendor_dir(entry)]
        what = "a custom operator package (a directory with op_api/lib)"
    problems = []
    if not named:
        problems.append(f"{CUSTOM_OPP_VAR} is not set")
    elif not packages:
        problems.append(f"{CUSTOM_OPP_VAR}={environ[CUSTOM_OPP_VAR]} does not name {what}")
    libraries = _entries(environ, LIBRARY_VAR)
    if vendor_dir is not None and not packages:
        packages = [str(vendor_dir)]
    wanted = [Path(p).joinpath(*OP_API_LIB) for p in packages]
    if not any(_same(entry, lib) for entry in libraries for lib in wanted):
        shown = " or ".join(str(lib) for lib in wanted) or "the package's op_api/lib"
        problems.append(f"{LIBRARY_VAR} does not contain {shown}")
    return problems


def _quoted(path: Path) -> str:
    """``path`` as shell text of one word (double-quoted where the shell would split or expand it)."""
    text = str(path)
    return text if _SHELL_SAFE.match(text) else '"' + re.sub(r'([\\"`$])', r"\\\1", text) + '"'


def export_lines(vendor_dir: Path) -> list[str]:
    """The two ``export`` lines that make ``vendor_dir`` visible, in the seed's form."""
    library = vendor_dir.joinpath(*OP_API_LIB)
    return [
        f"export {CUSTOM_OPP_VAR}={_quoted(vendor_dir)}:${{{CUSTOM_OPP_VAR}}}",
        f"export {LIBRARY_VAR}={_quoted(library)}/:${{{LIBRARY_VAR}}}",
    ]


def custom_opp_message(
    environ: Mapping[str, str],
    kernel_types: Collection[str],
    find_vendor_dir: Callable[[], Path | None] = installed_vendor_dir,
) -> str | None:
    """None when the selected kernel types need no custom operators or the environment has
    them; otherwise one message: which kernel types, what is wrong, the lines to type."""
    needing = needs_custom_opp(kernel_types)
    if not needing:
        return None
    vendor_dir = find_vendor_dir()
    problems = custom_opp_problems(environ, vendor_dir)
    if not problems:
        return None
    lines = [
        f"{', '.join(needing)} run vLLM-Ascend's custom operators, which CANN loads only from the "
        f"directories these variables name: {'; '.join(problems)}."
    ]
    if vendor_dir is None:
        lines.append(
            f"No custom operator package was found beside {PACKAGE} in this Python (vLLM-Ascend built with "
            f"its custom operators installs one at {PACKAGE}/{'/'.join(VENDORS)}/{VENDOR}): "
            "put yours in place of the path below."
        )
    lines.append("Type, then run again:")
    lines.extend(f"    {line}" for line in export_lines(vendor_dir or PLACEHOLDER_VENDOR_DIR))
    lines.append(f"or leave these kernel types out (-k \"not {' and not '.join(needing)}\").")
    return "\n".join(lines)
