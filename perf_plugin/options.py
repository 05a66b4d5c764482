"""Command-line options, ini keys and environment variables, resolved into one frozen Settings.

Every option is ``--perf-<name>`` (one prefix, as pytest-benchmark's ``--benchmark-*``, so that
it cannot collide with a project's own options), with an environment variable ``PERF_<NAME>``
and an ini key ``perf_<name>`` (dashes as underscores).  The seed's tools spelled them without
the prefix (``--device``, ``--database-path``); those spellings are accepted too, as aliases
registered once the initial conftests have added their own options, and only where the name is
still free: a conftest that defines ``--device`` keeps it, and ``--perf-device`` is ours.

Precedence: command-line option > environment variable > ini key > default.
``MSMODELING_OP_REPLAY_REPEAT_COUNT`` is honoured for the repeat count, as the seed's tools did.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from perf_plugin.backends.select import BACKEND_CHOICES
from perf_plugin.replay.cache_modes import CACHE_MODES, DEFAULT_CACHE_MODE, MAX_ROTATION_COPIES
from perf_plugin.replay.placements import DEFAULT_INPUT_PLACEMENTS

GROUP_NAME = "perf"
OPTION_PREFIX = "perf-"
GROUP_DESCRIPTION = "operator performance lab"
UPDATE_MODES = ("all", "missing-only")
COVERAGE_WEIGHTS = ("rows", "time")
LOG_CAPTURE_MODES = ("auto", "on")


@dataclass(frozen=True)
class OptionSpec:
    name: str  # the long option without dashes, e.g. "repeat-count"
    help: str
    default: Any = None
    kind: Callable[[str], Any] = str
    choices: tuple[str, ...] | None = None
    flag: bool = False
    env_aliases: tuple[str, ...] = ()

    @property
    def field(self) -> str:
        """The Settings attribute."""
        return self.name.replace("-", "_")

    @property
    def dest(self) -> str:
        return "perf_" + self.field

    @property
    def option(self) -> str:
        """The command-line option: ``--perf-<name>``."""
        return f"--{OPTION_PREFIX}{self.name}"

    @property
    def alias(self) -> str:
        """The seed's spelling, accepted where no other plugin or conftest took it."""
        return f"--{self.name}"

    @property
    def env(self) -> str:
        return "PERF_" + self.name.replace("-", "_").upper()

    @property
    def ini(self) -> str:
        return "perf_" + self.name.replace("-", "_")


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{text!r} is not a fraction between 0 and 1")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"{text!r} is not a positive integer")
    return value


def _positive_float(text: str) -> float:
    if not (value := float(text)) > 0:
        raise ValueError(f"{text!r} is not a positive number")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"{text!r} is negative")
    return value


# The fast_p thresholds a candidate run reports (KernelBench: fast_0 is the correctness rate).
DEFAULT_THRESHOLDS = (0.0, 1.0, 1.5, 2.0)


def parse_thresholds(text: str) -> tuple[float, ...]:
    """``"0,1,1.5,2"`` -> (0.0, 1.0, 1.5, 2.0); ValueError for anything else."""
    values = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        value = float(part)
        if not value >= 0 or value == float("inf"):
            raise ValueError(f"fast_p threshold {part!r} is not a finite number >= 0")
        values.append(value)
    if not values:
        raise ValueError(f"{text!r} names no fast_p threshold")
    return tuple(sorted(set(values)))


def _port(text: str) -> int:
    value = int(text)
    if not 0 < value < 65536:
        raise ValueError(f"{text!r} is not a TCP port (1-65535)")
    return value


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"{text!r} is not a boolean")


OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("database-path", "database directory to replay (wins over the derived path)"),
    OptionSpec("database-root", "root of derived database paths (default: <rootdir>/database/data)"),
    OptionSpec("device", "device directory name (default: derived from the hardware; Ascend: ATLAS_800_A3_752T_128G_DIE)"),
    OptionSpec("vllm-version", "vLLM version for the version directory (e.g. 0.18.0)"),
    OptionSpec("torch-version", "torch version for the version directory (default: the running torch)"),
    OptionSpec("cann-version", "CANN version for the version directory (Ascend, e.g. 8.5)"),
    OptionSpec("cuda-version", "CUDA version for the version directory (default: torch.version.cuda)"),
    OptionSpec("backend", "device backend to replay on", "auto", choices=BACKEND_CHOICES),
    OptionSpec("update-mode", "write-back mode: all rows, or only rows with no duration", "all", choices=UPDATE_MODES),
    OptionSpec("prune-empty-duration-rows", "remove rows that still have no valid duration after write-back", False, _bool, flag=True),
    OptionSpec("repeat-count", "timed repeats per case", 30, _positive_int, env_aliases=("MSMODELING_OP_REPLAY_REPEAT_COUNT",)),
    OptionSpec("warmup-count", "untimed warm-up runs per case", 5, _non_negative_int),
    OptionSpec("prof-path", "existing msprof PROF_* directory to read instead of launching msprof (NPU)"),
    OptionSpec("replay-coverage-min", "fail the run if fewer than this fraction of selected rows replay and pass", None, _fraction),
    OptionSpec(
        "replay-coverage-weight",
        "what --replay-coverage-min counts: rows, or the rows' profiled time (Profiling Average Duration(us) "
        "x Profiling Count: the share of a profiled model's kernel time the run measures). By time, rows without "
        "a profiled time weigh nothing (the coverage line says how many); where no selected row has one, coverage "
        "by time cannot be measured and the gate fails (exit 1) saying so, rather than counting rows",
        "rows",
        choices=COVERAGE_WEIGHTS,
    ),
    OptionSpec("profile-batch-size", "cases per in-process profiler session (results reach the controller per batch)", 32, _positive_int),
    OptionSpec("no-writeback", "measure and report, but leave the database CSVs unchanged", False, _bool, flag=True),
    OptionSpec("seed", "seed of the random inputs", 0, _non_negative_int),
    OptionSpec(
        "cache-mode",
        "how repeats meet the device cache: warm (same inputs), cold (cache flushed outside the timed range "
        "before every repeat), rotate (cycle through input copies larger than twice the cache), "
        "produced (cache evicted, then the inputs but the model's weights, and but those the row's profile shows "
        "were read from memory, rewritten in place before every repeat: as a model's previous kernel leaves them), idle (cache evicted, each repeat launched once the device is idle: as a "
        "host-bound model phase launches), auto (produced on CUDA, warm elsewhere: measured closest to "
        "in-model durations)",
        DEFAULT_CACHE_MODE,
        choices=CACHE_MODES,
    ),
    OptionSpec(
        "rotate-max-copies",
        "rotate mode: at most this many input copies (smaller inputs rotate within the cache and stay warm)",
        MAX_ROTATION_COPIES,
        _positive_int,
    ),
    OptionSpec("input-placements", "cold, idle and produced modes: the repeats cycle through this many copies of the "
               "inputs at distinct device addresses (fewer where they would take over a quarter of the free device "
               "memory; 1: the inputs as built)", DEFAULT_INPUT_PLACEMENTS, _positive_int),
    OptionSpec("repeat-markers", "delimit every timed repeat (a marker kernel on CUDA, a labelled range on the CPU) "
               "instead of the case's repeats as a whole (for ops whose kernel or operator sequence varies from call "
               "to call; costs profiler time per repeat)", False, _bool, flag=True),
    OptionSpec("lock-timeout", "seconds to wait for another session's database lock", 60.0, float),
    OptionSpec("rank-timeout", "under torchrun: seconds a rank may go without progress (no case started or finished, "
               "no step of its session end) while another waits on it for its results; then the waiting rank names "
               "it and the step it was at, writes what arrived, and the run fails", 300.0, _positive_float),
    OptionSpec("isolate", "run the cases in a child process (one pytest-xdist worker) that is replaced when a case "
               "takes it down, so that a crash costs only that case (with -n N the workers already are such processes)",
               False, _bool, flag=True),
    OptionSpec(
        "progress-interval",
        "seconds between progress lines (tests done of total, rate, ETA, per xdist worker); 0: none",
        30.0,
        float,
    ),
    OptionSpec(
        "results-out",
        "also write what this run measured to this file (a result journal), for perfdb merge into another "
        "copy of the database",
    ),
    OptionSpec(
        "shard",
        "replay shard I of N (I from 0: every N-th replay case from the I-th, in database order), for "
        "schedulers that start one pytest per host; under torchrun the ranks shard themselves",
    ),
    OptionSpec(
        "case-ids-file",
        "replay only the cases whose ids this file lists, one a line (how a run re-measures the cases a "
        "crashed xdist worker took with it)",
    ),
    OptionSpec(
        "replay-log-capture",
        "pytest's per-test log capture in runs of replay cases only: auto (off unless a --log-* option or "
        "ini key asks for logging; it costs ~0.35 ms per case), on (always kept)",
        "auto",
        choices=LOG_CAPTURE_MODES,
    ),
    # The seed's msprof replay config of DispatchFFNCombine (perf_plugin.run.ep_launch): on an NPU, rows of
    # this EP Size run in a msprof session of their own under torchrun, one process per expert-parallel rank.
    OptionSpec("dispatch-ffn-combine-ep-size", "DispatchFFNCombine rows of this EP Size are replayed (on an NPU) in a msprof "
               "session of their own under torchrun, every rank running every such row", 16, _positive_int),
    OptionSpec("dispatch-ffn-combine-nproc-per-node", "that session's torchrun --nproc-per-node (default: EP size / nnodes)",
               None, _positive_int),
    OptionSpec("dispatch-ffn-combine-nnodes", "that session's torchrun --nnodes", 1, _positive_int),
    OptionSpec("dispatch-ffn-combine-node-rank", "that session's torchrun --node-rank (this host's)", 0, _non_negative_int),
    OptionSpec("dispatch-ffn-combine-master-addr", "that session's torchrun --master-addr", "127.0.0.1"),
    OptionSpec("dispatch-ffn-combine-master-port", "that session's torchrun --master-port", 29500, _port),
    OptionSpec(
        "candidate",
        "Python file registering candidate kernels (@candidate(\"<kernel type>\")): each selected row of "
        "those kernel types is judged against its replay (correctness, speedup, fast_p); candidate "
        "times go to the candidate report, never into the database",
    ),
    OptionSpec("candidate-checks", "candidate: input sets its outputs are checked on, each fresh", 5, _positive_int),
    OptionSpec(
        "candidate-baseline",
        "candidate: baseline_time.json of reference times, read and extended (default: "
        "<rootdir>/candidate_runs/baseline_time.json)",
    ),
    OptionSpec("candidate-log-dir", "candidate: trace files and run JSON (default: <rootdir>/candidate_runs/<file stem>)"),
    OptionSpec(
        "candidate-fast-p",
        "candidate: fast_p thresholds, comma-separated speedups (fast_0 is the correctness rate)",
        DEFAULT_THRESHOLDS,
        parse_thresholds,
    ),
)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup(GROUP_NAME, GROUP_DESCRIPTION)
    for spec in OPTIONS:
        choices = f" ({', '.join(spec.choices)}; default {spec.default})" if spec.choices else ""
        help_text = f"{spec.help}{choices} [env {spec.env}; ini {spec.ini}]"
        group.addoption(spec.option, help=help_text, **_argument(spec))
        parser.addini(spec.ini, help=spec.help, default=None)


