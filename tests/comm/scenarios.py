"""Drive a whole weight sync between worker processes: open, connect, sync twice, close."""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.comm.workers import RemoteError, Worker, together

CHECKS = "tests.comm.sync_checks"
BUCKET_BYTES = 64 << 10  # the tiny model (1.2 MB) spans about 20 buckets; its MLP weights are split
RECEIVER_SEED = 100


@dataclass
class Run:
    plan: str
    before: list[dict]
    syncs: list[tuple[dict, list]] = field(default_factory=list)  # (trainer export, receivers' results)


def open_sync(
    workers: list[Worker],
    src: str,
    dst: str,
    forced: str = "auto",
    *,
    colocated: bool = False,
    same_node: bool = True,
    verify: bool = False,
    bucket_bytes: int = BUCKET_BYTES,
) -> Run:
    sender, receivers = workers[0], workers[1:]
    opened = sender.call(
        f"{CHECKS}:start_sender", src, dst, forced, colocated, same_node, len(receivers), bucket_bytes, verify
    )
    before = [
        r.call(f"{CHECKS}:start_receiver", opened["endpoint"], rank, dst, RECEIVER_SEED + rank)
        for rank, r in enumerate(receivers, 1)
    ]
    connected = together(
        [(sender, f"{CHECKS}:connect", ("sender",))]
        + [(r, f"{CHECKS}:connect", ("receiver",)) for r in receivers]
    )
    errors = [c for c in connected if isinstance(c, RemoteError)]
    if errors:
        raise errors[0]
    return Run(opened["plan"], before)


def sync(
    workers: list[Worker],
    run: Run,
    seed: int,
    version: int,
    fail_after: int | None = None,
    calls: dict[int, tuple[str, tuple]] | None = None,
) -> tuple:
    """One sync of the trainer model of `seed`; results in place (RemoteError where one failed).

    `fail_after`: the trainer's export fails at that tensor; `calls`: rank -> (function of
    sync_checks, arguments) to run on that rollout end instead of a plain `receive`."""
    sender, receivers = workers[0], workers[1:]
    calls = calls or {}
    results = together(
        [(sender, f"{CHECKS}:send", (seed, version, fail_after))]
        + [
            (r, f"{CHECKS}:{calls.get(rank, ('receive', ()))[0]}", calls.get(rank, ("receive", ()))[1])
            for rank, r in enumerate(receivers, 1)
        ]
    )
    run.syncs.append((results[0], results[1:]))
    return results[0], results[1:]


def close_sync(workers: list[Worker]) -> None:
    together(
        [(workers[0], f"{CHECKS}:close", ("sender",))]
        + [(r, f"{CHECKS}:close", ("receiver",)) for r in workers[1:]]
    )


def run_twice(workers: list[Worker], src: str, dst: str, forced: str = "auto", **placement) -> Run:
    run = open_sync(workers, src, dst, forced, **placement)
    try:
        for version, seed in ((1, 1), (2, 2)):
            sync(workers, run, seed, version)
    finally:
        close_sync(workers)
    return run


def assert_synced(run: Run, dst_device: str) -> None:
    """Every rollout end holds each export exactly (hash), generates what the trainer generates,
    and reports the export's version; the weights changed from the rollout's own."""
    for version, (export, received) in enumerate(run.syncs, 1):
        assert not isinstance(export, RemoteError), export
        assert export["stats"].version == version and export["stats"].buckets > 1
        for before, got in zip(run.before, received, strict=True):
            assert not isinstance(got, RemoteError), got
            assert got["hash"] == export["hash"], f"version {version}: rollout weights differ from the export"
            assert got["generation"] == export["generation"]
            assert got["version"] == version and got["stats"].version == version
            assert got["stats"].tensors == export["stats"].tensors == 27
            assert got["device"] == dst_device
            assert before["hash"] != got["hash"] and before["generation"] != got["generation"]
    first, second = run.syncs[0][0], run.syncs[1][0]
    assert first["hash"] != second["hash"] and first["generation"] != second["generation"]


def sync_mixed_twice(workers: list[Worker], src: str, dst: str, forced: str, same_node: bool) -> list[tuple]:
    """Open a sync with 4 MiB buckets and send `sync_checks.mixed_state` twice; the results of both
    syncs, (trainer export, rollout results), RemoteError in place of a failure."""
    open_sync(workers, src, dst, forced, same_node=same_node, bucket_bytes=4 << 20)
    try:
        results = []
        for version, seed in ((1, 1), (2, 2)):
            export, *received = together(
                [(workers[0], f"{CHECKS}:send_mixed", (seed, version))]
                + [(r, f"{CHECKS}:receive_copies", ()) for r in workers[1:]]
            )
            results.append((export, received))
        return results
    finally:
        close_sync(workers)


def assert_mixed_synced(results: list[tuple], device: str) -> None:
    """Both syncs of the mixed state arrived whole (3 buckets: the 4.7 MiB tensor alone)."""
    for export, received in results:
        assert not isinstance(export, RemoteError), export
        assert (export["stats"].buckets, export["stats"].tensors) == (3, 6)
        for got in received:
            assert not isinstance(got, RemoteError), got
            assert got["hash"] == export["hash"] and got["devices"] == [device]
