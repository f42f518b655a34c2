"""A doctor check that crashes its process the way a native library built for another CPU does."""

from __future__ import annotations

import os
import signal


def crash() -> str:
    """Die with SIGSEGV."""
    os.kill(os.getpid(), signal.SIGSEGV)
    return "unreachable"


def fine() -> str:
    """Pass."""
    return "all good"