def _argument(spec: OptionSpec) -> dict[str, Any]:
    if spec.flag:
        return {"action": "store_true", "default": None, "dest": spec.dest}
    metavar = spec.name.upper().replace("-", "_")
    return {"action": "store", "default": None, "dest": spec.dest, "choices": spec.choices, "metavar": metavar}


def add_free_aliases(parser: pytest.Parser) -> list[str]:
    """Register the unprefixed spellings no other option uses (after the initial conftests'
    options: a project's own ``--device`` wins); returns those left to their owners."""
    taken = {name for option in _all_options(parser) for name in option.names()}
    group = parser.getgroup(GROUP_NAME, GROUP_DESCRIPTION)
    shadowed = []
    for spec in OPTIONS:
        if spec.alias in taken:
            shadowed.append(spec.alias)
            continue
        group.addoption(spec.alias, help=argparse.SUPPRESS, **_argument(spec))  # listed once, as --perf-*
    return shadowed


def _all_options(parser: pytest.Parser) -> list[Any]:
    # pytest keeps no public list of the registered options; these two attributes have held
    # them since pytest 3 (the anonymous group and the named ones)
    groups = [parser._anonymous, *parser._groups]  # noqa: SLF001
    return [option for group in groups for option in group.options]


@dataclass(frozen=True)
class Settings:
    database_path: Path | None
    database_root: Path
    device: str | None
    vllm_version: str | None
    torch_version: str | None
    cann_version: str | None
    cuda_version: str | None
    backend: str
    update_mode: str
    prune_empty_duration_rows: bool
    repeat_count: int
    warmup_count: int
    prof_path: Path | None
    replay_coverage_min: float | None
    replay_coverage_weight: str
    profile_batch_size: int
    no_writeback: bool
    seed: int
    cache_mode: str
    rotate_max_copies: int
    repeat_markers: bool
    lock_timeout: float
    replay_log_capture: str
    case_ids_file: Path | None = None
    isolate: bool = False
    input_placements: int = DEFAULT_INPUT_PLACEMENTS
    shard: str | None = None
    progress_interval: float = 30.0
    rank_timeout: float = 300.0
    results_out: Path | None = None
    candidate: Path | None = None
    candidate_checks: int = 5
    candidate_baseline: Path | None = None
    candidate_log_dir: Path | None = None
    candidate_fast_p: tuple[float, ...] = DEFAULT_THRESHOLDS
    dispatch_ffn_combine_ep_size: int = 16
    dispatch_ffn_combine_nproc_per_node: int | None = None
    dispatch_ffn_combine_nnodes: int = 1
    dispatch_ffn_combine_node_rank: int = 0
    dispatch_ffn_combine_master_addr: str = "127.0.0.1"
    dispatch_ffn_combine_master_port: int = 29500


