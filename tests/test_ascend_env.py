"""The Ascend stack around a run: version detection for the database directory, and the custom
operator environment checked before msprof is launched.

No NPU, CANN toolkit, torch_npu or vLLM-Ascend exists here.  The toolkit's files are written
into temporary directories in the formats CANN installs (contents as printed from real
installations in public vLLM-Ascend issue reports and deployment notes: CANN 8.0.0, 8.2.RC1,
8.3.RC2, 8.5.0), the packages as ``*.dist-info/METADATA`` directories, and vLLM-Ascend's custom
operator package as the directory tree its build installs.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from perf_plugin.backends import ascend_versions, npu
from perf_plugin.backends.ascend_versions import (
    cann_directory_version,
    find_cann_version,
    installed_version,
    resolve_ascend_stack,
)
from perf_plugin.database.errors import DatabaseError
from perf_plugin.options import Settings
from perf_plugin.profiling.msprof import MsprofError
from perf_plugin.results import CaseRef
from perf_plugin.run import location as location_module
from perf_plugin.run.ascend_env import (
    CUSTOM_OPP_KERNEL_TYPES,
    custom_opp_message,
    export_lines,
    installed_vendor_dir,
    needs_custom_opp,
)
from perf_plugin.run.cases import STATUS_READY, STATUS_UNSUPPORTED, Case
from perf_plugin.run.location import DeviceIdentity, describe_location, resolve_location
from perf_plugin.run.msprof_launch import external_run

# <toolkit>/aarch64-linux/ascend_toolkit_install.info of CANN 8.2.RC1
INSTALL_INFO_8_2 = """\
package_name=Ascend-cann-toolkit
version=8.2.RC1
innerversion=V100R001C22SPC001B231
compatible_version=[V100R001C15],[V100R001C18],[V100R001C19],[V100R001C20],[V100R001C21],[V100R001C23]
arch=aarch64
os=linux
path=/usr/local/Ascend/ascend-toolkit/8.2.RC1/aarch64-linux
"""
# the same file of CANN 8.3.RC2
INSTALL_INFO_8_3 = """\
package_name=Ascend-cann-toolkit
version=8.3.RC2
innerversion=V100R001C23SPC002B210
compatible_version=[V100R001C15],[V100R001C18],[V100R001C19],[V100R001C20],[V100R001C21],[V100R001C23]
arch=aarch64
os=linux
path=/usr/local/Ascend/ascend-toolkit/8.3.RC2/aarch64-linux
"""
# <toolkit>/toolkit/version.info of CANN 8.2.RC1 (Version= is the component's, version_dir= the release)
TOOLKIT_VERSION_8_2 = """\
Version=8.2.0.0.201
version_dir=8.2.RC1
timestamp=20250724_194044950
required_package_amct_acl_version="8.2"
required_package_compiler_version="8.2"
required_package_opp_kernel_version=">=7.6, <=8.2"
required_package_runtime_version="8.2"
"""
# <toolkit>/opp/version.info of CANN 8.0.0: the component says 7.6
OPP_VERSION_8_0 = """\
Version=7.6.0.1.220
version_dir=8.0.0
ops_version=7.6.0.1.220
"""
# <toolkit>/opp/version.info of CANN 8.5.0
OPP_VERSION_8_5 = """\
Version=8.5.0.2.220
version_dir=8.5.0
timestamp=20251117_000024591
required_package_amct_acl_version="8.5"
"""


def toolkit(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A site-packages directory on sys.path, and package metadata read from it alone (so that
    what this machine has installed cannot change the outcome)."""
    directory = tmp_path / "site-packages"
    directory.mkdir()
    monkeypatch.syspath_prepend(str(directory))

    def distribution(name: str) -> importlib.metadata.Distribution:
        for found in importlib.metadata.distributions(name=name, path=[str(directory)]):
            return found
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    yield directory


