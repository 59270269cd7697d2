"""Aggregate run records into the comparison report: numbers, table, CSV and plots.

Seven modules, one concern each; every public name is importable from here:

- :mod:`~heatformer.lab.report.stats` -- statistics over seeds (:func:`mean_std`,
  :func:`t_interval`, :func:`one_sample_t`), paired differences against the baseline
  (:func:`paired_difference`, :func:`add_paired`) and the per-configuration summary
  (:func:`aggregate`, with the learned polynomial filters' mean, :func:`mean_filters`);
- :mod:`~heatformer.lab.report.inference` -- what a reviewer asks of those numbers:
  the trend in k (:func:`trend_test`), Holm and Benjamini-Hochberg corrections
  (:func:`holm`, :func:`benjamini_hochberg`), many-to-one comparisons against the shared
  baseline (:func:`many_to_one`), effect sizes in seed-SD units (:func:`effect_size`),
  equivalence (:func:`tost`, :func:`detectable_effect`, :func:`equivalence_statement`) and
  power (:func:`paired_power`);
- :mod:`~heatformer.lab.report.endpoints` -- the declared primary endpoints, tested
  with those (:func:`primary_endpoints`, :func:`format_endpoints`);
- :mod:`~heatformer.lab.report.contrasts` -- direct contrasts ``A - B`` between two compared
  configurations, paired and Holm-adjusted as against the baseline (:func:`paired_contrasts`,
  :func:`format_contrast_table`; :func:`parse_contrast`, :func:`check_contrasts`);
- :mod:`~heatformer.lab.report.drift` -- how far untied skip heads' ``W_S`` moved from their
  start, over seeds (:func:`mean_drift`, :func:`format_drift_table`);
- :mod:`~heatformer.lab.report.tables` -- the text: the terminal tables
  (:func:`format_table`, :func:`format_paired_table`, :func:`format_filter_table`),
  ``results.csv`` (:func:`write_csv`)
  and the environment facts of ``results.json`` (:func:`environment`);
- :mod:`~heatformer.lab.report.figures` -- the PNG figures (:func:`plot_report`) and
  the sweeps' figures (:func:`plot_sweeps`; matplotlib imported only there, only when
  plotting).

Nothing here prints: :func:`format_table` returns the table as a string.

One more, :mod:`~heatformer.lab.report.plan` -- a study plan's verdicts across comparison
folders (``evaluate_plan``, ``format_plan``), is imported from its own module, not from here:
it reads the folders through the runner's modules, which import this package.
"""

from __future__ import annotations

from heatformer.lab.report.contrasts import (
    check_contrasts,
    format_contrast_table,
    paired_contrasts,
    parse_contrast,
)
from heatformer.lab.report.drift import format_drift_table, mean_drift
from heatformer.lab.report.endpoints import format_endpoints, primary_endpoints
from heatformer.lab.report.figures import plot_report, plot_sweeps
from heatformer.lab.report.inference import (
    benjamini_hochberg,
    detectable_effect,
    effect_size,
    equivalence_statement,
    holm,
    many_to_one,
    paired_power,
    tost,
    trend_test,
)
from heatformer.lab.report.stats import (
    add_paired,
    aggregate,
    mean_filters,
    mean_std,
    one_sample_t,
    paired_difference,
    t_interval,
)
from heatformer.lab.report.tables import (
    environment,
    format_filter_table,
    format_paired_table,
    format_table,
    write_csv,
)

__all__ = [
    "add_paired",
    "aggregate",
    "benjamini_hochberg",
    "check_contrasts",
    "detectable_effect",
    "effect_size",
    "environment",
    "equivalence_statement",
    "format_contrast_table",
    "format_drift_table",
    "format_endpoints",
    "format_filter_table",
    "format_paired_table",
    "format_table",
    "holm",
    "many_to_one",
    "mean_drift",
    "mean_filters",
    "mean_std",
    "one_sample_t",
    "paired_contrasts",
    "paired_difference",
    "paired_power",
    "parse_contrast",
    "plot_report",
    "plot_sweeps",
    "primary_endpoints",
    "t_interval",
    "tost",
    "trend_test",
    "write_csv",
]
