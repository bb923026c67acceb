"""``python -m inferd.handoff.worker``: the frontend worker process (:mod:`inferd.handoff.worker.process`)."""

import sys

from inferd.handoff.worker.process import main

sys.exit(main())
