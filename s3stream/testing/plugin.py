"""The pytest plugin of the conformance kit, loaded through the ``pytest11`` entry point.

It registers the Hypothesis profiles ``s3stream-quick`` and ``s3stream-long`` and picks the one
the kit's state machines run under: ``--s3stream-profile NAME``, else the environment variable
``S3STREAM_HYPOTHESIS_PROFILE``, else the ini option ``s3stream_hypothesis_profile``, else
``s3stream-quick``. A profile chosen explicitly (by any of the three) is also loaded as
Hypothesis' default for the whole run; without a choice, other Hypothesis tests keep their own
settings. Without Hypothesis installed the plugin does nothing, so it never breaks a pytest run.
"""

from __future__ import annotations

import os

import pytest

__all__ = [
    "ENV_VAR",
    "INI_OPTION",
    "PROFILE_KEY",
    "pytest_addoption",
    "pytest_configure",
    "pytest_report_header",
]

ENV_VAR = "S3STREAM_HYPOTHESIS_PROFILE"
INI_OPTION = "s3stream_hypothesis_profile"
#: The profile name chosen for this run, kept in ``config.stash``.
PROFILE_KEY = pytest.StashKey[str]()

# Plain asserts in the kit then report their operands like asserts in test modules do.
pytest.register_assert_rewrite("s3stream.testing.wal", "s3stream.testing.objectstore")


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--s3stream-profile`` and the ``s3stream_hypothesis_profile`` ini option."""
    group = parser.getgroup("s3stream", "s3stream conformance kit")
    group.addoption(
        "--s3stream-profile",
        dest="s3stream_profile",
        default=None,
        metavar="NAME",
        help="Hypothesis profile for s3stream.testing (s3stream-quick, s3stream-long, or any "
        f"registered profile); also ${ENV_VAR}",
    )
    parser.addini(INI_OPTION, "Hypothesis profile for s3stream.testing", default="")


def pytest_configure(config: pytest.Config) -> None:
    """Register the profiles, choose one, and load it if it was asked for explicitly."""
    from_option = config.getoption("s3stream_profile", default=None)
    explicit = from_option or os.environ.get(ENV_VAR) or str(config.getini(INI_OPTION)) or None
    try:
        from hypothesis import settings
        from hypothesis.errors import InvalidArgument

        from .profiles import QUICK_PROFILE, register_profiles
    except ImportError:
        if from_option:
            raise pytest.UsageError(
                "--s3stream-profile needs hypothesis: pip install 's3stream[testing]'"
            ) from None
        return
    register_profiles()
    name = explicit or QUICK_PROFILE
    try:
        settings.get_profile(name)
    except InvalidArgument:
        raise pytest.UsageError(
            f"unknown Hypothesis profile {name!r} for s3stream.testing "
            "(s3stream registers 's3stream-quick' and 's3stream-long')"
        ) from None
    config.stash[PROFILE_KEY] = name
    if explicit:
        settings.load_profile(name)


def pytest_report_header(config: pytest.Config) -> str | None:
    """Say which profile the kit runs under."""
    name = config.stash.get(PROFILE_KEY, None)
    return None if name is None else f"s3stream.testing: hypothesis profile {name}"
