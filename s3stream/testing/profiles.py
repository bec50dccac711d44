"""Hypothesis profiles of the kit and how a test run picks one.

``s3stream-quick`` (the default) keeps a test suite fast: few examples, short state-machine
runs, no deadline (a WAL that fsyncs is slow per step, not wrong). ``s3stream-long`` is for
nightly or pre-release runs. Choose with ``--s3stream-profile NAME``, the environment variable
``S3STREAM_HYPOTHESIS_PROFILE`` or the ini option ``s3stream_hypothesis_profile`` (in that
order of precedence); any registered Hypothesis profile name is accepted.
"""

from __future__ import annotations

import os

from . import MISSING_DEPENDENCIES_MESSAGE

try:
    import pytest
    from hypothesis import HealthCheck, settings
except ImportError as exc:  # pragma: no cover - only without the testing extras
    raise ImportError(MISSING_DEPENDENCIES_MESSAGE) from exc

from .plugin import ENV_VAR, INI_OPTION, PROFILE_KEY

__all__ = [
    "ENV_VAR",
    "INI_OPTION",
    "LONG_PROFILE",
    "PROFILE_KEY",
    "QUICK_PROFILE",
    "kit_settings",
    "register_profiles",
    "selected_profile",
]

QUICK_PROFILE = "s3stream-quick"
LONG_PROFILE = "s3stream-long"
_SUPPRESSED = [HealthCheck.too_slow, HealthCheck.data_too_large]


def register_profiles() -> None:
    """Register both profiles with Hypothesis (idempotent)."""
    settings.register_profile(
        QUICK_PROFILE,
        max_examples=20,
        stateful_step_count=20,
        deadline=None,
        database=None,
        report_multiple_bugs=False,
        suppress_health_check=_SUPPRESSED,
        print_blob=True,
    )
    settings.register_profile(
        LONG_PROFILE,
        max_examples=400,
        stateful_step_count=60,
        deadline=None,
        suppress_health_check=_SUPPRESSED,
        print_blob=True,
    )


def selected_profile(config: pytest.Config | None) -> str:
    """The profile name chosen for this run: option, environment, ini, else the quick one."""
    if config is not None:
        chosen = config.stash.get(PROFILE_KEY, None)
        if chosen:
            return chosen
    return os.environ.get(ENV_VAR) or QUICK_PROFILE


def kit_settings(config: pytest.Config | None = None) -> settings:
    """Hypothesis settings for the kit's own property tests under `config`'s chosen profile."""
    register_profiles()
    return settings.get_profile(selected_profile(config))