def install(site: Path, name: str, version: str) -> None:
    """A distribution as a wheel installs it: ``<name>-<version>.dist-info/METADATA``."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: stand-in\n")


# ============================================================================ CANN
def test_cann_release_comes_from_the_toolkit_install_info(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = toolkit(tmp_path / "latest", {
        "aarch64-linux/ascend_toolkit_install.info": INSTALL_INFO_8_2,
        "toolkit/version.info": TOOLKIT_VERSION_8_2,
    })
    found = find_cann_version({"ASCEND_TOOLKIT_HOME": str(home)}, machine="aarch64")
    assert found == ascend_versions.Detected("8.2.RC1", str(home / "aarch64-linux" / "ascend_toolkit_install.info"))
    assert cann_directory_version(found.value) == "8.2"
    monkeypatch.setenv("ASCEND_TOOLKIT_HOME", str(home))
    monkeypatch.delenv("ASCEND_HOME_PATH", raising=False)
    assert npu.cann_version() == "8.2.RC1"  # what the run report reads
    assert npu.NpuBackend.ccl_version() == "8.2"  # the HCCL directory: hccl/v8.2, as cann8.2


def test_the_install_info_of_this_machines_architecture_is_preferred(tmp_path: Path) -> None:
    home = toolkit(tmp_path / "latest", {
        "aarch64-linux/ascend_toolkit_install.info": INSTALL_INFO_8_3,
        "x86_64-linux/ascend_toolkit_install.info": INSTALL_INFO_8_2.replace("aarch64", "x86_64"),
    })
    assert find_cann_version({"ASCEND_HOME_PATH": str(home)}, machine="x86_64").value == "8.2.RC1"
    assert find_cann_version({"ASCEND_HOME_PATH": str(home)}, machine="aarch64").value == "8.3.RC2"
    assert find_cann_version({"ASCEND_HOME_PATH": str(home)}, machine="riscv64").value == "8.3.RC2"  # sorted


@pytest.mark.parametrize(
    ("text", "release", "directory"),
    [(OPP_VERSION_8_0, "8.0.0", "8.0"), (OPP_VERSION_8_5, "8.5.0", "8.5"), (TOOLKIT_VERSION_8_2, "8.2.RC1", "8.2")],
)
def test_a_component_version_info_gives_its_version_dir_not_its_own_version(
    tmp_path: Path, text: str, release: str, directory: str
) -> None:
    home = toolkit(tmp_path / "latest", {"opp/version.info": text})
    found = find_cann_version({"ASCEND_TOOLKIT_HOME": str(home)}, machine="aarch64")
    assert found is not None and (found.value, cann_directory_version(found.value)) == (release, directory)


def test_a_toolkit_named_by_the_environment_is_the_only_one_read(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert find_cann_version({"ASCEND_TOOLKIT_HOME": str(empty)}, machine="aarch64") is None
    with pytest.raises(DatabaseError) as info:
        resolve_ascend_stack("0.18.0", "2.9.0", None, lambda: "2.9.0", {"ASCEND_TOOLKIT_HOME": str(empty)})
    message = str(info.value)
    assert f"the CANN version: no ascend_toolkit_install.info or version.info under {empty} (ASCEND_TOOLKIT_HOME={empty})" in message
    assert message.endswith("Give --perf-cann-version (or --cann-version), or --perf-database-path")
    assert "vLLM-Ascend" not in message and "torch version" not in message


# ============================================================================ packages
def test_package_versions_come_from_installed_metadata(site: Path) -> None:
    assert installed_version(ascend_versions.VLLM_ASCEND_DISTRIBUTIONS) is None
    install(site, "vllm_ascend", "0.18.0")
    install(site, "torch-npu", "2.9.0.post1")
    assert installed_version(ascend_versions.VLLM_ASCEND_DISTRIBUTIONS) == ascend_versions.Detected(
        "0.18.0", "the installed vllm_ascend package"
    )
    assert installed_version(ascend_versions.TORCH_NPU_DISTRIBUTIONS).value == "2.9.0.post1"  # type: ignore[union-attr]
    assert "torch_npu" not in sys.modules and "vllm_ascend" not in sys.modules  # nothing was imported


def test_undetected_versions_name_the_options_to_give(site: Path, tmp_path: Path) -> None:
    with pytest.raises(DatabaseError) as info:
        resolve_ascend_stack(None, "2.9.0", None, lambda: "2.9.0", {"ASCEND_HOME_PATH": str(tmp_path / "none")})
    message = str(info.value)
    assert message.startswith("cannot name the Ascend database directory vllm_ascend/vllm<V>_torch<T>_cann<C>")
    assert f"the vLLM-Ascend version: no vllm-ascend package is installed for {sys.executable}" in message
    assert "the CANN version: no ascend_toolkit_install.info" in message
    assert "Give --perf-vllm-version and --perf-cann-version (or --vllm-version and --cann-version)" in message
    assert "\n" not in message


def test_a_development_build_of_vllm_ascend_names_no_release(site: Path, tmp_path: Path) -> None:
    install(site, "vllm_ascend", "0.1.dev1+g3c1f2a8")
    with pytest.raises(DatabaseError, match=r"development build \(0\.1\.dev1\+g3c1f2a8\).*Give --perf-vllm-version \("):
        resolve_ascend_stack(None, "2.9.0", "8.5", lambda: "2.9.0")


def test_torch_is_the_release_torch_npu_is_built_for(site: Path) -> None:
    install(site, "torch_npu", "2.5.1.post1")
    stack = resolve_ascend_stack("0.9.1", None, "8.2", lambda: "2.5.1+cpu")
    assert stack.torch == "2.5.1"
    assert stack.detected == ("torch 2.5.1 from the installed torch_npu package (2.5.1.post1)",)
    with pytest.raises(DatabaseError, match=r"torch_npu package \(2\.5\.1\.post1\) is built for torch 2\.5\.1, "
                                            r"but torch 2\.9\.0 is installed.*Give --perf-torch-version \("):
        resolve_ascend_stack("0.9.1", None, "8.2", lambda: "2.9.0")


def test_without_torch_npu_the_running_torch_names_the_directory(site: Path) -> None:
    assert resolve_ascend_stack("0.18.0", None, "8.5", lambda: "2.9.0+cpu").torch == "2.9.0"


def test_options_win_and_nothing_is_detected(site: Path) -> None:
    install(site, "vllm_ascend", "0.13.0")

    def no_torch() -> str:
        raise AssertionError("torch was consulted although --perf-torch-version was given")

    stack = resolve_ascend_stack("0.18.0", "2.9.0", "8.5", no_torch, {})
    assert (stack.vllm, stack.torch, stack.cann, stack.detected) == ("0.18.0", "2.9.0", "8.5", ())


def test_the_derived_path_uses_what_was_detected_and_says_where_from(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(site, "vllm_ascend", "0.18.0")
    install(site, "torch_npu", "2.9.0")
    home = toolkit(tmp_path / "cann-8.5.0", {"opp/version.info": OPP_VERSION_8_5})
    monkeypatch.setenv("ASCEND_HOME_PATH", str(home))
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    monkeypatch.setattr(location_module, "running_torch_version", lambda: "2.9.0")
    settings = dataclasses.replace(_settings(), vllm_version=None, torch_version=None, cann_version=None)

    location = resolve_location(settings, DeviceIdentity("npu", "ATLAS_800_A3_752T_128G_DIE", None))

    assert location.directory == Path("db/ATLAS_800_A3_752T_128G_DIE/vllm_ascend/vllm0.18.0_torch2.9.0_cann8.5")
    assert describe_location(location) == (
        f"{location.directory} (derived from device and versions; detected vLLM-Ascend 0.18.0 from the installed "
        f"vllm_ascend package, torch 2.9.0 from the installed torch_npu package (2.9.0), "
        f"CANN 8.5 from {home / 'opp' / 'version.info'} (8.5.0))"
    )


def _settings() -> Settings:
    return Settings(
        database_path=None, database_root=Path("db"), device=None, vllm_version=None, torch_version=None,
        cann_version=None, cuda_version=None, backend="npu", update_mode="all", prune_empty_duration_rows=False,
        repeat_count=30, warmup_count=5, prof_path=None, replay_coverage_min=None, replay_coverage_weight="rows",
        profile_batch_size=32, no_writeback=False, seed=0, cache_mode="auto", rotate_max_copies=1024,
        repeat_markers=False, lock_timeout=5.0, replay_log_capture="auto",
    )


# ============================================================================ custom operators
@pytest.fixture
def vllm_ascend(site: Path) -> Path:
    """vLLM-Ascend installed with its custom operator package, as its build lays it out."""
    package = site / "vllm_ascend"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('vllm_ascend must not be imported by the check')\n")
    vendor = package / "_cann_ops_custom" / "vendors" / "vllm-ascend"
    (vendor / "op_api" / "lib").mkdir(parents=True)
    (vendor / "op_api" / "lib" / "libcust_opapi.so").write_bytes(b"")
    (vendor / "op_api" / "include").mkdir()
    (vendor / "op_impl" / "ai_core" / "tbe").mkdir(parents=True)
    (vendor / "bin").mkdir()
    (vendor / "bin" / "set_env.bash").write_text(f"export ASCEND_CUSTOM_OPP_PATH={vendor}:${{ASCEND_CUSTOM_OPP_PATH}}\n")
    return vendor


def good_environ(vendor: Path) -> dict[str, str]:
    return {
        "ASCEND_CUSTOM_OPP_PATH": f"{vendor}:/usr/local/Ascend/ascend-toolkit/latest/opp/vendors/other",
        "LD_LIBRARY_PATH": f"/usr/local/Ascend/driver/lib64:{vendor}/op_api/lib/:/usr/lib",
    }


def test_the_installed_package_is_found_without_importing_it(vllm_ascend: Path) -> None:
    assert installed_vendor_dir() == vllm_ascend
    assert "vllm_ascend" not in sys.modules


def test_only_the_seeds_five_kernel_types_need_the_custom_operators() -> None:
    selected = {"MatMulV3", "split_qkv_rmsnorm_rope_kernel", "RmsNorm", "AddRmsNormBias"}
    assert needs_custom_opp(selected) == ["AddRmsNormBias", "split_qkv_rmsnorm_rope_kernel"]
    assert custom_opp_message({}, {"MatMulV3", "RmsNorm"}, lambda: None) is None  # nothing asked of the environment


def test_an_environment_that_names_the_package_passes(vllm_ascend: Path) -> None:
    assert custom_opp_message(good_environ(vllm_ascend), set(CUSTOM_OPP_KERNEL_TYPES)) is None


def test_missing_variables_give_one_message_with_the_lines_to_type(vllm_ascend: Path) -> None:
    message = custom_opp_message({"PATH": "/usr/bin"}, {"KvRmsNormRopeCache", "DispatchFFNCombine", "MatMulV3"})
    assert message is not None
    lines = message.splitlines()
    assert lines[0].startswith("DispatchFFNCombine, KvRmsNormRopeCache run vLLM-Ascend's custom operators")
    assert "MatMulV3" not in message
    assert "ASCEND_CUSTOM_OPP_PATH is not set" in lines[0]
    assert f"LD_LIBRARY_PATH does not contain {vllm_ascend / 'op_api' / 'lib'}" in lines[0]
    assert [line.strip() for line in lines[2:4]] == [
        f"export ASCEND_CUSTOM_OPP_PATH={vllm_ascend}:${{ASCEND_CUSTOM_OPP_PATH}}",
        f"export LD_LIBRARY_PATH={vllm_ascend}/op_api/lib/:${{LD_LIBRARY_PATH}}",
    ]
    assert lines[-1] == 'or leave these kernel types out (-k "not DispatchFFNCombine and not KvRmsNormRopeCache").'


def test_each_variable_is_checked_on_its_own(vllm_ascend: Path, tmp_path: Path) -> None:
    good = good_environ(vllm_ascend)
    elsewhere = tmp_path / "old_build" / "vendors" / "vllm-ascend"
    (elsewhere / "op_api" / "lib").mkdir(parents=True)

    only_library = custom_opp_message({"LD_LIBRARY_PATH": good["LD_LIBRARY_PATH"]}, {"AddRmsNormBias"})
    assert only_library is not None and "ASCEND_CUSTOM_OPP_PATH is not set." in only_library
    assert "LD_LIBRARY_PATH does not" not in only_library

    only_opp = custom_opp_message({"ASCEND_CUSTOM_OPP_PATH": good["ASCEND_CUSTOM_OPP_PATH"]}, {"AddRmsNormBias"})
    assert only_opp is not None and "ASCEND_CUSTOM_OPP_PATH" not in only_opp.splitlines()[0].split(":")[0]
    assert f"LD_LIBRARY_PATH does not contain {vllm_ascend / 'op_api' / 'lib'}." in only_opp

    other_build = dict(good, ASCEND_CUSTOM_OPP_PATH=str(elsewhere))
    message = custom_opp_message(other_build, {"AddRmsNormBias"})
    assert message is not None and f"ASCEND_CUSTOM_OPP_PATH={elsewhere} does not name {vllm_ascend}" in message


def test_without_vllm_ascend_any_custom_package_the_variables_name_will_do(tmp_path: Path) -> None:
    vendor = tmp_path / "opp" / "vendors" / "customize"
    (vendor / "op_api" / "lib").mkdir(parents=True)
    assert custom_opp_message(good_environ(vendor), {"RINGMLAPrefillBF16Kernel"}, lambda: None) is None

    message = custom_opp_message({}, {"RINGMLAPrefillBF16Kernel"}, lambda: None)
    assert message is not None
    assert "LD_LIBRARY_PATH does not contain the package's op_api/lib" in message
    assert "No custom operator package was found beside vllm_ascend in this Python" in message
    assert "    export ASCEND_CUSTOM_OPP_PATH=/path/to/vllm_ascend/_cann_ops_custom/vendors/vllm-ascend:${ASCEND_CUSTOM_OPP_PATH}" in message


def test_a_build_with_the_default_vendor_name_is_found(tmp_path: Path) -> None:
    package = tmp_path / "vllm_ascend"
    (package / "_cann_ops_custom" / "vendors" / "customize" / "op_api" / "lib").mkdir(parents=True)
    assert installed_vendor_dir(lambda: package) == package / "_cann_ops_custom" / "vendors" / "customize"
    assert installed_vendor_dir(lambda: tmp_path / "elsewhere") is None


def test_paths_the_shell_would_split_are_quoted() -> None:
    (opp, library) = export_lines(Path("/home/a user/vendors/vllm-ascend"))
    assert opp == 'export ASCEND_CUSTOM_OPP_PATH="/home/a user/vendors/vllm-ascend":${ASCEND_CUSTOM_OPP_PATH}'
    assert library == 'export LD_LIBRARY_PATH="/home/a user/vendors/vllm-ascend/op_api/lib"/:${LD_LIBRARY_PATH}'


def test_msprof_is_not_launched_when_a_selected_kernel_type_lacks_its_operators(
    vllm_ascend: Path, tmp_path: Path
) -> None:
    """The launch stops before msprof: a stand-in msprof on PATH records whether it ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ran = tmp_path / "msprof-ran"
    standin = bin_dir / "msprof"
    standin.write_text(f"#!{sys.executable}\nimport pathlib\npathlib.Path({str(ran)!r}).write_text('ran')\n")
    standin.chmod(standin.stat().st_mode | stat.S_IXUSR)

    def case(kernel_type: str, status: str) -> tuple[str, Case]:
        ref = CaseRef(f"{kernel_type}-row2", kernel_type, f"{kernel_type}.csv", 2, "sig")
        return f"test_kernels.py::test_replay[{ref.case_id}]", Case(ref, status)

    cases = [case("AddRmsNormBias", STATUS_READY), case("KvRmsNormRopeCache", STATUS_UNSUPPORTED), case("RmsNorm", STATUS_READY)]
    environ = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    output = tmp_path / "msprof_output"

    with pytest.raises(MsprofError) as info:
        external_run("launch", cases, repeat_count=10, warmup_count=3, cwd=tmp_path, output_root=output, environ=environ)

    assert str(info.value).startswith("AddRmsNormBias run vLLM-Ascend's custom operators")  # not the unsupported row's
    assert f"export ASCEND_CUSTOM_OPP_PATH={vllm_ascend}:${{ASCEND_CUSTOM_OPP_PATH}}" in str(info.value)
    assert not ran.exists() and not output.exists()
