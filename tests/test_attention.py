"""The relative-attention bands: the diagonals -w..w of a score matrix read out and added in
place, checked entry by entry against their definition for every length around the edge
cases (shorter than the band, the band just fitting, long), for the whole matrix and for
blocks of its rows (as the encoder's row blocks use them)."""

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
    for cuts in ([0, t], [0, t // 2, t], [0, 1, min(t, w + 1), t], [0, max(0, t - w - 1), t]):
        for a, b in zip(cuts, cuts[1:]):
            if b > a:
                assert torch.equal(_diagonals(m[:, a:b].contiguous(), w, a),
                                   expected_read[:, a:b]), (a, b)
    assert torch.equal(_diagonals(m, w), expected_read)
    for a, b in ((0, t // 2), (t // 2, t)):
        block = m[:, a:b].clone()
        _add_diagonals(block, band[:, a:b], w, a)
        assert torch.equal(block, expected_sum[:, a:b]), (a, b)
    _add_diagonals(m, band, w)
    assert torch.equal(m, expected_sum)
