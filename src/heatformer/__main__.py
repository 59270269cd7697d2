"""``python -m heatformer`` (also what ``torchrun -m heatformer`` runs)."""

import sys

from heatformer.cli import main

sys.exit(main())
