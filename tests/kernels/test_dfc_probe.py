"""DispatchFFNCombine's constraint probe: which rows an EP group can run, decided per row without a device.

Rows are in the database format of ``DispatchFFNCombine.csv`` (7 inputs, 2 outputs, the
``EP Size`` column), the layout msmodeling's replay parses; the window rule is the kernel
tiling's (vllm-ascend ``dispatch_ffn_combine_tiling.cpp``).  No NPU ran any of this.
"""

from __future__ import annotations

import re

import pytest

from perf_plugin.replay.base import CaseBuildError
from perf_plugin.replay.kernels._dfc_probe import (
    DEFAULT_HCCL_BUFFSIZE_MB,
    HCCL_BUFFSIZE_ENV,
    DfcShape,
    dfc_blocker,
    hccl_window_mb,
    window_bytes_needed,
)
from tests.kernels.support import kernel_row, replay_of
from tests.kernels.test_dispatch_ffn_combine import DFC, DSV3, SMALL, dfc_row

# DeepSeek-V3 prefill-sized: 4096 tokens x top-8 x 7168 x 3 bytes = 672 MiB of window
DSV3_PREFILL = dfc_row("4096,7168;16,7168,4096;16,2048,7168;4096,8;16,4096;16,7168;4096,8", "4096,7168;1,16")


@pytest.mark.parametrize(("value", "expected"), [
    (None, 200), ("", 200), ("1024", 1024), ("512MB", 512), (" 300", 300), ("abc", 200), ("70000", 200),
    ("65535", 65535),
])  # fmt: skip
def test_hccl_window_is_read_as_the_tiling_reads_it(value: str | None, expected: int) -> None:
    assert hccl_window_mb({} if value is None else {HCCL_BUFFSIZE_ENV: value}) == expected


def test_window_need_is_m_topk_h_times_three_plus_10_mib() -> None:
    assert window_bytes_needed(DfcShape(256, 7168, 8, 16, 1)) == 256 * 8 * 7168 * 3 + 10 * 1024 * 1024


@pytest.mark.parametrize(("shape", "group", "window", "reason"), [
    (DfcShape(24, 128, 2, 4, 1), 1, 200, None),
    (DfcShape(256, 7168, 8, 16, 16), 16, 200, None),  # DeepSeek-V3 decode at EP 16: 54 MiB of window
    (DfcShape(256, 7168, 8, 16, 16), 8, 200, "EP Size 16: the kernel dispatches tokens over an HCCL group of exactly 16"),
    (DfcShape(24, 128, 2, 4, 1), 16, 200, "this run's group has 16"),
    (DfcShape(24, 128, 8, 4, 1), 1, 200, "top-k 8 exceeds the 4 experts"),
    (DfcShape(24, 128, 8, 4, 2), 2, 200, None),  # 8 ids over 2 ranks x 4 experts
    (DfcShape(4096, 7168, 8, 16, 16), 16, 200, "= 682 MiB exceeds the HCCL window (HCCL_BUFFSIZE=200 MiB)"),
    (DfcShape(4096, 7168, 8, 16, 16), 16, 682, None),
    (DfcShape(4096, 7168, 8, 16, 16), 16, 681, "exceeds the HCCL window (HCCL_BUFFSIZE=681 MiB)"),
])  # fmt: skip
def test_blocker_per_row(shape: DfcShape, group: int, window: int, reason: str | None) -> None:
    blocker = dfc_blocker(shape, group, window)
    assert (blocker is None) if reason is None else (blocker is not None and reason in blocker)


def test_replay_check_uses_the_probe_for_a_single_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HCCL_BUFFSIZE_ENV, raising=False)
    replay = replay_of(DFC)
    replay.check(kernel_row(DFC, SMALL))
    replay.check(kernel_row(DFC, DSV3))  # EP Size 1, 54 MiB: fits the default window
    with pytest.raises(CaseBuildError, match=re.escape("torchrun --nproc_per_node=16")):
        replay.check(kernel_row(DFC, dict(DSV3, **{"EP Size": "16"})))
    with pytest.raises(CaseBuildError, match=re.escape(f"HCCL_BUFFSIZE={DEFAULT_HCCL_BUFFSIZE_MB} MiB")):
        replay.check(kernel_row(DFC, DSV3_PREFILL))
    monkeypatch.setenv(HCCL_BUFFSIZE_ENV, "1024")  # what a prefill deployment sets
    replay.check(kernel_row(DFC, DSV3_PREFILL))
