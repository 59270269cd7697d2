"""The lab: the study harness beside the library (``pip install 'heatformer[lab]'``).

It trains and compares the library's models on built-in tasks and reports what changed; the
library (:mod:`heatformer.graph_ops`, :mod:`~heatformer.models`, :mod:`~heatformer.analysis`,
:mod:`~heatformer.viz`, :mod:`~heatformer.integrations`) never imports it. Import what you
need from its modules; this package imports none of them, so the command line reads its
option tables without loading torch.

- :mod:`heatformer.lab.tasks` -- :data:`~heatformer.lab.tasks.TASKS` (a
  :class:`~heatformer.registry.Registry`; :func:`~heatformer.lab.tasks.register_task` adds one),
  what a task is (:class:`~heatformer.lab.tasks.Task`, its options made with
  :func:`~heatformer.lab.tasks.option`), and the built-in tasks: ``chars``, ``digits``,
  ``recall``, ``stdlib``, ``masked`` and the synthetic benchmarks (``mqar``, ``induction``,
  ``selective_copy``, ``parity``, ``listops``, ``passkey``).
- :mod:`heatformer.lab.spec` -- :class:`~heatformer.lab.spec.CompareSpec`, everything that
  determines a comparison's numbers, validated once; :mod:`heatformer.lab.presets`, the named
  settings of ``--preset``.
- :mod:`heatformer.lab.compare` -- :func:`~heatformer.lab.compare.run_compare` (every head
  schedule × seed, resumably; ``results.json``, ``results.csv``, plots) and
  :func:`~heatformer.lab.compare.analyze`.
- :mod:`heatformer.lab.trainer` -- :func:`~heatformer.lab.trainer.train_run`, one run; its
  parts: :mod:`~heatformer.lab.step` (one optimizer step), :mod:`~heatformer.lab.stop`
  (Ctrl-C and SIGTERM with the last completed step saved), :mod:`~heatformer.lab.resume` (a
  run's state, new or restored from its checkpoint).
- :mod:`heatformer.lab.sweep`, :mod:`heatformer.lab.tuning` -- sweeps over head schedules;
  optimiser sweeps with each schedule's setting selected on validation data.
- :mod:`heatformer.lab.report` -- statistics over seeds, corrected tests, tables and plots.
- :mod:`heatformer.lab.preflight` -- memory estimates and timed steps before a run.
- :mod:`heatformer.lab.cli` -- the ``heatformer`` command; :mod:`heatformer.lab.demo` -- the
  teaching demo behind ``heatformer demo``.
"""
