"""``python -m heatformer`` (also what ``torchrun -m heatformer`` runs)."""

import sys

from heatformer.lab.command import main

sys.exit(main())
