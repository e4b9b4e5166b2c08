"""Debian packages that tests need, installed when missing the way the suite installs them: as root with apt-get."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

_INSTALL_SECONDS = 900


def ensure(packages: Sequence[str], *, commands: Sequence[str]) -> bool:
    """True when every command is on PATH, after `apt-get install`ing the packages if one is missing.

    Installs only as root with apt-get, retrying once after `apt-get update`; a failure is left to
    the caller's one-line skip. Idempotent: with the commands present it runs nothing.
    """
    if all(shutil.which(command) for command in commands):
        return True
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return False
    install = ["apt-get", "install", "-y", "-q", *packages]
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in ([install], [["apt-get", "update", "-q"], install]):
        for argv in step:
            done = subprocess.run(argv, capture_output=True, timeout=_INSTALL_SECONDS, env=environment, check=False)
            if done.returncode != 0:
                break
        if all(shutil.which(command) for command in commands):
            return True
    return False