def _raw_value(config: pytest.Config, spec: OptionSpec) -> tuple[Any, str] | None:
    value = config.getoption(spec.dest, default=None)
    if value is not None:
        return value, spec.option
    for env_name in (spec.env, *spec.env_aliases):
        if os.environ.get(env_name, "") != "":
            return os.environ[env_name], env_name
    ini_value = config.getini(spec.ini)
    if ini_value not in (None, "", []):
        return ini_value, f"ini {spec.ini}"
    return None


def resolve_settings(config: pytest.Config) -> Settings:
    """Resolve every option; a bad value raises pytest.UsageError naming where it came from."""
    values: dict[str, Any] = {}
    for spec in OPTIONS:
        raw = _raw_value(config, spec)
        if raw is None:
            values[spec.field] = spec.default
            continue
        value, source = raw
        if isinstance(value, str) or not spec.flag:
            try:
                value = spec.kind(value) if isinstance(value, str) else value
            except ValueError as exc:
                raise pytest.UsageError(f"{source}: {exc}") from None
            if spec.choices and value not in spec.choices:
                raise pytest.UsageError(f"{source}: {value!r} is not one of {', '.join(spec.choices)}")
        values[spec.field] = value
    root = values["database_root"]
    values["database_root"] = Path(root) if root else Path(config.rootpath) / "database" / "data"
    for key in ("database_path", "prof_path", "case_ids_file", "results_out", "candidate", "candidate_baseline", "candidate_log_dir"):
        if values[key]:
            values[key] = Path(values[key])
    for spec in OPTIONS:
        if spec.flag:  # store_true options arrive as True/None, env and ini values as parsed booleans
            values[spec.field] = bool(values[spec.field])
    _check_ep_launch(values)
    return Settings(**values)


def _check_ep_launch(values: dict[str, Any]) -> None:
    """The expert-parallel launch is one torchrun of EP size ranks: nnodes x nproc-per-node."""
    prefix = "--perf-dispatch-ffn-combine-"
    ep, nnodes, nproc = (values[f"dispatch_ffn_combine_{k}"] for k in ("ep_size", "nnodes", "nproc_per_node"))
    if nproc is None:
        if ep % nnodes:
            raise pytest.UsageError(f"{prefix}ep-size {ep} is not a multiple of {prefix}nnodes {nnodes}")
        values["dispatch_ffn_combine_nproc_per_node"] = nproc = ep // nnodes
    if nnodes * nproc != ep:
        raise pytest.UsageError(
            f"{prefix}ep-size {ep} needs nnodes x nproc-per-node = {ep} ranks; "
            f"got {prefix}nnodes {nnodes} x {prefix}nproc-per-node {nproc}"
        )
    node_rank = values["dispatch_ffn_combine_node_rank"]
    if node_rank >= nnodes:
        raise pytest.UsageError(f"{prefix}node-rank {node_rank} is not below {prefix}nnodes {nnodes}")
