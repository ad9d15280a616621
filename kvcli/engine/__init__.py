"""kvcli's inference engine.

Importing it sets ``OMP_WAIT_POLICY=PASSIVE`` (unless the user chose a policy) before torch
loads: small matmuls run on NumPy's OpenBLAS pool next to torch's OpenMP pool, and spinning
OpenMP threads on a 2-core machine made decode steps 4-20x slower (measured in kvcli bench).
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
