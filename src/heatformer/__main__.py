"""``python -m heatformer`` (also what ``torchrun -m heatformer`` runs)."""

import sys

from heatformer._main import main

sys.exit(main())
