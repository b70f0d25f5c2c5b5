"""The relative-attention bands: the diagonals -w..w of a score matrix read out and added in
place, checked entry by entry against their definition for every length around the edge
cases (shorter than the band, the band just fitting, long)."""

from __future__ import annotations

import pytest
import torch

from tts.vits.enc_p import _add_diagonals, _diagonals


@pytest.mark.parametrize("t", [1, 2, 7, 8, 9, 10, 17, 40])
def test_diagonals_read_and_add_what_they_define(t: int) -> None:
    w, h = 4, 2
    gen = torch.Generator().manual_seed(t)
    m = torch.randn(h, t, t, generator=gen)
    band = torch.randn(h, t, 2 * w + 1, generator=gen)
    expected_read = torch.zeros(h, t, 2 * w + 1)
    expected_sum = m.clone()
    for i in range(t):
        for j in range(2 * w + 1):
            col = i + j - w
            if 0 <= col < t:
                expected_read[:, i, j] = m[:, i, col]
                expected_sum[:, i, col] += band[:, i, j]
    assert torch.equal(_diagonals(m, w), expected_read)
    _add_diagonals(m, band, w)
    assert torch.equal(m, expected_sum)
