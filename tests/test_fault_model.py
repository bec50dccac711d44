"""Property test: one client under object-store and WAL faults that come and go keeps every
acknowledged append, byte-identical and exactly once, and makes progress again once the faults
stop without being reopened (the kit's `FaultyStorageStateMachine`)."""

from __future__ import annotations

from hypothesis import settings

from s3stream.testing.storage import FaultyStorageStateMachine

TestFaultModel = FaultyStorageStateMachine.TestCase
TestFaultModel.settings = settings(max_examples=25, stateful_step_count=30, deadline=None)
