"""Install a peer's Debian package when its binary is missing (``apt-get update`` once)."""

from __future__ import annotations

import os
import shutil
import subprocess

_updated = False


def ensure_binary(binary: str, package: str) -> str:
    """Path of ``binary``, installing ``package`` with apt-get first if needed."""
    global _updated
    found = shutil.which(binary)
    if found:
        return found
    if shutil.which("apt-get") is None:
        raise RuntimeError(f"{binary} is missing and there is no apt-get to install {package}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock = ["-o", "DPkg::Lock::Timeout=300"]
    if not _updated:
        subprocess.run(["apt-get", *lock, "update", "-qq"], check=True, env=env)
        _updated = True
    subprocess.run(["apt-get", *lock, "install", "-y", "-qq", package], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    found = shutil.which(binary)
    if not found:
        raise RuntimeError(f"installed {package} but {binary} is still not on PATH")
    return found
