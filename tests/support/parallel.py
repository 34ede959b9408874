"""Independent episodes (or CLI runs) of one test or module, run side by side.

Each worker thread gets its own share of the items (round robin) and makes its own env for it
(its own proxy and runner; its own engine wrapper where the test records calls), so whatever a
test asserts per item holds as it did one after the other. Why it pays on two cores: a CLI
episode spends its time in other processes (the CLI, the grader's pytest) and in waits, so two
or three at once take about half the wall time of the same episodes in a row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from typing import Any, TypeVar

from harness_gym.sandbox import SandboxSpec
from harness_gym.sandbox.local import LocalSandbox, LocalSandboxBackend

T = TypeVar("T")
R = TypeVar("R")


def in_threads(work: Callable[[list[T]], list[R]], items: Sequence[T], workers: int) -> list[R]:
    """`work(share)` on `workers` round-robin shares of `items`, each share in its own thread;
    one result per item, in the items' order. The first share to raise raises here (after
    every share has ended: no thread is left running)."""
    workers = max(1, min(workers, len(items)))
    shares = [list(items[i::workers]) for i in range(workers)]
    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(work, share) for share in shares]
    results: list[R | None] = [None] * len(items)
    for i, (share, future) in enumerate(zip(shares, futures)):
        answers = future.result()
        if len(answers) != len(share):
            raise ValueError(f"work returned {len(answers)} results for {len(share)} items")
        results[i::workers] = answers
    return results  # type: ignore[return-value]


def each_in_threads(run: Callable[[T], R], items: Sequence[T], workers: int
                    ) -> list[R | Exception]:
    """`run(item)` for each item, `workers` at a time (`in_threads`); an item whose run raised
    gets its exception instead, for its own test to raise: one failure fails only its test."""

    def work(share: list[T]) -> list[R | Exception]:
        done: list[R | Exception] = []
        for item in share:
            try:
                done.append(run(item))
            except Exception as error:  # noqa: BLE001 - raised by that item's test
                done.append(error)
        return done

    return in_threads(work, items, workers)


def result_of(outcome: R | Exception) -> R:
    """An `each_in_threads` item's result, or the error its run raised, raised here."""
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


def selected_params(request: Any, test: Callable[..., Any], name: str) -> list[Any]:
    """The values of parameter `name` of `test`, a test function of the requesting module, in
    the tests selected for this run (after `-k`, `-m`, node ids): what a module fixture that
    runs them all at once should run."""
    return [item.callspec.params[name] for item in request.session.items
            if getattr(item, "originalname", None) == test.__name__
            and getattr(item, "module", None) is request.module]


@contextmanager
def started_together(
    runs: Mapping[str, Callable[[LocalSandbox], R]],
) -> Iterator[dict[str, tuple[LocalSandbox, Future[R]]]]:
    """Each run in a fresh local sandbox of its own, all started at once; yields, once every
    run has ended, name -> (its sandbox, its future: the answer, or the error it raised, for
    the test that looks at it). The sandboxes close on exit."""
    with ExitStack() as stack:
        boxes = {name: stack.enter_context(LocalSandboxBackend().create(SandboxSpec()))
                 for name in runs}
        with ThreadPoolExecutor(max(1, len(runs))) as pool:
            started = {name: (boxes[name], pool.submit(run, boxes[name]))
                       for name, run in runs.items()}
            wait([future for _, future in started.values()])
        yield started
