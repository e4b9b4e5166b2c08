"""Property-test set-up: `tests/` and this directory on sys.path (for `oracle` and
`strategies`, since pytest runs with --import-mode=importlib) and the hypothesis profiles.

Profiles: `dractl-ci` (default: derandomized, no deadline, no example database, so a run is
reproducible and writes nothing) and `dractl-deep` (random, ten times the examples) chosen
with DRACTL_HYPOTHESIS_PROFILE=dractl-deep. Tests take the profile as their parent settings
(`strategies.settings_for`), so loading it does not change other suites' hypothesis settings.
"""

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
for path in (str(HERE.parent), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)

from hypothesis import HealthCheck, settings  # noqa: E402  (after the path set-up above)

settings.register_profile(
    "dractl-ci",
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dractl-deep", parent=settings.get_profile("dractl-ci"), derandomize=False)
