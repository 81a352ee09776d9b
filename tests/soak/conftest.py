"""The soak's modules (soak.py, fake_vllm.py) and the e2e harness (tests/e2e) on sys.path."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for p in (HERE, HERE.parent / "e2e"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
