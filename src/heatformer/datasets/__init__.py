"""Seeded generators of the synthetic long-sequence benchmarks, tensors out.

One module per family of tasks:

- :mod:`~heatformer.datasets.recall` -- in-context recall: :func:`mqar` (Zoology's multi-query
  associative recall) and :func:`induction` (induction heads, as in H3 and Mamba);
- :mod:`~heatformer.datasets.sequences` -- :func:`selective_copy` (MAD-Lab, Mamba),
  :func:`parity` and :func:`majority` of bit strings;
- :mod:`~heatformer.datasets.lra` -- :func:`listops` (Long Range Arena's ListOps) and its
  :data:`LISTOPS_VOCAB`;
- :mod:`~heatformer.datasets.needle` -- :func:`passkey` retrieval at a chosen depth.

Conventions of every generator:

- It returns ``(inputs, labels)``, int64 tensors of shape ``(num_examples, length)`` on the
  CPU. ``labels[b, i]`` is the token a model should emit at position ``i`` of ``inputs[b]``
  (the next token, as a causal language model predicts it), and ``-100`` -- the default
  ``ignore_index`` of :func:`torch.nn.functional.cross_entropy` -- where nothing is scored.
- Every random draw goes through a :class:`torch.Generator` seeded with ``seed`` and made for
  the call: the same arguments give the same tensors, and global RNG state (torch's, numpy's)
  is neither read nor changed.
- Argument names and semantics are those of the published generator named in each docstring
  (Zoology, H3, MAD-Lab, LRA), so their configurations carry over; each docstring lists the
  deliberate differences.
- Bad arguments raise a :class:`TypeError` (wrong kind) or :class:`ValueError` (wrong value)
  naming the argument (the errors of :mod:`heatformer.checks`).

The library side only (torch and numpy); the lab's tasks train and score models on them.
"""

from heatformer.datasets.lra import LISTOPS_VOCAB, listops
from heatformer.datasets.needle import PASSKEY_VOCAB, passkey
from heatformer.datasets.recall import induction, mqar
from heatformer.datasets.sequences import BIT_VOCAB, majority, parity, selective_copy

__all__ = [
    "BIT_VOCAB",
    "LISTOPS_VOCAB",
    "PASSKEY_VOCAB",
    "induction",
    "listops",
    "majority",
    "mqar",
    "parity",
    "passkey",
    "selective_copy",
]
