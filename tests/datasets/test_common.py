"""What every generator promises: the same seed gives the same tensors, another seed other
ones, global RNG state is untouched, and the tensors are int64 on the CPU."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from heatformer import datasets

CALLS: dict[str, Callable[[int], tuple[torch.Tensor, torch.Tensor]]] = {
    "mqar": lambda seed: datasets.mqar(256, 8, 64, seed, num_kv_pairs=4),
    "induction": lambda seed: datasets.induction(16, 8, 64, seed, num_triggers=3),
    "selective_copy": lambda seed: datasets.selective_copy(16, 8, 64, seed),
    "parity": lambda seed: datasets.parity(8, 64, seed),
    "majority": lambda seed: datasets.majority(8, 64, seed),
    "passkey": lambda seed: datasets.passkey(64, 8, seed),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_seeded_and_deterministic(name: str) -> None:
    torch.manual_seed(123)
    np.random.seed(123)  # noqa: NPY002 (the global state the generators must not touch)
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()  # noqa: NPY002
    inputs, labels = CALLS[name](5)
    assert torch.equal(torch.get_rng_state(), torch_state)  # global states untouched
    assert np.array_equal(np.random.get_state()[1], numpy_state[1])  # noqa: NPY002
    again = CALLS[name](5)
    assert torch.equal(inputs, again[0]) and torch.equal(labels, again[1])
    torch.manual_seed(999)  # another global seed changes nothing
    assert torch.equal(inputs, CALLS[name](5)[0])
    other = CALLS[name](6)
    assert not torch.equal(inputs, other[0])
    for tensor in (inputs, labels):
        assert tensor.dtype == torch.int64 and tensor.device.type == "cpu"
        assert tensor.shape[0] == 8
    scored = labels != -100
    assert scored.any() and (labels[scored] >= 0).all()


def test_public_names() -> None:
    assert set(datasets.__all__) >= set(CALLS) | {"BIT_VOCAB", "PASSKEY_VOCAB"}
    assert datasets.BIT_VOCAB == ("0", "1", "=")
