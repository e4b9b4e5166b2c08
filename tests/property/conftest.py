"""Property-test set-up: the hypothesis profiles.

Profiles: `dractl-ci` (default: derandomized, no deadline, no example database, so a run is
reproducible and writes nothing) and `dractl-deep` (random, ten times the examples) chosen
with DRACTL_HYPOTHESIS_PROFILE=dractl-deep. Tests take the profile as their parent settings
(`support.strategies.settings_for`), so loading it does not change other suites' hypothesis
settings. The helpers (`support.oracle`, `support.strategies`) import by name through
`pythonpath = ["tests"]` in pyproject.toml.
"""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "dractl-ci",
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dractl-deep", parent=settings.get_profile("dractl-ci"), derandomize=False)
