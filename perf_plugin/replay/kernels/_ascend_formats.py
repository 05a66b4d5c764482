"""Ascend's private storage formats of 4-D tensors, as shapes and as portable rearrangements.

A profile records a tensor in the format the kernel read it in.  Two of them hold NCHW data:

* ``NC1HWC0`` (5HD) ``[N, C1, H, W, C0]``: channels split in ``C1`` blocks of ``C0`` (8 for
  FLOAT, 16 for 2-byte types and for the ``NC1HWC0:1`` sub-format of FLOAT rows, 32 for INT8),
  channels padded with zeros to ``C1 * C0``;
* ``FRACTAL_Z`` (a convolution weight) ``[C1 * Kh * Kw, N1, N0, C0]``: output channels in ``N1``
  blocks of ``N0 = 16``, input channels in ``C1`` blocks of ``C0``, both zero-padded.

The CANN operator documentation gives these layouts; a real Level1 profile's rows
(``tests/fixtures/ascend/kernel_details_level1.csv``) fit them: ``[64,3,11,11]`` NCHW becomes
``[121,4,16,8]`` FRACTAL_Z (C1 = 1, 11*11, N1 = 4, C0 = 8).  The functions below turn one into
the other on any torch device (a padded copy and a permutation, what TransData does), and say
which NCHW shape a 5HD or FRACTAL_Z shape holds where the row's other side tells the channels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

Shape = tuple[int, ...]
N0 = 16
NCHW_LIKE = frozenset({"NCHW", "ND"})


def base_format(fmt: str) -> str:
    """``NC1HWC0:1`` -> ``NC1HWC0`` (the sub-format changes C0, which the shape carries)."""
    return fmt.split(":", 1)[0]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def fits_5hd(nchw: Shape, five: Shape) -> bool:
    n, c, h, w = nchw
    return len(five) == 5 and five[0] == n and five[2:4] == (h, w) and five[1] == ceil_div(c, five[4])


def fits_fractal_z(nchw: Shape, fz: Shape) -> bool:
    n, c, kh, kw = nchw
    if len(fz) != 4:
        return False
    c1kk, n1, n0, c0 = fz
    return n0 == N0 and n1 == ceil_div(n, N0) and c1kk == ceil_div(c, c0) * kh * kw


def to_5hd(x: "torch.Tensor", c0: int) -> "torch.Tensor":
    """NCHW -> ``[N, C1, H, W, C0]``, channels zero-padded."""
    import torch

    n, c, h, w = x.shape
    c1 = ceil_div(c, c0)
    padded = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, c1 * c0 - c)) if c1 * c0 != c else x
    return padded.reshape(n, c1, c0, h, w).permute(0, 1, 3, 4, 2).contiguous()


def from_5hd(x: "torch.Tensor", channels: int) -> "torch.Tensor":
    """``[N, C1, H, W, C0]`` -> NCHW with ``channels`` channels (the padding dropped)."""
    n, c1, h, w, c0 = x.shape
    return x.permute(0, 1, 4, 2, 3).reshape(n, c1 * c0, h, w)[:, :channels].contiguous()


def to_fractal_z(w: "torch.Tensor", c0: int) -> "torch.Tensor":
    """NCHW weight ``[N, C, Kh, Kw]`` -> ``[C1*Kh*Kw, N1, 16, C0]``, both channel axes zero-padded."""
    import torch

    n, c, kh, kw = w.shape
    n1, c1 = ceil_div(n, N0), ceil_div(c, c0)
    padded = torch.nn.functional.pad(w, (0, 0, 0, 0, 0, c1 * c0 - c, 0, n1 * N0 - n))
    blocks = padded.reshape(n1, N0, c1, c0, kh, kw).permute(2, 4, 5, 0, 1, 3)
    return blocks.reshape(c1 * kh * kw, n1, N0, c0).contiguous()


def from_fractal_z(fz: "torch.Tensor", nchw: Shape) -> "torch.Tensor":
    """``[C1*Kh*Kw, N1, 16, C0]`` -> the NCHW weight ``nchw`` (the padding dropped)."""
    n, c, kh, kw = nchw
    _, n1, n0, c0 = fz.shape
    c1 = ceil_div(c, c0)
    blocks = fz.reshape(c1, kh, kw, n1, n0, c0).permute(3, 4, 0, 5, 1, 2)
    return blocks.reshape(n1 * n0, c1 * c0, kh, kw)[:n, :c].contiguous()
