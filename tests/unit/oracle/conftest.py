"""Put `tests/` on sys.path so the oracle's own tests import `oracle` like the property tests do."""

import pathlib
import sys

TESTS = str(pathlib.Path(__file__).resolve().parents[2])
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
