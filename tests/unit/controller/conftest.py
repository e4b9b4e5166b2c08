"""Controller unit test set-up: this directory on sys.path, so tests import `helpers_claims` by name
(pytest runs with --import-mode=importlib, which does not add test directories)."""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
