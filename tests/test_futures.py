"""The cheap completed futures behave like real ones."""

from concurrent.futures import wait

from s3stream._futures import CompletedFutures


def test_completed_future_behaves_like_a_future() -> None:
    f = CompletedFutures().result(42)
    assert f.done() and not f.running() and not f.cancelled()
    assert f.result(timeout=0) == 42
    assert f.exception(timeout=0) is None
    seen: list[int] = []
    f.add_done_callback(lambda g: seen.append(g.result()))
    assert seen == [42]
    assert not f.cancel()
    done, pending = wait([f], timeout=0)
    assert done == {f} and not pending
