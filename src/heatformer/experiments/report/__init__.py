"""Aggregate run records into the comparison report: numbers, table, CSV and plots.

Three modules, one concern each; every public name is importable from here:

- :mod:`~heatformer.experiments.report.stats` -- statistics over seeds (:func:`mean_std`,
  :func:`t_interval`), paired differences against the baseline (:func:`paired_difference`,
  :func:`add_paired`) and the per-configuration summary (:func:`aggregate`);
- :mod:`~heatformer.experiments.report.tables` -- the text: the terminal tables
  (:func:`format_table`, :func:`format_paired_table`), ``results.csv`` (:func:`write_csv`)
  and the environment facts of ``results.json`` (:func:`environment`);
- :mod:`~heatformer.experiments.report.figures` -- the PNG figures (:func:`plot_report`) and
  the sweeps' figures (:func:`plot_sweeps`; matplotlib imported only there, only when
  plotting).

Nothing here prints: :func:`format_table` returns the table as a string.
"""

from __future__ import annotations

from heatformer.experiments.report.figures import plot_report, plot_sweeps
from heatformer.experiments.report.stats import (
    add_paired,
    aggregate,
    mean_std,
    paired_difference,
    t_interval,
)
from heatformer.experiments.report.tables import (
    environment,
    format_paired_table,
    format_table,
    write_csv,
)

__all__ = [
    "add_paired",
    "aggregate",
    "environment",
    "format_paired_table",
    "format_table",
    "mean_std",
    "paired_difference",
    "plot_report",
    "plot_sweeps",
    "t_interval",
    "write_csv",
]
