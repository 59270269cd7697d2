r"""The window graph kind: a sliding window with global tokens, in ``O(N w)``.

One kind in one folder, its modules in dependency order:

- :mod:`~heatformer.graph_ops.window.layout` -- the one predicate of the edges
  (:func:`~heatformer.graph_ops.window.layout.window_allowed`), the blocks and slabs derived
  from it (:class:`~heatformer.graph_ops.window.layout.WindowLayout`), the checks of a window
  graph's arguments;
- :mod:`~heatformer.graph_ops.window.kernels` -- ``P x`` on the slabs as one autograd function
  with a recomputing backward, and the gradient buffers a graph's products share;
- :mod:`~heatformer.graph_ops.window.flex` -- the FlexAttention backend (a block mask from the
  window's arithmetic);
- :mod:`~heatformer.graph_ops.window.graph` -- :class:`WindowGraph`, the graph protocol on
  them;
- :mod:`~heatformer.graph_ops.window.halo`, :mod:`~heatformer.graph_ops.window.shard` -- a
  sequence split over processes: the messages, and a rank's block (:class:`SequenceShard`);
- :mod:`~heatformer.graph_ops.window.builder` -- the kind for layers,
  ``"window[w=..,global=..]"`` (:class:`~heatformer.graph_ops.window.builder.WindowBuilder`,
  registered in :data:`~heatformer.graph_ops.GRAPHS` by :mod:`~heatformer.graph_ops.builders`);
- :mod:`~heatformer.graph_ops.window.sharding` -- the window kind over a split sequence
  (:class:`~heatformer.graph_ops.window.sharding.ShardedWindowBuilder`,
  :class:`~heatformer.graph_ops.window.sharding.ShardedWindowGraph`; made by
  :func:`~heatformer.graph_ops.shard_graph`).

This ``__init__`` exports the graph and the shard; import the two builders from their modules.
"""

from heatformer.graph_ops.window.graph import WindowGraph, check_qk
from heatformer.graph_ops.window.shard import SequenceShard

__all__ = ["BACKEND", "SequenceShard", "WindowGraph", "check_qk"]

#: The engine of :meth:`WindowGraph.propagate`, read at every call: ``"kernels"`` (the window
#: kernels of :mod:`~heatformer.graph_ops.window.kernels`, every device), ``"flex"``
#: (FlexAttention on a block mask built from the window's arithmetic,
#: :mod:`~heatformer.graph_ops.window.flex`; forward only on the CPU in torch 2.13) or
#: ``"auto"``: FlexAttention on CUDA where it applies
#: (:func:`~heatformer.graph_ops.window.flex.use_flex`), the kernels elsewhere. Transpose
#: products, degrees and top-k always use the window kernels.
BACKEND = "auto"
